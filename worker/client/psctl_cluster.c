/* psctl's connection to the shards (psctl_impl.h). */
#include "psctl_impl.h"

#include "ps_clock.h"
#include "ps_curve.h"
#include "ps_opts.h"

#include <stdio.h>

int psc__ctl_connect(const struct config *cfg, struct cluster *k)
{
    char err[512];
    int rc = ps_split_servers(cfg->servers, k->buf, sizeof k->buf, k->eps, &k->n, err, sizeof err);
    struct ps_curve_keys mine, server;
    if (rc == 0)
        rc = ps_curve_client(cfg->curve_secret, cfg->curve_server_key, &mine, &server, err,
                             sizeof err);
    if (rc != 0) {
        fprintf(stderr, "psctl: %s\n", err);
        return 2;
    }
    k->timeout_ms = (int)cfg->timeout_ms;
    k->hello_ms = k->timeout_ms - k->timeout_ms / 4;
    k->deadline_ms = (uint64_t)ps_mono_ms() + (uint64_t)k->timeout_ms;
    struct psc_config pc = {.struct_size = sizeof pc,
                            .servers = k->eps,
                            .nservers = k->n,
                            .worker_id = PSC_OBSERVER,
                            .connect_timeout_ms = k->hello_ms,
                            .hello_optional = 1,
                            .heartbeat_ms = -1};
    if (mine.pub[0] != '\0') {
        pc.curve_server_key = server.pub;
        pc.curve_public = mine.pub;
        pc.curve_secret = mine.sec;
    }
    if (psc_create(&pc, &k->c, err, sizeof err) != 0) {
        fprintf(stderr, "psctl: %s\n", err);
        return 1;
    }
    return 0;
}
