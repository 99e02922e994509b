/* Backend selection and the thin dispatch through the ops table. */
#include "psk.h"

#include "psk_impl.h"

#include "ps_err.h"
#include "ps_opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_spec(const char *spec, int *want_cuda, int *device)
{
    *device = -1;
    if (strcmp(spec, "auto") == 0) {
        *want_cuda = -1;
        return 0;
    }
    if (strcmp(spec, "cpu") == 0) {
        *want_cuda = 0;
        return 0;
    }
    if (strcmp(spec, "cuda") == 0) {
        *want_cuda = 1;
        return 0;
    }
    if (strncmp(spec, "cuda:", 5) == 0) {
        uint64_t d = 0;
        if (ps_parse_u64(spec + 5, 0, 255, &d) != 0)
            return PS_EINVAL;
        *want_cuda = 1;
        *device = (int)d;
        return 0;
    }
    return PS_EINVAL;
}

int psk_open(const char *spec, struct psk_backend **out, char *err, size_t errlen)
{
    *out = NULL;
    int want_cuda = 0, device = -1;
    if (spec == NULL || parse_spec(spec, &want_cuda, &device) != 0) {
        snprintf(err, errlen, "device '%s' is not one of auto, cpu, cuda, cuda:N",
                 spec ? spec : "(null)");
        return PS_EINVAL;
    }
    struct psk_backend *b = calloc(1, sizeof *b);
    if (b == NULL) {
        snprintf(err, errlen, "out of memory");
        return PS_ENOMEM;
    }
    int rc = PS_ENODEV;
    err[0] = '\0';
    if (want_cuda != 0) {
        rc = psk__cuda_open(b, device, err, errlen);
        if (rc != 0 && want_cuda == 1) {
            free(b);
            return rc;
        }
    }
    if (rc != 0) {
        char why[256]; /* auto: why CUDA was not used ("" for cpu), kept for the caller */
        snprintf(why, sizeof why, "%s", err);
        rc = psk__cpu_open(b, err, errlen);
        if (rc == 0)
            snprintf(err, errlen, "%s", why);
    }
    if (rc != 0) {
        free(b);
        return rc;
    }
    *out = b;
    return 0;
}

void psk_close(struct psk_backend *b)
{
    if (b == NULL)
        return;
    b->ops->close(b);
    free(b);
}

enum psk_kind psk_kind_of(const struct psk_backend *b)
{
    return b->kind;
}

void psk_set_blas_threads(struct psk_backend *b, int n)
{
    if (b->kind == PSK_CPU)
        psk__cpu_threads(b, n);
}

const char *psk_describe(const struct psk_backend *b)
{
    return b->desc;
}

const char *psk_last_error(const struct psk_backend *b)
{
    return b->err;
}

int psk_alloc(struct psk_backend *b, size_t bytes, void **ptr)
{
    return b->ops->alloc(b, bytes, ptr);
}

void psk_free(struct psk_backend *b, void *ptr)
{
    if (ptr != NULL)
        b->ops->free(b, ptr);
}

int psk_upload(struct psk_backend *b, void *dst, const void *src, size_t bytes)
{
    return bytes == 0 ? 0 : b->ops->upload(b, dst, src, bytes);
}

int psk_download(struct psk_backend *b, void *dst, const void *src, size_t bytes)
{
    return bytes == 0 ? 0 : b->ops->download(b, dst, src, bytes);
}

int psk_copy(struct psk_backend *b, void *dst, const void *src, size_t bytes)
{
    return bytes == 0 ? 0 : b->ops->copy(b, dst, src, bytes);
}

int psk_sync(struct psk_backend *b)
{
    return b->ops->sync(b);
}

int psk_gemm(struct psk_backend *b, int trans_a, int trans_b, int m, int n, int k, float alpha,
             const float *a, int lda, const float *bm, int ldb, float beta, float *c, int ldc)
{
    if (m < 0 || n < 0 || k < 0)
        return PS_EINVAL;
    if (m == 0 || n == 0)
        return 0;
    return b->ops->gemm(b, trans_a, trans_b, m, n, k, alpha, a, lda, bm, ldb, beta, c, ldc);
}

