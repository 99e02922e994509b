/* What psctl's files share (psctl.c: the options and the commands that
 * talk to every shard at once; psctl_cluster.c: the connection;
 * psctl_recover.c, psctl_reshard.c: those commands). */
#ifndef PSCTL_IMPL_H
#define PSCTL_IMPL_H

#include "psclient.h"

#include "ps_limits.h"

#include <stddef.h>
#include <stdint.h>

struct config {
    const char *servers;
    uint64_t timeout_ms;
    int json;
    const char *format;
    const char *curve_secret, *curve_server_key;
    const char *from, *to;
    uint64_t shards;
    const char *since;
    int help;
};

/* A client of the shards --servers lists. */
struct cluster {
    struct psc_client *c;
    const char *eps[PS_SHARDS_MAX];
    size_t n;
    char buf[8192];
    int timeout_ms;
    int hello_ms;         /* what the hellos were given: 3/4 of timeout_ms */
    uint64_t deadline_ms; /* status: timeout_ms after the start */
};

/* Connects k to cfg's --servers (CURVE when its keys are given), as an
 * observer: a shard that does not answer its hello is named later. 0, or
 * an exit status with the reason on stderr. */
int psc__ctl_connect(const struct config *cfg, struct cluster *k);
/* psctl recover, psctl reshard: their exit status. */
int psc__ctl_recover(const struct config *cfg);
int psc__ctl_reshard(const struct config *cfg);

#endif
