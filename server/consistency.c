/* BSP rounds, SSP bounds, ASP pass-through. */
#include "consistency.h"

#include "ps_err.h"
#include "ps_opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int psd_cons_parse(const char *s, struct psd_cons *out)
{
    out->staleness = 0;
    if (strcmp(s, "asp") == 0) {
        out->mode = PSD_ASP;
        return 0;
    }
    if (strcmp(s, "bsp") == 0) {
        out->mode = PSD_BSP;
        return 0;
    }
    uint64_t k = 0;
    if (strncmp(s, "ssp:", 4) == 0 && ps_parse_u64(s + 4, 0, 1000000, &k) == 0) {
        out->mode = PSD_SSP;
        out->staleness = (uint32_t)k;
        return 0;
    }
    return PS_EINVAL;
}

void psd_cons_name(const struct psd_cons *c, char *buf, size_t len)
{
    if (c->mode == PSD_SSP)
        snprintf(buf, len, "ssp:%u", c->staleness);
    else
        snprintf(buf, len, "%s", c->mode == PSD_BSP ? "bsp" : "asp");
}

int psd_cons_table_init(const struct psd_cons *c, struct psd_table *t)
{
    /* bsp applies once per clock; asp/ssp once per worker push */
    t->sched_div = c->mode == PSD_BSP ? 1 : c->workers;
    t->completed = calloc(c->workers, sizeof *t->completed);
    t->pushed = calloc(c->workers, sizeof *t->pushed);
    t->wgrad = calloc(c->workers, sizeof *t->wgrad);
    return t->completed && t->pushed && t->wgrad ? 0 : PS_ENOMEM;
}

void psd_cons_table_fini(const struct psd_cons *c, struct psd_table *t)
{
    for (uint32_t w = 0; t->wgrad != NULL && w < c->workers; w++)
        free(t->wgrad[w]);
    free(t->wgrad);
    free(t->pushed);
    free(t->completed);
    t->wgrad = NULL;
    t->pushed = NULL;
    t->completed = NULL;
}

uint64_t psd_cons_clock(const struct psd_cons *c, const struct psd_table *t)
{
    if (c->mode == PSD_BSP)
        return t->clock;
    uint64_t m = UINT64_MAX;
    for (uint32_t w = 0; w < c->workers; w++)
        m = t->completed[w] < m ? t->completed[w] : m;
    return m;
}

int psd_cons_ready(const struct psd_cons *c, const struct psd_table *t, uint64_t clock)
{
    switch (c->mode) {
    case PSD_BSP:
        return t->clock >= clock;
    case PSD_SSP:
        return psd_cons_clock(c, t) + c->staleness >= clock;
    case PSD_ASP:
    default:
        return 1;
    }
}

void psd_cons_missing(const struct psd_cons *c, const struct psd_table *t, uint64_t clock,
                      char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t w = 0; w < c->workers && used + 12 < len; w++) {
        int missing = c->mode == PSD_BSP ? !t->pushed[w] : t->completed[w] + c->staleness < clock;
        if (missing)
            used += (size_t)snprintf(buf + used, len - used, "%s%u", used ? ", " : "", w);
    }
}

/* Averages the round's gradients in worker order and applies them once. */
static void bsp_close_round(const struct psd_cons *c, struct psd_table *t)
{
    size_t n = (size_t)(t->hi - t->lo);
    float *acc = t->wgrad[0];
    for (uint32_t w = 1; w < c->workers; w++)
        for (size_t i = 0; i < n; i++)
            acc[i] += t->wgrad[w][i];
    if (c->workers > 1) {
        float inv = 1.0f / (float)c->workers;
        for (size_t i = 0; i < n; i++)
            acc[i] *= inv;
    }
    psd_table_apply(t, t->lo, n, acc);
    memset(t->pushed, 0, c->workers * sizeof *t->pushed);
    t->npushed = 0;
    t->clock++;
}

static int bsp_push(const struct psd_cons *c, struct psd_table *t, uint32_t w, uint64_t clock,
                    uint64_t offset, uint64_t count, const float *g, int *applied, char *err,
                    size_t errlen)
{
    if (offset != t->lo || count != t->hi - t->lo) {
        snprintf(err, errlen, "bsp: a push must cover shard range [%llu, %llu) of '%s'",
                 (unsigned long long)t->lo, (unsigned long long)t->hi, t->name);
        return PS_EINVAL;
    }
    if (clock != t->clock) {
        snprintf(err, errlen, "bsp: push for clock %llu, but '%s' is at clock %llu",
                 (unsigned long long)clock, t->name, (unsigned long long)t->clock);
        return PS_ESTATE;
    }
    if (t->pushed[w]) {
        snprintf(err, errlen, "bsp: worker %u already pushed clock %llu of '%s'", w,
                 (unsigned long long)clock, t->name);
        return PS_ESTATE;
    }
    t->completed[w] = clock + 1;
    if (c->workers == 1) { /* a round of one: apply straight from the frame */
        psd_table_apply(t, t->lo, (size_t)count, g);
        t->clock++;
        *applied = 1;
        return 0;
    }
    size_t bytes = (size_t)count * sizeof(float);
    if (t->wgrad[w] == NULL && (t->wgrad[w] = malloc(bytes ? bytes : 4)) == NULL) {
        snprintf(err, errlen, "bsp: out of memory for worker %u's gradient", w);
        return PS_ENOMEM;
    }
    memcpy(t->wgrad[w], g, bytes);
    t->pushed[w] = 1;
    t->completed[w] = clock + 1;
    if (++t->npushed == c->workers) {
        bsp_close_round(c, t);
        *applied = 1;
    }
    return 0;
}

int psd_cons_push(const struct psd_cons *c, struct psd_table *t, uint32_t worker, uint64_t clock,
                  uint64_t offset, uint64_t count, const float *g, int *applied, char *err,
                  size_t errlen)
{
    *applied = 0;
    if (worker >= c->workers) {
        if (c->mode != PSD_ASP) {
            snprintf(err, errlen, "worker id %u is not in [0, %u) (psd --workers %u)", worker,
                     c->workers, c->workers);
            return PS_EINVAL;
        }
    } else if (c->mode == PSD_BSP) {
        return bsp_push(c, t, worker, clock, offset, count, g, applied, err, errlen);
    } else if (clock + 1 > t->completed[worker]) {
        t->completed[worker] = clock + 1;
    }
    psd_table_apply(t, offset, count, g);
    *applied = 1;
    return 0;
}