int psk_axpy(struct psk_backend *b, size_t n, float a, const float *x, float *y)
{
    return n == 0 ? 0 : b->ops->axpy(b, n, a, x, y);
}

int psk_scale(struct psk_backend *b, size_t n, float a, float *x)
{
    return n == 0 ? 0 : b->ops->scale(b, n, a, x);
}

int psk_host_alloc(struct psk_backend *b, size_t bytes, void **ptr)
{
    return b->ops->host_alloc(b, bytes, ptr);
}

void psk_host_free(struct psk_backend *b, void *ptr)
{
    if (ptr != NULL)
        b->ops->host_free(b, ptr);
}

int psk_bias_add(struct psk_backend *b, int rows, int cols, const float *bias, float *y)
{
    if (rows < 0 || cols < 0)
        return PS_EINVAL;
    return rows == 0 || cols == 0 ? 0 : b->ops->bias_add(b, rows, cols, bias, y);
}

int psk_precision_parse(const char *s)
{
    static const char *const names[] = {"f32", "bf16", "f16"};
    for (int i = 0; s != NULL && i < 3; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

const char *psk_precision_name(int p)
{
    return p == PSK_PREC_BF16 ? "bf16" : p == PSK_PREC_F16 ? "f16" : "f32";
}

void psk_set_precision(struct psk_backend *b, int p)
{
    b->precision = p;
}

int psk_round(struct psk_backend *b, int p, size_t n, float *x)
{
    return n == 0 || p == PSK_PREC_F32 ? 0 : b->ops->round(b, p, n, x);
}

int psk_count_nonfinite(struct psk_backend *b, size_t n, const float *x, uint64_t *count)
{
    *count = 0;
    return n == 0 ? 0 : b->ops->count_nonfinite(b, n, x, count);
}

int psk_relu(struct psk_backend *b, size_t n, const float *x, float *y)
{
    return n == 0 ? 0 : b->ops->relu(b, n, x, y);
}

int psk_relu_backward(struct psk_backend *b, size_t n, const float *y, float *dx)
{
    return n == 0 ? 0 : b->ops->relu_backward(b, n, y, dx);
}

int psk_softmax_xent(struct psk_backend *b, int rows, int cols, const float *logits,
                     const int *labels, float scale, float *dlogits, float *row_loss, int *pred)
{
    if (rows < 0 || cols <= 0)
        return PS_EINVAL;
    return rows == 0 ? 0
                     : b->ops->softmax_xent(b, rows, cols, logits, labels, scale, dlogits, row_loss,
                                            pred);
}

int psk_col_sum(struct psk_backend *b, int rows, int cols, const float *x, float *out)
{
    if (rows < 0 || cols < 0)
        return PS_EINVAL;
    return cols == 0 ? 0 : b->ops->col_sum(b, rows, cols, x, out);
}

int psk_topk(struct psk_backend *b, size_t n, float *v, float *u, size_t k, uint64_t *idx,
             float *val)
{
    if (k > n)
        return PS_EINVAL;
    return k == 0 ? 0 : b->ops->topk(b, n, v, u, k, idx, val);
}

int psk_topk_accum(struct psk_backend *b, size_t n, const float *g, float mom, float *u, float *v,
                   size_t k, uint64_t *idx, float *val)
{
    if (k > n)
        return PS_EINVAL;
    if (k > 0 && b->ops->topk_accum != NULL)
        return b->ops->topk_accum(b, n, g, mom, u, v, k, idx, val);
    int rc = u != NULL ? psk_scale(b, n, mom, u) || psk_axpy(b, n, 1.0f, g, u) ||
                             psk_axpy(b, n, 1.0f, u, v)
                       : psk_axpy(b, n, 1.0f, g, v);
    return rc ? PS_EDEVICE : psk_topk(b, n, v, u, k, idx, val);
}
