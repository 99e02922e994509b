/* psd's counters and gauges in Prometheus text format (served by
 * ps_metrics on --metrics-listen). */
#ifndef PSD_METRICS_H
#define PSD_METRICS_H

#include "psd.h"

#include "ps_metrics.h"

/* Appends the whole exposition to b. 0, or PS_ENOMEM. */
int psd_metrics_render(const struct psd *s, struct ps_buf *b);

#endif
