/* Prometheus' text exposition format: a growing text buffer, families,
 * samples and escaped labels, and a latency histogram. Pure text: what
 * serves it over HTTP is ps_metrics.h's, so a program that only counts
 * (psctl, through the tables) links no HTTP server. */
#ifndef PS_PROM_H
#define PS_PROM_H

#include <stddef.h>
#include <stdint.h>

/* A growing text buffer; after an allocation failure `oom` is set and
 * further appends do nothing. */
struct ps_buf {
    char *p;
    size_t len, cap;
    int oom;
};

void ps_buf_printf(struct ps_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ps_buf_free(struct ps_buf *b);

/* Text exposition format 0.0.4. A family line pair (# HELP, # TYPE) comes
 * once before its samples. labels is NULL or a ready label set such as
 * `op="pull",status="ok"` (build values with ps_prom_label). */
void ps_prom_family(struct ps_buf *b, const char *name, const char *type, const char *help);
void ps_prom_sample(struct ps_buf *b, const char *name, const char *labels, double v);
/* family + one unlabelled sample */
void ps_prom_metric(struct ps_buf *b, const char *name, const char *type, const char *help,
                    double v);
/* Appends key="value" to out (after a comma when out is not empty), with
 * the value escaped as the format asks (\\, \", \n); values come from
 * peers (table names), so this is the only way they get into the text. */
void ps_prom_label(char *out, size_t len, const char *key, const char *value);

/* Latency histogram, seconds, fixed buckets from 1 us to 1 s. */
#define PS_HIST_BUCKETS 13
struct ps_hist {
    uint64_t counts[PS_HIST_BUCKETS]; /* per bucket, not cumulative */
    uint64_t count;
    double sum;
};
void ps_hist_observe(struct ps_hist *h, double seconds);
/* The _bucket (cumulative, with le="+Inf"), _sum and _count samples. */
void ps_prom_hist(struct ps_buf *b, const char *name, const char *labels, const struct ps_hist *h);

#endif
