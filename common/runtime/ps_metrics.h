/* Prometheus metrics over HTTP (libmicrohttpd), for psd and psworker.
 *
 * The process's own thread renders its metrics into a text buffer now and
 * then and publishes it; libmicrohttpd's thread serves the newest published
 * text on GET /metrics, and GET /healthz answers 200 while publishing goes
 * on (503 once the publisher has been silent for PS_METRICS_STALE_MS: a
 * stuck loop is unhealthy). GET /readyz answers 200 or 503 as the
 * process last said (ps_metrics_set_ready; ready until it says
 * otherwise), with its reason: a replica without a primary is alive but
 * not ready. The HTTP thread never touches the process's state, only the
 * published copy, under a mutex. */
#ifndef PS_METRICS_H
#define PS_METRICS_H

#include "ps_prom.h"

#include <stddef.h>
#include <stdint.h>

#define PS_METRICS_STALE_MS 10000
#define PS_METRICS_WHY_MAX  256 /* bytes of /readyz's reason */

struct ps_metrics;

/* Listens on ADDR:PORT ("127.0.0.1:9100", "[::1]:0", "0.0.0.0:9100"; port 0
 * picks a free one). 0, or an error code with a message naming what was
 * wrong. */
int ps_metrics_start(struct ps_metrics **out, const char *listen, char *err, size_t errlen);
/* The port bound. */
int ps_metrics_port(const struct ps_metrics *m);
/* Makes b's text the one served (b is emptied for the next render). */
void ps_metrics_publish(struct ps_metrics *m, struct ps_buf *b);
/* What GET /readyz answers from now on: 200 when ready, else 503, with
 * why (cut at PS_METRICS_WHY_MAX). */
void ps_metrics_set_ready(struct ps_metrics *m, int ready, const char *why);
void ps_metrics_stop(struct ps_metrics *m);

#endif
