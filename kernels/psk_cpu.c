/* CPU backend: OpenBLAS for GEMM, plain loops over psk_math.h for the rest.
 * The reference every other backend is compared against. */
#include "psk_impl.h"

#include "psk_math.h"
#include "psk_select.h"

#include "ps_err.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cpu_alloc(struct psk_backend *b, size_t bytes, void **ptr)
{
    /* 64-byte alignment: whole cache lines, and AVX-512 friendly. */
    size_t rounded = (bytes + 63u) & ~(size_t)63u;
    *ptr = aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (*ptr == NULL) {
        psk__set_error(b, "cannot allocate %zu bytes", bytes);
        return PS_ENOMEM;
    }
    return 0;
}

static void cpu_free(struct psk_backend *b, void *ptr)
{
    (void)b;
    free(ptr);
}

static int cpu_copy(struct psk_backend *b, void *dst, const void *src, size_t bytes)
{
    (void)b;
    memmove(dst, src, bytes);
    return 0;
}

static int cpu_sync(struct psk_backend *b)
{
    (void)b;
    return 0;
}

static int cpu_gemm(struct psk_backend *b, int ta, int tb, int m, int n, int k, float alpha,
                    const float *a, int lda, const float *bm, int ldb, float beta, float *c,
                    int ldc)
{
    (void)b;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
                k, alpha, a, lda, bm, ldb, beta, c, ldc);
    return 0;
}

static int cpu_axpy(struct psk_backend *b, size_t n, float a, const float *x, float *y)
{
    (void)b;
    for (size_t i = 0; i < n; i++)
        y[i] = psk_axpy1(a, x[i], y[i]);
    return 0;
}

static int cpu_scale(struct psk_backend *b, size_t n, float a, float *x)
{
    (void)b;
    for (size_t i = 0; i < n; i++)
        x[i] *= a;
    return 0;
}

static int cpu_bias_add(struct psk_backend *b, int rows, int cols, const float *bias, float *y)
{
    (void)b;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            y[(size_t)r * cols + c] += bias[c];
    return 0;
}

static int cpu_relu(struct psk_backend *b, size_t n, const float *x, float *y)
{
    (void)b;
    for (size_t i = 0; i < n; i++)
        y[i] = psk_el_relu(x[i]);
    return 0;
}

static int cpu_relu_backward(struct psk_backend *b, size_t n, const float *y, float *dx)
{
    (void)b;
    for (size_t i = 0; i < n; i++)
        dx[i] = psk_el_relu_grad(y[i], dx[i]);
    return 0;
}

/* One loop per precision, so that each vectorises; AVX2 where the CPU
 * has it (f16's rintf needs SSE4.1's roundps), the baseline elsewhere.
 * Both round the same way, to the bit. */
