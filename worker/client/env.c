/* Endpoint patterns and indices from the environment, for bindings
 * (psclient.h): the same code as psworker's --servers and --rank auto. */
#include "client_impl.h"

#include "ps_auto.h"
#include "ps_hostlist.h"
#include "ps_limits.h"

int psc_servers_parse(const char *list, char *buf, size_t len, const char **eps, size_t max,
                      size_t *n, char *err, size_t errlen)
{
    return ps_hostlist_expand("servers", list, buf, len, eps, max, n, err, errlen);
}

int psc_auto_rank(uint64_t *rank, char *err, size_t errlen)
{
    return ps_auto_rank("rank", 0, PS_WORKERS_MAX - 1, rank, err, errlen);
}

int psc_auto_workers(uint64_t *workers, char *err, size_t errlen)
{
    return ps_auto_workers("workers", 1, PS_WORKERS_MAX, workers, err, errlen);
}
