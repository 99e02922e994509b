/* Optimizer update loops over host arrays: the one implementation that the
 * server applies to its shards and `psworker --standalone` applies locally,
 * so both train with the same code. The per-element rules are psk_math.h.
 * Plain CPU code, no backend: the server links it without any CUDA. */
#ifndef PSK_OPTIM_H
#define PSK_OPTIM_H

#include <stddef.h>
#include <stdint.h>

/* Same numbers as ps.OptimizerKind. */
enum psk_optim_kind {
    PSK_OPT_SGD = 0,
    PSK_OPT_MOMENTUM = 1,
    PSK_OPT_ADAGRAD = 2,
    PSK_OPT_ADAM = 3,
    PSK_OPT_FTRL = 4,            /* lr = alpha, eps = beta, l1, l2 */
    PSK_OPT_ROWWISE_ADAGRAD = 5, /* rows only: psk_optim_apply_rowwise */
};

/* Same numbers as ps.LrSchedule. */
enum psk_lr_schedule {
    PSK_LR_CONSTANT = 0,
    PSK_LR_COSINE = 1,
};

struct psk_optim {
    int kind;
    float lr, weight_decay, momentum, beta1, beta2, eps;
    int nesterov;
    float l1, l2;         /* FTRL */
    int schedule;         /* enum psk_lr_schedule */
    uint64_t decay_steps; /* T of the schedule; 0 means constant */
    uint64_t sched_div;   /* steps per schedule step (W when each worker's push
                           * is applied on its own, as in asp/ssp); 0 means 1 */
};

/* The learning rate of 1-based step `step` under the schedule. */
float psk_optim_lr(const struct psk_optim *o, uint64_t step);

/* State arrays the kind needs beside the weights (0, 1 or 2). */
int psk_optim_state_arrays(int kind);
/* "sgd", "momentum", "adagrad", "adam" or "?". */
const char *psk_optim_name(int kind);
/* Parses a name; returns the kind or -1. */
int psk_optim_parse(const char *name);

/* One update of w[0..n) with gradient g; step is 1-based (Adam's t). s1/s2
 * are the state arrays (NULL when the kind needs fewer). */
void psk_optim_apply(const struct psk_optim *o, uint64_t step, float *w, float *s1, float *s2,
                     const float *g, size_t n);

/* The same update on scattered elements: w[idx[i] - base] with gradient
 * g[i] for i < n (state arrays indexed like w). Elements not listed are
 * untouched. */
void psk_optim_apply_sparse(const struct psk_optim *o, uint64_t step, float *w, float *s1,
                            float *s2, const uint64_t *idx, uint64_t base, const float *g,
                            size_t n);

/* Whether the update depends on its step (Adam's bias corrections, a
 * learning-rate schedule): where it does not, rows that have taken
 * different numbers of steps can be updated in one call. */
int psk_optim_uses_step(const struct psk_optim *o);

/* The same update on rows of d elements: w[rows[i] * d + e] with gradient
 * g[i * d + e] for i < n, e < d, all as step `step`. The caller asks for
 * the rows' cache lines. */
void psk_optim_apply_rows(const struct psk_optim *o, uint64_t step, float *w, float *s1, float *s2,
                          const uint64_t *rows, size_t d, const float *g, size_t n);

/* Row-wise Adagrad on rows of d elements (TorchRec's and Paddle's for
 * embeddings): with x = g + weight_decay * w for the row's elements, the
 * row's one accumulator rs[rows[i]] += mean of x^2, then
 * w -= lr * x / (sqrt(rs) + eps). One float of state per row. */
void psk_optim_apply_rowwise(const struct psk_optim *o, uint64_t step, float *w, float *rs,
                             const uint64_t *rows, size_t d, const float *g, size_t n);

#endif
