/* Prometheus' text exposition format (ps_prom.h). */
#include "ps_prom.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ps_buf_printf(struct ps_buf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        size_t room = b->cap - b->len;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p != NULL ? b->p + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap - b->len <= (size_t)n)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (p == NULL) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

void ps_buf_free(struct ps_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

void ps_prom_family(struct ps_buf *b, const char *name, const char *type, const char *help)
{
    ps_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void ps_prom_sample(struct ps_buf *b, const char *name, const char *labels, double v)
{
    /* %.17g keeps counters exact up to 2^53; the format spells the
     * non-finite values as below */
    char num[40];
    if (v != v)
        snprintf(num, sizeof num, "NaN");
    else if (v > 1.7976931348623157e308)
        snprintf(num, sizeof num, "+Inf");
    else if (v < -1.7976931348623157e308)
        snprintf(num, sizeof num, "-Inf");
    else
        snprintf(num, sizeof num, "%.17g", v);
    if (labels != NULL && labels[0] != '\0')
        ps_buf_printf(b, "%s{%s} %s\n", name, labels, num);
    else
        ps_buf_printf(b, "%s %s\n", name, num);
}

void ps_prom_metric(struct ps_buf *b, const char *name, const char *type, const char *help,
                    double v)
{
    ps_prom_family(b, name, type, help);
    ps_prom_sample(b, name, NULL, v);
}

void ps_prom_label(char *out, size_t len, const char *key, const char *value)
{
    size_t n = strlen(out);
    int w = snprintf(out + n, len > n ? len - n : 0, "%s%s=\"", n ? "," : "", key);
    if (w < 0 || (size_t)w >= len - n) {
        out[n] = '\0';
        return;
    }
    n += (size_t)w;
    for (const char *c = value; *c != '\0'; c++) {
        const char *esc = *c == '\\' ? "\\\\" : *c == '"' ? "\\\"" : *c == '\n' ? "\\n" : NULL;
        size_t need = esc ? 2 : 1;
        if (n + need + 2 > len) /* room for this, the quote and the NUL */
            break;
        if (esc) {
            memcpy(out + n, esc, 2);
        } else {
            out[n] = *c;
        }
        n += need;
    }
    out[n++] = '"';
    out[n] = '\0';
}

static const double hist_le[PS_HIST_BUCKETS] = {1e-6,   2.5e-6, 1e-5,   2.5e-5, 1e-4, 2.5e-4, 1e-3,
                                                2.5e-3, 1e-2,   2.5e-2, 0.1,    0.25, 1.0};

void ps_hist_observe(struct ps_hist *h, double seconds)
{
    int i = 0;
    while (i < PS_HIST_BUCKETS && seconds > hist_le[i])
        i++;
    if (i < PS_HIST_BUCKETS)
        h->counts[i]++;
    h->count++;
    h->sum += seconds;
}

void ps_prom_hist(struct ps_buf *b, const char *name, const char *labels, const struct ps_hist *h)
{
    char series[256], lab[512];
    snprintf(series, sizeof series, "%s_bucket", name);
    uint64_t cum = 0;
    for (int i = 0; i <= PS_HIST_BUCKETS; i++) {
        char le[32];
        if (i < PS_HIST_BUCKETS) {
            cum += h->counts[i];
            snprintf(le, sizeof le, "%g", hist_le[i]);
        } else {
            cum = h->count;
            snprintf(le, sizeof le, "+Inf");
        }
        snprintf(lab, sizeof lab, "%s", labels != NULL ? labels : "");
        ps_prom_label(lab, sizeof lab, "le", le);
        ps_prom_sample(b, series, lab, (double)cum);
    }
    snprintf(series, sizeof series, "%s_sum", name);
    ps_prom_sample(b, series, labels, h->sum);
    snprintf(series, sizeof series, "%s_count", name);
    ps_prom_sample(b, series, labels, (double)h->count);
}
