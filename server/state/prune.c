/* Pruning schedule, magnitude selection, and mask enforcement. */
#include "prune.h"

#include "ps_err.h"
#include "ps_opts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int psd_prune_parse(const char *s, struct psd_prune_spec *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->start = PSD_PRUNE_START;
    out->end = PSD_PRUNE_END;
    out->every = PSD_PRUNE_EVERY;
    const char *colon = strchr(s, ':');
    size_t nlen = colon ? (size_t)(colon - s) : 0;
    if (colon == NULL || nlen == 0 || nlen >= sizeof out->table) {
        snprintf(err, errlen, "--prune: '%s' is not TABLE:TARGET[:START:END:EVERY]", s);
        return PS_EINVAL;
    }
    memcpy(out->table, s, nlen);
    char rest[128];
    if (strlen(colon + 1) >= sizeof rest) {
        snprintf(err, errlen, "--prune: '%s' is too long", s);
        return PS_EINVAL;
    }
    strcpy(rest, colon + 1);
    char *parts[4] = {0};
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(rest, ":", &save); tok && n < 4;
         tok = strtok_r(NULL, ":", &save))
        parts[n++] = tok;
    if (n != 1 && n != 4) {
        snprintf(err, errlen, "--prune %s: give TARGET, or TARGET:START:END:EVERY", s);
        return PS_EINVAL;
    }
    if (ps_parse_f64(parts[0], 0.0, 0.9999, &out->target) != 0) {
        snprintf(err, errlen, "--prune %s: target '%s' is not a sparsity in [0, 0.9999]", s,
                 parts[0]);
        return PS_EINVAL;
    }
    if (n == 4 && (ps_parse_u64(parts[1], 0, UINT64_C(1) << 40, &out->start) != 0 ||
                   ps_parse_u64(parts[2], 1, UINT64_C(1) << 40, &out->end) != 0 ||
                   ps_parse_u64(parts[3], 1, UINT64_C(1) << 40, &out->every) != 0 ||
                   out->start >= out->end)) {
        snprintf(err, errlen, "--prune %s: need whole numbers START < END and EVERY >= 1", s);
        return PS_EINVAL;
    }
    return 0;
}

double psd_prune_sparsity_at(const struct psd_prune_spec *p, uint64_t t)
{
    if (t <= p->start)
        return 0.0;
    if (t >= p->end)
        return p->target;
    double x = 1.0 - (double)(t - p->start) / (double)(p->end - p->start);
    return p->target * (1.0 - x * x * x);
}

int psd_prune_due(const struct psd_prune_spec *p, uint64_t t)
{
    return t == p->end || (t >= p->start && t < p->end && (t - p->start) % p->every == 0);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

uint64_t psd_prune_apply_mask(float *w, float *s1, float *s2, uint8_t *mask, size_t n,
                              double sparsity, float *scratch)
{
    size_t want = (size_t)ceil(sparsity * (double)n - 1e-9); /* a target is a minimum */
    size_t pruned = 0;
    for (size_t i = 0; i < n; i++)
        pruned += mask[i];
    if (want <= pruned)
        return pruned; /* masks only grow */
    /* The threshold is the want-th smallest magnitude (pruned ones are 0). */
    for (size_t i = 0; i < n; i++)
        scratch[i] = mask[i] ? 0.0f : fabsf(w[i]);
    qsort(scratch, n, sizeof *scratch, cmp_float);
    float thr = scratch[want - 1];
    /* Below the threshold first, then ties at it, until `want` is reached. */
    for (int pass = 0; pass < 2 && pruned < want; pass++) {
        for (size_t i = 0; i < n && pruned < want; i++) {
            float m = fabsf(w[i]);
            if (!mask[i] && (pass == 0 ? m < thr : m == thr)) {
                mask[i] = 1;
                pruned++;
            }
        }
    }
    psd_prune_enforce(w, s1, s2, mask, n);
    return pruned;
}

void psd_prune_enforce(float *w, float *s1, float *s2, const uint8_t *mask, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (mask[i]) {
            w[i] = 0.0f;
            if (s1 != NULL)
                s1[i] = 0.0f;
            if (s2 != NULL)
                s2[i] = 0.0f;
        }
    }
}