static inline __attribute__((always_inline)) void round_loop(int p, size_t n, float *restrict x)
{
    if (p == PSK_PREC_BF16)
        for (size_t i = 0; i < n; i++)
            x[i] = psk_round_bf16(x[i]);
    else
        for (size_t i = 0; i < n; i++)
            x[i] = psk_round_f16(x[i]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PSK_CPU_AVX2 1
__attribute__((target("avx2"))) static void round_avx2(int p, size_t n, float *restrict x)
{
    round_loop(p, n, x);
}
#endif

static int cpu_round(struct psk_backend *b, int p, size_t n, float *x)
{
    (void)b;
#ifdef PSK_CPU_AVX2
    if (__builtin_cpu_supports("avx2")) {
        round_avx2(p, n, x);
        return 0;
    }
#endif
    round_loop(p, n, x);
    return 0;
}

static int cpu_count_nonfinite(struct psk_backend *b, size_t n, const float *x, uint64_t *count)
{
    (void)b;
    uint64_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += (uint64_t)psk_nonfinite(x[i]);
    *count = c;
    return 0;
}

static int cpu_softmax_xent(struct psk_backend *b, int rows, int cols, const float *logits,
                            const int *labels, float scale, float *dlogits, float *row_loss,
                            int *pred)
{
    (void)b;
    for (int r = 0; r < rows; r++)
        psk_softmax_xent_row(logits + (size_t)r * cols, cols, labels[r], scale,
                             dlogits + (size_t)r * cols, &row_loss[r], &pred[r]);
    return 0;
}

static int cpu_col_sum(struct psk_backend *b, int rows, int cols, const float *x, float *out)
{
    (void)b;
    for (int c = 0; c < cols; c++)
        out[c] = 0.0f;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            out[c] += x[(size_t)r * cols + c];
    return 0;
}

static int cpu_topk(struct psk_backend *b, size_t n, float *v, float *u, size_t k, uint64_t *idx,
                    float *val)
{
    int rc = psk_topk_host(n, v, u, k, idx, val);
    if (rc != 0)
        psk__set_error(b, "topk: cannot allocate %zu floats", n);
    return rc;
}

static int cpu_topk_accum(struct psk_backend *b, size_t n, const float *g, float mom, float *u,
                          float *v, size_t k, uint64_t *idx, float *val)
{
    int rc = psk_topk_host_accum(n, g, mom, u, v, k, idx, val, NULL);
    if (rc != 0)
        psk__set_error(b, "topk: cannot allocate %zu floats", n);
    return rc;
}

/* The CPU loops give the values of psk_math.h's per-element functions
 * (the CUDA kernels call those) without a division per element: whole
 * row segments are copied, and col2im adds each tap in the gather's
 * (kh, kw) order, so the sums are the same bits. */
static int cpu_im2col(struct psk_backend *b, int c, int h, int w, int k, int pad, const float *x,
                      float *col)
{
    (void)b;
    int ho = psk_conv_out(h, k, pad), wo = psk_conv_out(w, k, pad);
    float *dst = col;
    for (int ci = 0; ci < c; ci++)
        for (int kh = 0; kh < k; kh++)
            for (int kw = 0; kw < k; kw++) {
                /* output columns ow whose input column ow + kw - pad is inside */
                int lo = pad - kw > 0 ? pad - kw : 0, hi = w + pad - kw < wo ? w + pad - kw : wo;
                for (int oh = 0; oh < ho; oh++, dst += wo) {
                    int ih = oh + kh - pad;
                    if (ih < 0 || ih >= h || lo >= hi) {
                        memset(dst, 0, (size_t)wo * sizeof *dst);
                        continue;
                    }
                    const float *row = x + ((long)ci * h + ih) * w;
                    for (int ow = 0; ow < lo; ow++)
                        dst[ow] = 0.0f;
                    memcpy(dst + lo, row + lo + kw - pad, (size_t)(hi - lo) * sizeof *dst);
                    for (int ow = hi; ow < wo; ow++)
                        dst[ow] = 0.0f;
                }
            }
    return 0;
}

static int cpu_col2im(struct psk_backend *b, int c, int h, int w, int k, int pad, const float *dcol,
                      float *dx)
{
    (void)b;
    int ho = psk_conv_out(h, k, pad), wo = psk_conv_out(w, k, pad);
    memset(dx, 0, (size_t)c * h * w * sizeof *dx);
    const float *src = dcol;
    for (int ci = 0; ci < c; ci++)
        for (int kh = 0; kh < k; kh++)
            for (int kw = 0; kw < k; kw++) {
                int lo = pad - kw > 0 ? pad - kw : 0, hi = w + pad - kw < wo ? w + pad - kw : wo;
                for (int oh = 0; oh < ho; oh++, src += wo) {
                    int ih = oh + kh - pad;
                    if (ih < 0 || ih >= h)
                        continue;
                    float *row = dx + ((long)ci * h + ih) * w;
                    for (int ow = lo; ow < hi; ow++)
                        row[ow + kw - pad] += src[ow];
                }
            }
    return 0;
}

static int cpu_pool(struct psk_backend *b, int planes, int h, int w, int s, const float *x,
                    float *y, int *arg)
{
    (void)b;
    int ho = h / s, wo = w / s;
    for (int q = 0; q < planes; q++) {
        const float *xp = x + (long)q * h * w;
        for (int i = 0; i < ho; i++)
            for (int j = 0; j < wo; j++) {
                long o = ((long)q * ho + i) * wo + j;
                y[o] = arg != NULL ? psk_maxpool_el(xp, w, s, i, j, &arg[o])
                                   : psk_avgpool_el(xp, w, s, i, j);
            }
    }
    return 0;
}

static int cpu_pool_backward(struct psk_backend *b, int planes, int h, int w, int s,
                             const float *dy, const int *arg, float *dx)
{
    (void)b;
    int ho = h / s, wo = w / s;
    memset(dx, 0, (size_t)planes * h * w * sizeof *dx);
    for (int q = 0; q < planes; q++) {
        float *dxp = dx + (long)q * h * w;
        const float *dyp = dy + (long)q * ho * wo;
        for (int i = 0; i < ho; i++)
            for (int j = 0; j < wo; j++) {
                long o = (long)i * wo + j;
                if (arg != NULL) {
                    dxp[arg[(long)q * ho * wo + o]] = dyp[o];
                    continue;
                }
                float v = dyp[o] / (float)(s * s);
                for (int r = i * s; r < i * s + s; r++)
                    for (int t = j * s; t < j * s + s; t++)
                        dxp[(long)r * w + t] = v;
            }
    }
    return 0;
}

static void cpu_close(struct psk_backend *b)
{
    (void)b;
}

static const struct psk_ops cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .sync = cpu_sync,
    .gemm = cpu_gemm,
    .axpy = cpu_axpy,
    .scale = cpu_scale,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .bias_add = cpu_bias_add,
    .relu = cpu_relu,
    .relu_backward = cpu_relu_backward,
    .softmax_xent = cpu_softmax_xent,
    .col_sum = cpu_col_sum,
    .topk = cpu_topk,
    .topk_accum = cpu_topk_accum,
    .im2col = cpu_im2col,
    .col2im = cpu_col2im,
    .pool = cpu_pool,
    .pool_backward = cpu_pool_backward,
    .round = cpu_round,
    .count_nonfinite = cpu_count_nonfinite,
    .close = cpu_close,
};

int psk__cpu_open(struct psk_backend *b, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    b->ops = &cpu_ops;
    b->kind = PSK_CPU;
    psk__cpu_threads(b, 0);
    return 0;
}

void psk__cpu_threads(struct psk_backend *b, int n)
{
    if (n > 0)
        openblas_set_num_threads(n);
    snprintf(b->desc, sizeof b->desc, "cpu (OpenBLAS, %d threads)", openblas_get_num_threads());
}
