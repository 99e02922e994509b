/* --servers lists with hostlist ranges (ps_hostlist.h). */
#include "ps_hostlist.h"

#include "ps_err.h"
#include "ps_limits.h"
#include "ps_local.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A range item's bound: digits only, at most 9; its value, and its width
 * when width is not NULL. */
static int bound(const char *s, size_t len, unsigned long *v, int *width)
{
    if (len == 0 || len > 9)
        return -1;
    *v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        *v = *v * 10 + (unsigned long)(s[i] - '0');
    }
    if (width != NULL)
        *width = (int)len;
    return 0;
}

struct out {
    char *buf;
    size_t len, used;
    const char **eps;
    size_t max, *n;
    const char *flag;
    char *err;
    size_t errlen;
};

static int emit(struct out *o, const char *ep, size_t eplen)
{
    if (*o->n >= o->max)
        return ps_errf(PS_EINVAL, o->err, o->errlen, "%s: more than %zu endpoints", o->flag,
                       o->max);
    if (eplen >= PS_ENDPOINT_MAX || o->used + eplen + 1 > o->len)
        return ps_errf(PS_EINVAL, o->err, o->errlen, "%s: the endpoints take more than %zu bytes",
                       o->flag, o->len);
    char *dst = o->buf + o->used;
    memcpy(dst, ep, eplen);
    dst[eplen] = '\0';
    o->used += eplen + 1;
    char why[PS_ENDPOINT_MAX + 96];
    if (ps_endpoints_check(dst, why, sizeof why) != 0)
        return ps_errf(PS_EINVAL, o->err, o->errlen, "%s: %s", o->flag, why);
    o->eps[(*o->n)++] = dst;
    return 0;
}

/* One item of the list (tok, len bytes): expanded when it has brackets. */
static int item(struct out *o, const char *tok, size_t len)
{
    const char *open = memchr(tok, '[', len), *close = memchr(tok, ']', len);
    if (open == NULL && close == NULL)
        return emit(o, tok, len);
    const char *end = tok + len;
    if (open == NULL || close == NULL || close < open ||
        memchr(close + 1, '[', (size_t)(end - close - 1)) != NULL ||
        memchr(close + 1, ']', (size_t)(end - close - 1)) != NULL)
        return ps_errf(PS_EINVAL, o->err, o->errlen,
                       "%s: '%.*s' needs one [range] group, such as psd-[0-3]", o->flag, (int)len,
                       tok);
    size_t pre = (size_t)(open - tok), post = (size_t)(end - close - 1);
    unsigned long last = 0;
    int any = 0;
    for (const char *p = open + 1; p < close;) {
        const char *comma = memchr(p, ',', (size_t)(close - p));
        const char *stop = comma ? comma : close, *dash = memchr(p, '-', (size_t)(stop - p));
        unsigned long a, z;
        int wa;
        if (dash ? bound(p, (size_t)(dash - p), &a, &wa) ||
                       bound(dash + 1, (size_t)(stop - dash - 1), &z, NULL)
                 : bound(p, (size_t)(stop - p), &a, &wa) || (z = a, 0))
            return ps_errf(PS_EINVAL, o->err, o->errlen,
                           "%s: '%.*s' in '%.*s' is not N or N-M (digits)", o->flag,
                           (int)(stop - p), p, (int)len, tok);
        if (z < a || (any && a <= last))
            return ps_errf(PS_EINVAL, o->err, o->errlen,
                           "%s: the numbers in '%.*s' must ascend (shard order)", o->flag, (int)len,
                           tok);
        if (z - a >= PS_SHARDS_MAX)
            return ps_errf(PS_EINVAL, o->err, o->errlen, "%s: '%.*s' names more than %u endpoints",
                           o->flag, (int)len, tok, PS_SHARDS_MAX);
        int width = wa > 1 && p[0] == '0' ? wa : 0; /* zero-padded (01-12): keep the width */
        for (unsigned long v = a; v <= z; v++) {
            char ep[PS_ENDPOINT_MAX + 16];
            int k = snprintf(ep, sizeof ep, "%.*s%0*lu%.*s", (int)pre, tok, width, v, (int)post,
                             close + 1);
            if (k < 0 || (size_t)k >= sizeof ep)
                return ps_errf(PS_EINVAL, o->err, o->errlen,
                               "%s: '%.*s' makes too long an endpoint", o->flag, (int)len, tok);
            int rc = emit(o, ep, (size_t)k);
            if (rc != 0)
                return rc;
        }
        last = z;
        any = 1;
        p = comma ? comma + 1 : close;
        if (comma != NULL && p == close)
            return ps_errf(PS_EINVAL, o->err, o->errlen, "%s: '%.*s' ends its range with a comma",
                           o->flag, (int)len, tok);
    }
    if (!any)
        return ps_errf(PS_EINVAL, o->err, o->errlen, "%s: '%.*s' has an empty range", o->flag,
                       (int)len, tok);
    return 0;
}

