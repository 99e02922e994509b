/* Connecting psworker to its shards: the client library's client from
 * the flags (endpoints, CURVE keys, the wire's dtype, timing), and the
 * region it shares with shards on this host, where the gradients and two
 * sets of weights then lie. */
#include "connect.h"

#include "topk.h"
#include "model.h"

#include "ps_curve.h"
#include "ps_err.h"
#include "ps_limits.h"
#include "ps_opts.h"

#include <stdio.h>
#include <string.h>

int psw_wire_dtype(const char *s)
{
    return strcmp(s, "f32") == 0    ? PSC_F32
           : strcmp(s, "f16") == 0  ? PSC_F16
           : strcmp(s, "bf16") == 0 ? PSC_BF16
                                    : -1;
}

/* Buffers of a table's size in the shared region: its gradient and two
 * sets of its weights (psw_use_region). */
#define SHM_BUFFERS 3
/* Bytes the region has beyond its buffers and their alignment: a page. */
#define SHM_SPARE_BYTES 4096u

/* The region to share with shards on this host (CPU backend; 0: none):
 * those buffers, and with --topk each table's keys and values. */
static size_t shm_bytes(const struct trainer *tr)
{
    /* with 16-bit values on the wire too: the shards that take the region
     * take f32 through it (libpsclient's dtype per shard) */
    if (!tr->alias || tr->cfg.no_shm)
        return 0;
    size_t b = SHM_SPARE_BYTES;
    for (int k = 0; k < psw_ntables(tr); k++) {
        size_t n = (size_t)psw_table_size(tr, k);
        b += SHM_BUFFERS * (n * 4 + PS_SHM_ALIGN);
        if (tr->cfg.topk > 0) /* its keys and its values */
            b +=
                psw_topk_count(&tr->cfg, n) * (sizeof(uint64_t) + sizeof(float)) + 2 * PS_SHM_ALIGN;
    }
    return b;
}

/* psc_config's hello_waiting: which shards have not answered yet. */
static void log_hello_waiting(void *arg, const uint32_t *shards, uint32_t n, int waited_ms,
                              const char *why)
{
    struct trainer *tr = arg;
    char list[1024];
    size_t used = 0;
    for (uint32_t i = 0; i < n && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%u (%s)", i ? ", " : "",
                                 shards[i], tr->eps[shards[i]]);
    PS_LOG(&tr->log, PS_LOG_WARN, W0014,
           "waited %d ms for %u of %u shard(s) to answer: %s (giving up after --timeout-ms "
           "%llu)%s%s",
           waited_ms, n, tr->neps, list, (unsigned long long)tr->cfg.timeout_ms, why ? ": " : "",
           why ? why : "");
}

/* Connects the client to --servers (hello to every shard). */
int psw_connect_client(struct trainer *tr, int nonzero_pulls, char *err, size_t errlen)
{
    const struct config *c = &tr->cfg;
    char buf[8192];
    const char *eps[PS_SHARDS_MAX];
    size_t n = 0;
    int rc = ps_split_servers(c->servers, buf, sizeof buf, eps, &n, err, errlen);
    if (rc != 0)
        return rc;
    struct psc_config pc = {.struct_size = sizeof pc,
                            .servers = eps,
                            .nservers = n,
                            .worker_id = (uint32_t)c->rank,
                            .connect_timeout_ms = (int)c->timeout_ms,
                            .wire_dtype = psw_wire_dtype(c->wire_dtype),
                            .nonzero_pulls = nonzero_pulls,
                            .retry_ms = (int)c->retry_ms,
                            .heartbeat_ms = c->heartbeat_ms ? (int)c->heartbeat_ms : -1,
                            .local_ipc = !c->no_local_ipc,
                            .shm_bytes = shm_bytes(tr),
                            .io_cpus = tr->io_cpus.cpu,
                            .nio_cpus = tr->io_cpus.n,
                            .hello_waiting = log_hello_waiting,
                            .hello_waiting_arg = tr};
    tr->eps = eps;
    tr->neps = (uint32_t)n;
    struct ps_curve_keys mine, server;
    if ((rc = ps_curve_client(c->curve_secret, c->curve_server_key, &mine, &server, err, errlen)) !=
        0)
        return rc;
    if (mine.pub[0] != '\0') {
        pc.curve_server_key = server.pub;
        pc.curve_public = mine.pub;
        pc.curve_secret = mine.sec;
    }
    rc = psc_create(&pc, &tr->c, err, errlen);
    tr->eps = NULL; /* eps is this function's */
    if (rc != 0)
        return rc;
    for (uint32_t s = 0; s < n; s++)
        if (strcmp(psc_endpoint(tr->c, s), eps[s]) != 0)
            PS_LOG(&tr->log, PS_LOG_INFO, W0006, "shard %u (%s) is on this host: using %s", s,
                   eps[s], psc_endpoint(tr->c, s));
    return 0;
}
