/* What a run reports beside its log: this worker's metrics in Prometheus
 * text, published to --metrics-listen's HTTP thread (throttled unless
 * forced). */
#ifndef PSW_REPORT_H
#define PSW_REPORT_H

#include "trainer.h"

#include <stddef.h>
#include <stdint.h>

void psw_worker_metrics(struct trainer *tr, int force);

#endif
