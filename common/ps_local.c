/* Same-host endpoints: naming, and finding them in /proc/net/unix. */
#include "ps_local.h"

#include "ps_shard.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* sun_path holds 108 bytes; an abstract name uses them all but the first */
#define NAME_MAX_BYTES 100u

int ps_local_endpoint(const char *bound, char *out, size_t len)
{
    if (strncmp(bound, "tcp://", 6) != 0)
        return -1;
    const char *name = bound + 6;
    size_t n = strlen(name);
    if (n == 0 || n + strlen("psd/") > NAME_MAX_BYTES)
        return -1;
    int w = snprintf(out, len, "%s%s", PS_LOCAL_PREFIX, name);
    return w > 0 && (size_t)w < len ? 0 : -1;
}

static int well_formed(const char *endpoint)
{
    size_t plen = strlen(PS_LOCAL_PREFIX);
    if (strncmp(endpoint, PS_LOCAL_PREFIX, plen) != 0)
        return 0;
    size_t n = 0;
    for (const char *p = endpoint + strlen("ipc://@"); *p != '\0'; p++, n++)
        if (*p <= ' ' || *p > '~' || n > NAME_MAX_BYTES)
            return 0;
    return n > strlen("psd/");
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