/* An item naming a shard's replicas with patterns ("a-[0-1]|b-[0-1]"):
 * each side expands on its own, all to the same count, and entry i joins
 * the i-th endpoint of each with '|'. */
static int replicas_item(struct out *o, const char *tok, size_t len)
{
    enum { SIDE_BYTES = PS_SHARDS_MAX * PS_ENDPOINT_MAX };
    char *mem = malloc(PS_REPLICAS_MAX * SIDE_BYTES + PS_ENDPOINT_MAX);
    const char *(*eps)[PS_SHARDS_MAX] = calloc(PS_REPLICAS_MAX, sizeof *eps);
    size_t n[PS_REPLICAS_MAX] = {0}, k = 0;
    int rc = 0;
    if (mem == NULL || eps == NULL) {
        rc = ps_errf(PS_ENOMEM, o->err, o->errlen, "%s: out of memory", o->flag);
        goto out;
    }
    for (const char *p = tok, *end = tok + len; rc == 0 && p <= end; k++) {
        const char *bar = memchr(p, '|', (size_t)(end - p));
        const char *stop = bar ? bar : end;
        if (k == PS_REPLICAS_MAX) {
            rc = ps_errf(PS_EINVAL, o->err, o->errlen, "%s: '%.*s' names more than %u replicas",
                         o->flag, (int)len, tok, PS_REPLICAS_MAX);
            break;
        }
        struct out side = {mem + k * SIDE_BYTES,
                           SIDE_BYTES,
                           0,
                           eps[k],
                           PS_SHARDS_MAX,
                           &n[k],
                           o->flag,
                           o->err,
                           o->errlen};
        rc = item(&side, p, (size_t)(stop - p));
        if (rc == 0 && k > 0 && n[k] != n[0])
            rc = ps_errf(PS_EINVAL, o->err, o->errlen,
                         "%s: '%.*s': its replicas expand to %zu and %zu endpoints; each side "
                         "names one replica of every shard",
                         o->flag, (int)len, tok, n[0], n[k]);
        p = stop + 1;
    }
    char *one = mem + PS_REPLICAS_MAX * SIDE_BYTES;
    for (size_t i = 0; rc == 0 && i < n[0]; i++) {
        size_t used = 0;
        for (size_t j = 0; j < k && used < PS_ENDPOINT_MAX; j++)
            used += (size_t)snprintf(one + used, PS_ENDPOINT_MAX - used, "%s%s", j ? "|" : "",
                                     eps[j][i]);
        rc = emit(o, one, used < PS_ENDPOINT_MAX ? used : PS_ENDPOINT_MAX);
    }
out:
    free(mem);
    free(eps);
    return rc;
}

int ps_hostlist_expand(const char *flag, const char *list, char *buf, size_t len, const char **eps,
                       size_t max, size_t *n, char *err, size_t errlen)
{
    *n = 0;
    if (list == NULL)
        return ps_errf(PS_EINVAL, err, errlen, "%s is required", flag);
    struct out o = {buf, len, 0, eps, max, n, flag, err, errlen};
    const char *p = list;
    while (*p != '\0') {
        const char *q = p;
        int depth = 0;
        while (*q != '\0' && (*q != ',' || depth > 0)) {
            depth += *q == '[' ? 1 : *q == ']' ? -1 : 0;
            if (depth < 0)
                return ps_errf(PS_EINVAL, err, errlen, "%s: '%s' has a ']' without its '['", flag,
                               list);
            q++;
        }
        if (depth != 0)
            return ps_errf(PS_EINVAL, err, errlen, "%s: '%s' has an unclosed '['", flag, list);
        if (q == p)
            return ps_errf(PS_EINVAL, err, errlen, "%s: '%s' has an empty endpoint", flag, list);
        size_t n1 = (size_t)(q - p);
        int rc = memchr(p, '|', n1) != NULL && memchr(p, '[', n1) != NULL ? replicas_item(&o, p, n1)
                                                                          : item(&o, p, n1);
        if (rc != 0)
            return rc;
        p = *q == ',' ? q + 1 : q;
        if (*q == ',' && *p == '\0')
            return ps_errf(PS_EINVAL, err, errlen, "%s: '%s' ends with a comma", flag, list);
    }
    if (*n == 0)
        return ps_errf(PS_EINVAL, err, errlen, "%s: '%s' names no endpoint", flag, list);
    return 0;
}
