/* CPU lists and pinning (ps_cpus.h). */
#define _GNU_SOURCE
#include "ps_cpus.h"

#include "ps_err.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void format_mask(const unsigned char *on, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int a = 0; a < PS_CPUS_MAX; a++) {
        if (!on[a])
            continue;
        int b = a;
        while (b + 1 < PS_CPUS_MAX && on[b + 1])
            b++;
        int w = b > a ? snprintf(buf + used, len - used, "%s%d-%d", used ? "," : "", a, b)
                      : snprintf(buf + used, len - used, "%s%d", used ? "," : "", a);
        if (w < 0 || (size_t)w >= len - used) {
            buf[used] = '\0'; /* the items that fit whole */
            return;
        }
        used += (size_t)w;
        a = b;
    }
}

/* The CPUs this process may run on, as on[] flags. */
static void allowed(unsigned char *on)
{
    cpu_set_t set;
    memset(on, 0, PS_CPUS_MAX);
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return;
    for (int i = 0; i < PS_CPUS_MAX && i < CPU_SETSIZE; i++)
        on[i] = CPU_ISSET(i, &set) ? 1 : 0;
}

/* One decimal CPU number at *p, advancing p; -1 when there is none or it
 * is PS_CPUS_MAX or more. */
static int cpu_number(const char **p)
{
    const char *s = *p;
    long v = 0;
    if (!isdigit((unsigned char)*s))
        return -1;
    while (isdigit((unsigned char)*s)) {
        v = v * 10 + (*s++ - '0');
        if (v >= PS_CPUS_MAX)
            return -1;
    }
    *p = s;
    return (int)v;
}

int ps_cpus_parse(const char *flag, const char *s, struct ps_cpus *out, char *err, size_t errlen)
{
    unsigned char ok[PS_CPUS_MAX], want[PS_CPUS_MAX];
    char may[256];
    allowed(ok);
    format_mask(ok, may, sizeof may);
    memset(want, 0, sizeof want);
    out->n = 0;
    const char *p = s;
    do {
        const char *item = p;
        int a = cpu_number(&p), b = a;
        if (a >= 0 && *p == '-') {
            p++;
            b = cpu_number(&p);
        }
        if (a < 0 || b < a || (*p != ',' && *p != '\0')) {
            size_t len = strcspn(item, ",");
            snprintf(err, errlen,
                     "%s: '%.*s' in '%s' is not a CPU number or range A-B (A <= B < %d); "
                     "this process may run on %s",
                     flag, (int)(len > 32 ? 32 : len), item, s, PS_CPUS_MAX, may);
            return PS_EINVAL;
        }
        for (int i = a; i <= b; i++) {
            if (!ok[i]) {
                snprintf(err, errlen, "%s: CPU %d is not one this process may run on (%s)", flag, i,
                         may);
                return PS_EINVAL;
            }
            want[i] = 1;
        }
    } while (*p++ == ',');
    for (int i = 0; i < PS_CPUS_MAX; i++)
        if (want[i])
            out->cpu[out->n++] = i;
    return 0;
}

void ps_cpus_format(const struct ps_cpus *c, char *buf, size_t len)
{
    unsigned char on[PS_CPUS_MAX];
    memset(on, 0, sizeof on);
    for (int i = 0; i < c->n; i++)
        on[c->cpu[i]] = 1;
    format_mask(on, buf, len);
}

int ps_cpus_pin_process(const struct ps_cpus *c, char *err, size_t errlen)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < c->n; i++)
        CPU_SET(c->cpu[i], &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        snprintf(err, errlen, "cannot pin to CPUs: %s", strerror(errno));
        return PS_EINVAL;
    }
    /* the threads libraries started before main (OpenBLAS's) */
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        char *end;
        long tid = strtol(e->d_name, &end, 10);
        if (e->d_name[0] == '.' || *end != '\0' || tid <= 0)
            continue;
        if (sched_setaffinity((pid_t)tid, sizeof set, &set) != 0 && errno != ESRCH) {
            snprintf(err, errlen, "cannot pin thread %ld to CPUs: %s", tid, strerror(errno));
            closedir(d);
            return PS_EINVAL;
        }
    }
    if (d != NULL)
        closedir(d);
    return 0;
}

void ps_cpus_allowed_list(struct ps_cpus *out)
{
    unsigned char on[PS_CPUS_MAX];
    allowed(on);
    out->n = 0;
    for (int i = 0; i < PS_CPUS_MAX; i++)
        if (on[i])
            out->cpu[out->n++] = i;
}

int ps_cpus_allowed(void)
{
    cpu_set_t set;
    return sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : 1;
}
