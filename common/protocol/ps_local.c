/* Same-host endpoints: naming, and finding them in /proc/net/unix. */
#include "ps_local.h"

#include "ps_limits.h"

#include "ps_err.h"
#include "ps_shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* PS_LOCAL_PREFIX, then a name of printable characters, "psd/" and at
 * least one more, PS_LOCAL_NAME_MAX in all at most: the one rule for names
 * made and names offered. */
static int well_formed(const char *endpoint)
{
    if (strncmp(endpoint, PS_LOCAL_PREFIX, strlen(PS_LOCAL_PREFIX)) != 0)
        return 0;
    size_t n = 0;
    for (const char *p = endpoint + strlen("ipc://@"); *p != '\0'; p++, n++)
        if (*p <= ' ' || *p > '~')
            return 0;
    return n > strlen("psd/") && n <= PS_LOCAL_NAME_MAX;
}

int ps_local_endpoint(const char *bound, char *out, size_t len)
{
    if (strncmp(bound, "tcp://", 6) != 0)
        return -1;
    int w = snprintf(out, len, "%s%s", PS_LOCAL_PREFIX, bound + 6);
    return w > 0 && (size_t)w < len && well_formed(out) ? 0 : -1;
}

int ps_local_reachable(const char *endpoint)
{
    if (!well_formed(endpoint))
        return 0;
    const char *want = endpoint + strlen("ipc://"); /* "@psd/..." as /proc shows it */
    FILE *f = fopen("/proc/net/unix", "r");
    if (f == NULL)
        return 0;
    /* Num RefCount Protocol Flags Type St Inode [Path]; a listening socket
     * has __SO_ACCEPTCON (1 << 16) in Flags */
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        unsigned long flags = 0;
        char path[256];
        if (sscanf(line, "%*s %*s %*s %lx %*s %*s %*s %255s", &flags, path) == 2)
            found = (flags & (1ul << 16)) != 0 && strcmp(path, want) == 0;
    }
    fclose(f);
    return found;
}

uint64_t ps_random_id(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = ps_mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid());
    }
    return v ? v : 1;
}

int ps_endpoints_check(const char *entry, char *err, size_t errlen)
{
    char one[PS_ENDPOINT_MAX];
    unsigned n = 0;
    for (const char *p = entry;; n++) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (n == PS_REPLICAS_MAX) {
            snprintf(err, errlen, "'%s': more than %u replicas of one shard", entry,
                     PS_REPLICAS_MAX);
            return PS_EINVAL;
        }
        if (len == 0 || len >= sizeof one) {
            snprintf(err, errlen, "'%s': %s", entry,
                     len ? "an endpoint is too long" : "an empty endpoint around '|'");
            return PS_EINVAL;
        }
        memcpy(one, p, len);
        one[len] = '\0';
        if (ps_endpoint_check(one, 0, err, errlen) != 0)
            return PS_EINVAL;
        if (bar == NULL)
            return 0;
        p = bar + 1;
    }
}

int ps_endpoint_check(const char *ep, int bind, char *err, size_t errlen)
{
    static const char tcp[] = "tcp://";
    if (strncmp(ep, tcp, sizeof tcp - 1) != 0)
        return 0; /* ipc://, inproc://: ZeroMQ checks them */
    const char *host = ep + sizeof tcp - 1, *colon = strrchr(host, ':');
    if (colon == NULL || colon == host) {
        snprintf(err, errlen, "'%s': a tcp endpoint is tcp://HOST:PORT", ep);
        return PS_EINVAL;
    }
    const char *port = colon + 1;
    if (bind && strcmp(port, "*") == 0)
        return 0;
    size_t digits = strspn(port, "0123456789");
    unsigned long v =
        digits > 0 && digits <= 5 && port[digits] == '\0' ? strtoul(port, NULL, 10) : 70000ul;
    if (v > 65535 || (!bind && v == 0)) {
        snprintf(err, errlen, "'%s': port '%s' is not a number in %d..65535%s", ep, port,
                 bind ? 0 : 1, bind ? " (0 or *: any free port)" : "");
        return PS_EINVAL;
    }
    return 0;
}
