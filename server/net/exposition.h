/* psd's counters and gauges in Prometheus text format (served by
 * ps_metrics on --metrics-listen). */
#ifndef PSD_EXPOSITION_H
#define PSD_EXPOSITION_H

#include "net.h"
#include "psd.h"

#include "ps_metrics.h"

/* Appends the whole exposition to b. 0, or PS_ENOMEM. */
int psd_expose(const struct psd *s, struct ps_buf *b);
/* Appends the transport's counters (n started; sec NULL when CURVE is
 * off). */
void psd_expose_net(const struct psd_net *n, const struct psd_security *sec, struct ps_buf *b);

#endif
