/* Endpoint lists as --servers takes them, with Slurm's hostlist ranges so
 * that one pattern names every shard of a StatefulSet or a job:
 *
 *   tcp://psd-[0-3].psd:5570       psd-0.psd ... psd-3.psd, in that order
 *   tcp://node[01-02,07]:5570      node01, node02, node07 (widths kept)
 *   tcp://a:5570,tcp://b:5570      plain endpoints, as before
 *   tcp://a:5570|tcp://b:5570      one shard's replicas (at most PS_REPLICAS_MAX)
 *   tcp://psd-[0-1].psd:5570|tcp://psd-[2-3].psd:5570
 *                                  replicas by pattern: each side expands on
 *                                  its own, and shard i gets the i-th of each
 *                                  (psd-0|psd-2, psd-1|psd-3)
 *
 * Commas inside brackets belong to the range; each endpoint has at most one
 * bracket group, its numbers ascending. Neither shells nor URLs use
 * brackets there, so a pattern needs no quoting. Linked into libpsclient
 * (psc_servers_parse) as well as psd, psworker and psctl. */
#ifndef PS_HOSTLIST_H
#define PS_HOSTLIST_H

#include <stddef.h>

/* Expands list into buf (len bytes) as NUL-separated endpoints and points
 * eps[0..*n) at them (at most max). Each is checked by ps_endpoints_check
 * (flag names the option in messages, e.g. "--servers"). 0, or PS_EINVAL
 * with a sentence in err naming what was wrong. */
int ps_hostlist_expand(const char *flag, const char *list, char *buf, size_t len, const char **eps,
                       size_t max, size_t *n, char *err, size_t errlen);

#endif
