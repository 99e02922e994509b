/* Internal: the function table each backend file fills in. Not installed;
 * nothing outside kernels/ includes it. */
#ifndef PSK_IMPL_H
#define PSK_IMPL_H

#include "psk.h"

struct psk_ops {
    int (*alloc)(struct psk_backend *b, size_t bytes, void **ptr);
    void (*free)(struct psk_backend *b, void *ptr);
    int (*upload)(struct psk_backend *b, void *dst, const void *src, size_t bytes);
    int (*download)(struct psk_backend *b, void *dst, const void *src, size_t bytes);
    int (*sync)(struct psk_backend *b);
    int (*copy)(struct psk_backend *b, void *dst, const void *src, size_t bytes);
    int (*gemm)(struct psk_backend *b, int ta, int tb, int m, int n, int k, float alpha,
                const float *a, int lda, const float *bm, int ldb, float beta, float *c, int ldc);
    int (*axpy)(struct psk_backend *b, size_t n, float a, const float *x, float *y);
    int (*scale)(struct psk_backend *b, size_t n, float a, float *x);
    int (*host_alloc)(struct psk_backend *b, size_t bytes, void **ptr);
    void (*host_free)(struct psk_backend *b, void *ptr);
    int (*bias_add)(struct psk_backend *b, int rows, int cols, const float *bias, float *y);
    int (*relu)(struct psk_backend *b, size_t n, const float *x, float *y);
    int (*relu_backward)(struct psk_backend *b, size_t n, const float *y, float *dx);
    int (*softmax_xent)(struct psk_backend *b, int rows, int cols, const float *logits,
                        const int *labels, float scale, float *dlogits, float *row_loss, int *pred);
    int (*col_sum)(struct psk_backend *b, int rows, int cols, const float *x, float *out);
    int (*topk)(struct psk_backend *b, size_t n, float *v, float *u, size_t k, uint64_t *idx,
                float *val);
    /* NULL: psk_topk_accum makes its update with scale and axpy, then topk */
    int (*topk_accum)(struct psk_backend *b, size_t n, const float *g, float mom, float *u,
                      float *v, size_t k, uint64_t *idx, float *val);
    int (*im2col)(struct psk_backend *b, int c, int h, int w, int k, int pad, const float *x,
                  float *col);
    int (*col2im)(struct psk_backend *b, int c, int h, int w, int k, int pad, const float *dcol,
                  float *dx);
    /* arg NULL: average pooling */
    int (*pool)(struct psk_backend *b, int planes, int h, int w, int s, const float *x, float *y,
                int *arg);
    int (*pool_backward)(struct psk_backend *b, int planes, int h, int w, int s, const float *dy,
                         const int *arg, float *dx);
    int (*round)(struct psk_backend *b, int p, size_t n, float *x);
    int (*count_nonfinite)(struct psk_backend *b, size_t n, const float *x, uint64_t *count);
    void (*close)(struct psk_backend *b);
};

struct psk_backend {
    const struct psk_ops *ops;
    enum psk_kind kind;
    char desc[128];
    char err[256];
    int precision; /* enum psk_precision of the GEMM inputs */
    void *impl;    /* backend-private state */
};

int psk__cpu_open(struct psk_backend *b, char *err, size_t errlen);
void psk__cpu_threads(struct psk_backend *b, int n);
/* device < 0: first usable device. Returns PS_ENODEV when none is usable. */
int psk__cuda_open(struct psk_backend *b, int device, char *err, size_t errlen);
void psk__set_error(struct psk_backend *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
