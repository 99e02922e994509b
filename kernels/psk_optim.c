/* Optimizer loops over psk_math.h's per-element rules. */
#include "psk_optim.h"

#include "psk_math.h"

#include <math.h>
#include <string.h>

static const char *const names[] = {"sgd",  "momentum", "adagrad",
                                    "adam", "ftrl",     "rowwise_adagrad"};

int psk_optim_state_arrays(int kind)
{
    switch (kind) {
    case PSK_OPT_MOMENTUM:
    case PSK_OPT_ADAGRAD:
        return 1;
    case PSK_OPT_ADAM:
    case PSK_OPT_FTRL:
        return 2;
    default:
        return 0;
    }
}

const char *psk_optim_name(int kind)
{
    return kind >= 0 && kind <= PSK_OPT_ROWWISE_ADAGRAD ? names[kind] : "?";
}

int psk_optim_parse(const char *name)
{
    for (int i = 0; i <= PSK_OPT_ROWWISE_ADAGRAD; i++)
        if (strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

float psk_optim_lr(const struct psk_optim *o, uint64_t step)
{
    if (o->schedule != PSK_LR_COSINE || o->decay_steps == 0)
        return o->lr;
    uint64_t t = step > 0 ? step - 1 : 0; /* the first step runs at the full rate */
    t /= o->sched_div > 1 ? o->sched_div : 1;
    double x = t >= o->decay_steps ? 1.0 : (double)t / (double)o->decay_steps;
    return (float)(o->lr * 0.5 * (1.0 + cos(3.14159265358979323846 * x)));
}

/* The dense loops, built twice (below): the options are read into locals
 * first, since with -fno-strict-aliasing a store to w may change *o as far
 * as the compiler knows, and Adam's loop stayed scalar in an AVX2 build
 * while it read o->beta1 and friends each time. */
static inline __attribute__((always_inline)) void
apply_dense(const struct psk_optim *o, uint64_t step, float *restrict w, float *restrict s1,
            float *restrict s2, const float *restrict g, size_t n)
{
    const float lr = psk_optim_lr(o, step), wd = o->weight_decay;
    const float mom = o->momentum, b1 = o->beta1, b2 = o->beta2, eps = o->eps, l1 = o->l1,
                l2 = o->l2;
    const int nesterov = o->nesterov;
    switch (o->kind) {
    case PSK_OPT_MOMENTUM:
        for (size_t i = 0; i < n; i++)
            w[i] = psk_momentum(w[i], psk_decay(g[i], w[i], wd), &s1[i], lr, mom, nesterov);
        break;
    case PSK_OPT_ADAGRAD:
        for (size_t i = 0; i < n; i++)
            w[i] = psk_adagrad(w[i], psk_decay(g[i], w[i], wd), &s1[i], lr, eps);
        break;
    case PSK_OPT_ADAM: {
        float bc1 = (float)(1.0 - pow((double)b1, (double)step));
        float bc2 = (float)(1.0 - pow((double)b2, (double)step));
        for (size_t i = 0; i < n; i++)
            w[i] = psk_adam(w[i], psk_decay(g[i], w[i], wd), &s1[i], &s2[i], lr, b1, b2, eps, bc1,
                            bc2);
        break;
    }
    case PSK_OPT_FTRL:
        for (size_t i = 0; i < n; i++)
            w[i] = psk_ftrl(w[i], g[i], &s1[i], &s2[i], lr, eps, l1, l2);
        break;
    case PSK_OPT_SGD:
    default:
        for (size_t i = 0; i < n; i++)
            w[i] = psk_sgd(w[i], psk_decay(g[i], w[i], wd), lr);
        break;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PSK_AVX2_CLONE 1
/* AVX2 where the CPU has it, the baseline build elsewhere: psd runs on
 * whatever x86-64 it is deployed to. Both do the same operations on each
 * element ("avx2" does not include FMA, so nothing is contracted), so the
 * results are bit for bit the same on any machine (test_optim checks).
 * 4 KiB of SGD: 145 -> 60 ns, momentum 170 -> 95 ns, Adam 1100 -> 570 ns.
 * A plain check rather than target_clones: clang 14 (the fuzz build)
 * names target_clones symbols so that other files cannot link to them. */
__attribute__((target("avx2"))) static void apply_avx2(const struct psk_optim *o, uint64_t step,
                                                       float *restrict w, float *restrict s1,
                                                       float *restrict s2, const float *restrict g,
                                                       size_t n)
{
    apply_dense(o, step, w, s1, s2, g, n);
}
#endif

void psk_optim_apply(const struct psk_optim *o, uint64_t step, float *restrict w,
                     float *restrict s1, float *restrict s2, const float *restrict g, size_t n)
{
#ifdef PSK_AVX2_CLONE
    if (__builtin_cpu_supports("avx2")) {
        apply_avx2(o, step, w, s1, s2, g, n);
        return;
    }
#endif
    apply_dense(o, step, w, s1, s2, g, n);
}

/* How many keys ahead a sparse apply asks for its lines. Keys are far apart,
 * so each is a miss in every array. The request goes to L2 only
 * (__builtin_prefetch locality 1, prefetcht2): a core keeps far more of
 * those in flight than loads into L1, which are limited by its fill
 * buffers. 65,536 keys spread over a 40 MB table took 420 us with an L1
 * prefetch 16 keys ahead and 120 us with this one (any distance from 128
 * to 1024 did as well; 64 took 195 us). */
#define PREFETCH_AHEAD 256

static inline void prefetch_key(const float *a, const uint64_t *idx, uint64_t base, size_t i,
                                size_t n)
{
    if (a != NULL && i + PREFETCH_AHEAD < n)
        __builtin_prefetch(&a[idx[i + PREFETCH_AHEAD] - base], 1, 1);
}

/* The lines of the weight and of `states` state arrays for the index
 * PREFETCH_AHEAD on, when asked to. */
static inline __attribute__((always_inline)) void
prefetch_lines(int ahead, int states, const float *w, const float *s1, const float *s2,
               const uint64_t *idx, uint64_t base, size_t i, size_t n)
{
    if (!ahead)
        return;
    prefetch_key(w, idx, base, i, n);
    if (states >= 1)
        prefetch_key(s1, idx, base, i, n);
    if (states >= 2)
        prefetch_key(s2, idx, base, i, n);
}

/* The scattered loops: d elements from (idx[i] - base) * d on, with
 * gradients from g + i * d. ahead: ask for the lines of the index
 * PREFETCH_AHEAD on (the keyed applies; a sparse table's rows are asked
 * for by the caller, which finds them). Same per-element rules as the
 * dense loops; the kind, rate and bias corrections are decided once, not
 * per element. */
static inline __attribute__((always_inline)) void
apply_scattered(const struct psk_optim *o, uint64_t step, float *w, float *s1, float *s2,
                const uint64_t *idx, uint64_t base, size_t d, const float *g, size_t n, int ahead)
{
    const float lr = psk_optim_lr(o, step), wd = o->weight_decay;
    switch (o->kind) {
    case PSK_OPT_MOMENTUM:
        for (size_t i = 0; i < n; i++, g += d) {
            prefetch_lines(ahead, 1, w, s1, s2, idx, base, i, n);
            for (size_t e = 0, j = (size_t)(idx[i] - base) * d; e < d; e++, j++)
                w[j] = psk_momentum(w[j], psk_decay(g[e], w[j], wd), &s1[j], lr, o->momentum,
                                    o->nesterov);
        }
        break;
    case PSK_OPT_ADAGRAD:
        for (size_t i = 0; i < n; i++, g += d) {
            prefetch_lines(ahead, 1, w, s1, s2, idx, base, i, n);
            for (size_t e = 0, j = (size_t)(idx[i] - base) * d; e < d; e++, j++)
                w[j] = psk_adagrad(w[j], psk_decay(g[e], w[j], wd), &s1[j], lr, o->eps);
        }
        break;
    case PSK_OPT_ADAM: {
        float bc1 = (float)(1.0 - pow((double)o->beta1, (double)step));
        float bc2 = (float)(1.0 - pow((double)o->beta2, (double)step));
        for (size_t i = 0; i < n; i++, g += d) {
            prefetch_lines(ahead, 2, w, s1, s2, idx, base, i, n);
            for (size_t e = 0, j = (size_t)(idx[i] - base) * d; e < d; e++, j++)
                w[j] = psk_adam(w[j], psk_decay(g[e], w[j], wd), &s1[j], &s2[j], lr, o->beta1,
                                o->beta2, o->eps, bc1, bc2);
        }
        break;
    }
    case PSK_OPT_FTRL:
        for (size_t i = 0; i < n; i++, g += d) {
            prefetch_lines(ahead, 2, w, s1, s2, idx, base, i, n);
            for (size_t e = 0, j = (size_t)(idx[i] - base) * d; e < d; e++, j++)
                w[j] = psk_ftrl(w[j], g[e], &s1[j], &s2[j], lr, o->eps, o->l1, o->l2);
        }
        break;
    case PSK_OPT_SGD:
    default:
        for (size_t i = 0; i < n; i++, g += d) {
            prefetch_lines(ahead, 0, w, s1, s2, idx, base, i, n);
            for (size_t e = 0, j = (size_t)(idx[i] - base) * d; e < d; e++, j++)
                w[j] = psk_sgd(w[j], psk_decay(g[e], w[j], wd), lr);
        }
        break;
    }
}

void psk_optim_apply_sparse(const struct psk_optim *o, uint64_t step, float *w, float *s1,
                            float *s2, const uint64_t *idx, uint64_t base, const float *g, size_t n)
{
    apply_scattered(o, step, w, s1, s2, idx, base, 1, g, n, 1);
}

int psk_optim_uses_step(const struct psk_optim *o)
{
    return o->kind == PSK_OPT_ADAM || (o->schedule == PSK_LR_COSINE && o->decay_steps != 0);
}

void psk_optim_apply_rows(const struct psk_optim *o, uint64_t step, float *w, float *s1, float *s2,
                          const uint64_t *rows, size_t d, const float *g, size_t n)
{
    if (d == 1) /* the loop with the row width known: embeddings of one value, dim 1 */
        apply_scattered(o, step, w, s1, s2, rows, 0, 1, g, n, 0);
    else
        apply_scattered(o, step, w, s1, s2, rows, 0, d, g, n, 0);
}

void psk_optim_apply_rowwise(const struct psk_optim *o, uint64_t step, float *w, float *rs,
                             const uint64_t *rows, size_t d, const float *g, size_t n)
{
    float lr = psk_optim_lr(o, step), wd = o->weight_decay;
    for (size_t i = 0; i < n; i++) {
        float *wr = w + rows[i] * d;
        const float *gr = g + i * d;
        float sq = 0.0f;
        for (size_t e = 0; e < d; e++) {
            float x = psk_decay(gr[e], wr[e], wd);
            sq += x * x;
        }
        float s = rs[rows[i]] + sq / (float)d;
        rs[rows[i]] = s;
        float k = lr / (sqrtf(s) + o->eps);
        for (size_t e = 0; e < d; e++)
            wr[e] -= k * psk_decay(gr[e], wr[e], wd);
    }
}
