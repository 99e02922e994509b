/* Dense table storage and the optimizer loops over psk_math.h. */
#include "table.h"

#include "psk_math.h"

#include "ps_err.h"
#include "ps_init.h"
#include "ps_shard.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *psd_optimizer_name(int kind)
{
    switch (kind) {
    case PS__OPTIMIZER_KIND__OPT_SGD:
        return "sgd";
    case PS__OPTIMIZER_KIND__OPT_MOMENTUM:
        return "momentum";
    case PS__OPTIMIZER_KIND__OPT_ADAGRAD:
        return "adagrad";
    case PS__OPTIMIZER_KIND__OPT_ADAM:
        return "adam";
    default:
        return "?";
    }
}

static float *alloc_floats(uint64_t n, int zero)
{
    size_t bytes = ((size_t)n * sizeof(float) + 63u) & ~(size_t)63u;
    float *p = aligned_alloc(64, bytes == 0 ? 64 : bytes);
    if (p != NULL && zero)
        memset(p, 0, bytes == 0 ? 64 : bytes);
    return p;
}

static int state_arrays(Ps__OptimizerKind k)
{
    switch (k) {
    case PS__OPTIMIZER_KIND__OPT_MOMENTUM:
    case PS__OPTIMIZER_KIND__OPT_ADAGRAD:
        return 1;
    case PS__OPTIMIZER_KIND__OPT_ADAM:
        return 2;
    default:
        return 0;
    }
}

int psd_table_create(const Ps__TableSpec *spec, uint32_t id, uint32_t shard, uint32_t shards,
                     struct psd_table **out)
{
    *out = NULL;
    struct psd_table *t = calloc(1, sizeof *t);
    if (t == NULL)
        return PS_ENOMEM;
    snprintf(t->name, sizeof t->name, "%s", spec->name);
    t->id = id;
    t->size = spec->size;
    ps_shard_range(spec->size, shards, shard, &t->lo, &t->hi);
    t->optimizer = spec->optimizer;
    t->lr = spec->lr;
    t->weight_decay = spec->weight_decay;
    t->momentum = spec->momentum;
    t->nesterov = spec->nesterov ? 1 : 0;
    t->beta1 = spec->beta1;
    t->beta2 = spec->beta2;
    t->eps = spec->eps;
    t->init = spec->init;
    t->init_scale = spec->init_scale;
    t->seed = spec->seed;
    uint64_t n = t->hi - t->lo;
    int ns = state_arrays(t->optimizer);
    t->w = alloc_floats(n, 0);
    t->s1 = ns >= 1 ? alloc_floats(n, 1) : NULL;
    t->s2 = ns >= 2 ? alloc_floats(n, 1) : NULL;
    if (t->w == NULL || (ns >= 1 && t->s1 == NULL) || (ns >= 2 && t->s2 == NULL)) {
        psd_table_destroy(t);
        return PS_ENOMEM;
    }
    ps_init_fill(t->w, (size_t)n, (enum ps_init_kind)t->init, t->init_scale, t->seed, t->lo);
    *out = t;
    return 0;
}

void psd_table_destroy(struct psd_table *t)
{
    if (t == NULL)
        return;
    free(t->w);
    free(t->s1);
    free(t->s2);
    free(t);
}

static int feq(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

int psd_table_same_spec(const struct psd_table *t, const Ps__TableSpec *spec)
{
    return strcmp(t->name, spec->name) == 0 && t->size == spec->size &&
           t->optimizer == spec->optimizer && feq(t->lr, spec->lr) &&
           feq(t->weight_decay, spec->weight_decay) && feq(t->momentum, spec->momentum) &&
           t->nesterov == (spec->nesterov ? 1 : 0) && feq(t->beta1, spec->beta1) &&
           feq(t->beta2, spec->beta2) && feq(t->eps, spec->eps) && t->init == spec->init &&
           feq(t->init_scale, spec->init_scale) && t->seed == spec->seed;
}

void psd_table_apply(struct psd_table *t, uint64_t offset, uint64_t count, const float *g)
{
    assert(offset >= t->lo);
    assert(count <= t->hi - offset);
    size_t base = (size_t)(offset - t->lo);
    float *restrict w = t->w + base;
    const float lr = t->lr, wd = t->weight_decay;
    t->steps++;
    switch (t->optimizer) {
    case PS__OPTIMIZER_KIND__OPT_MOMENTUM: {
        float *restrict v = t->s1 + base;
        for (size_t i = 0; i < count; i++)
            w[i] =
                psk_momentum(w[i], psk_decay(g[i], w[i], wd), &v[i], lr, t->momentum, t->nesterov);
        break;
    }
    case PS__OPTIMIZER_KIND__OPT_ADAGRAD: {
        float *restrict h = t->s1 + base;
        for (size_t i = 0; i < count; i++)
            w[i] = psk_adagrad(w[i], psk_decay(g[i], w[i], wd), &h[i], lr, t->eps);
        break;
    }
    case PS__OPTIMIZER_KIND__OPT_ADAM: {
        float *restrict m = t->s1 + base;
        float *restrict v = t->s2 + base;
        float bc1 = (float)(1.0 - pow((double)t->beta1, (double)t->steps));
        float bc2 = (float)(1.0 - pow((double)t->beta2, (double)t->steps));
        for (size_t i = 0; i < count; i++)
            w[i] = psk_adam(w[i], psk_decay(g[i], w[i], wd), &m[i], &v[i], lr, t->beta1, t->beta2,
                            t->eps, bc1, bc2);
        break;
    }
    case PS__OPTIMIZER_KIND__OPT_SGD:
    default:
        for (size_t i = 0; i < count; i++)
            w[i] = psk_sgd(w[i], psk_decay(g[i], w[i], wd), lr);
        break;
    }
}

void psd_table_read(const struct psd_table *t, uint64_t offset, uint64_t count, float *out)
{
    assert(offset >= t->lo);
    assert(count <= t->hi - offset);
    memcpy(out, t->w + (offset - t->lo), (size_t)count * sizeof(float));
}
