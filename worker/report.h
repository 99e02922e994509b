/* What a run reports beside its progress lines: this worker's metrics in
 * Prometheus text, published to --metrics-listen's HTTP thread (at most
 * every PSW_METRICS_EVERY_S unless forced), and a line when a shard's
 * primary changed. Its state (the last step's loss, the last accuracy,
 * the rate) is owned by report.c: opaque outside it. */
#ifndef PSW_REPORT_H
#define PSW_REPORT_H

#include "trainer.h"

#include <stddef.h>
#include <stdint.h>

/* NULL: out of memory. */
struct psw_report *psw_report_create(void);
/* Stops serving and frees it (NULL: nothing). */
void psw_report_destroy(struct psw_report *r);
/* Serves /metrics and /healthz on listen (ADDR:PORT). 0, or an error
 * with err. */
int psw_report_listen(struct trainer *tr, const char *listen, char *err, size_t errlen);
/* The last step's mean loss; the last evaluation's accuracy. */
void psw_report_loss(struct trainer *tr, double loss);
void psw_report_accuracy(struct trainer *tr, double accuracy);
/* Logs (W0240) when the client moved between a shard's replicas since
 * the last look. */
void psw_report_failovers(struct trainer *tr);
/* Publishes the metrics (throttled unless force). */
void psw_worker_metrics(struct trainer *tr, int force);

#endif
