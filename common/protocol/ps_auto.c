/* Indices from the environment (ps_auto.h). */
#include "ps_auto.h"

#include "ps_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int64_t ps_host_ordinal(const char *host)
{
    size_t len = strcspn(host, ".");
    size_t d = len;
    while (d > 0 && host[d - 1] >= '0' && host[d - 1] <= '9')
        d--;
    if (d == len || len - d > 9 || d < 2 || host[d - 1] != '-')
        return -1;
    int64_t v = 0;
    for (size_t i = d; i < len; i++)
        v = v * 10 + (host[i] - '0');
    return v;
}

/* A whole decimal in [min, max], or -1. */
static int whole(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    if (s[0] < '0' || s[0] > '9')
        return -1;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0' || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

/* The first of envs that is set; 1 when none is. */
static int from_env(const char *flag, const char *const *envs, size_t n, uint64_t min, uint64_t max,
                    uint64_t *out, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        const char *v = getenv(envs[i]);
        if (v == NULL)
            continue;
        if (whole(v, min, max, out) != 0)
            return ps_errf(PS_EINVAL, err, errlen,
                           "%s: %s is '%s', not a whole number in [%llu, %llu]", flag, envs[i], v,
                           (unsigned long long)min, (unsigned long long)max);
        return 0;
    }
    return 1;
}

/* "A, B or C" */
static void list(const char *const *envs, size_t n, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s",
                                 i == 0       ? ""
                                 : i + 1 == n ? " or "
                                              : ", ",
                                 envs[i]);
}

static int auto_env(const char *flag, const char *const *envs, size_t n, uint64_t min, uint64_t max,
                    uint64_t *out, char *err, size_t errlen)
{
    int rc = from_env(flag, envs, n, min, max, out, err, errlen);
    if (rc <= 0)
        return rc;
    char names[256];
    list(envs, n, names, sizeof names);
    return ps_errf(PS_EINVAL, err, errlen, "%s: none of %s is set (give the number instead)", flag,
                   names);
}

int ps_auto_rank(const char *flag, uint64_t min, uint64_t max, uint64_t *out, char *err,
                 size_t errlen)
{
    static const char *const envs[] = {"JOB_COMPLETION_INDEX", "RANK", "SLURM_PROCID",
                                       "OMPI_COMM_WORLD_RANK"};
    return auto_env(flag, envs, 4, min, max, out, err, errlen);
}

int ps_auto_workers(const char *flag, uint64_t min, uint64_t max, uint64_t *out, char *err,
                    size_t errlen)
{
    static const char *const envs[] = {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE",
                                       "PSD_WORKERS"};
    return auto_env(flag, envs, 4, min, max, out, err, errlen);
}

int ps_auto_shard(const char *flag, uint64_t min, uint64_t max, uint64_t *out, char *err,
                  size_t errlen)
{
    static const char *const envs[] = {"PSD_SHARD"};
    int rc = from_env(flag, envs, 1, min, max, out, err, errlen);
    if (rc <= 0)
        return rc;
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "(unknown)");
    int64_t o = ps_host_ordinal(host);
    if (o < 0)
        return ps_errf(PS_EINVAL, err, errlen,
                       "%s: PSD_SHARD is not set, and the host name '%s' does not end in -N (as a "
                       "StatefulSet's pods' do)",
                       flag, host);
    if ((uint64_t)o < min || (uint64_t)o > max)
        return ps_errf(PS_EINVAL, err, errlen,
                       "%s: the host name '%s' gives shard %lld, outside [%llu, %llu]", flag, host,
                       (long long)o, (unsigned long long)min, (unsigned long long)max);
    *out = (uint64_t)o;
    return 0;
}
