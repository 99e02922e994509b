/* Compute backends: one plain-C interface, a CPU implementation (OpenBLAS,
 * always built, the reference) and a CUDA one (cuBLAS + kernels).
 *
 * Pointers passed to compute calls are device pointers from psk_alloc (plain
 * host memory on the CPU backend). Matrices are row-major. Calls on one
 * backend are ordered; psk_sync waits for all of them. No CUDA type appears
 * here, and kernels never log: errors come back as PS_E* codes with a
 * sentence in psk_last_error(). A backend is used from one thread, with one
 * exception: the CPU backend's psk_gemm may run on several threads at once
 * (ps_pool.h shares the pieces of a product with a helper). */
#ifndef PSK_H
#define PSK_H

#include <stddef.h>
#include <stdint.h>

struct psk_backend;

enum psk_kind {
    PSK_CPU = 0,
    PSK_CUDA = 1,
};

/* Opens "auto", "cpu", "cuda" or "cuda:N". "auto" picks CUDA when a device
 * is usable and the CPU otherwise; err then holds why CUDA was not used
 * ("" when it was, or for "cpu"). On failure returns a PS_E* code, writes
 * why into err and sets *out to NULL. */
int psk_open(const char *spec, struct psk_backend **out, char *err, size_t errlen);
void psk_close(struct psk_backend *b);

enum psk_kind psk_kind_of(const struct psk_backend *b);
/* e.g. "cpu (OpenBLAS)" or "cuda:0 (NVIDIA H100 80GB HBM3)". */
const char *psk_describe(const struct psk_backend *b);
const char *psk_last_error(const struct psk_backend *b);
/* CPU backend: threads OpenBLAS uses for one call (1 when a helper thread
 * shares the pieces of each product instead); the description follows.
 * No-op on CUDA. */
void psk_set_blas_threads(struct psk_backend *b, int n);
/* 1 when this build includes the CUDA backend. */
int psk_cuda_built(void);

int psk_alloc(struct psk_backend *b, size_t bytes, void **ptr);
void psk_free(struct psk_backend *b, void *ptr);
int psk_upload(struct psk_backend *b, void *dst, const void *src, size_t bytes);
int psk_download(struct psk_backend *b, void *dst, const void *src, size_t bytes);
int psk_sync(struct psk_backend *b);
/* dst <- src, both device memory. */
int psk_copy(struct psk_backend *b, void *dst, const void *src, size_t bytes);

/* C = alpha op(A) op(B) + beta C; op(A) is m x k, op(B) k x n, C m x n. */
int psk_gemm(struct psk_backend *b, int trans_a, int trans_b, int m, int n, int k, float alpha,
             const float *a, int lda, const float *bm, int ldb, float beta, float *c, int ldc);
/* Host memory for fast copies: page-locked on CUDA, aligned on the CPU. */
int psk_host_alloc(struct psk_backend *b, size_t bytes, void **ptr);
void psk_host_free(struct psk_backend *b, void *ptr);

/* y[r][c] += bias[c] for a rows x cols row-major y. */
int psk_bias_add(struct psk_backend *b, int rows, int cols, const float *bias, float *y);
/* y = max(x, 0), elementwise (y may equal x). */
int psk_relu(struct psk_backend *b, size_t n, const float *x, float *y);
/* dx[i] = y[i] > 0 ? dx[i] : 0, given the forward output y. */
int psk_relu_backward(struct psk_backend *b, size_t n, const float *y, float *dx);
/* Fused softmax + cross-entropy over rows x cols logits with int labels:
 * dlogits = (softmax - onehot) * scale, row_loss[r] = -log p[label],
 * pred[r] = argmax. Labels outside [0, cols) give loss 0 and no gradient. */
int psk_softmax_xent(struct psk_backend *b, int rows, int cols, const float *logits,
                     const int *labels, float scale, float *dlogits, float *row_loss, int *pred);
/* out[c] = sum over r of x[r][c] (bias gradients). */
int psk_col_sum(struct psk_backend *b, int rows, int cols, const float *x, float *out);
/* Top-k by magnitude: picks the k (<= n) entries of v with the largest
 * |v|, writes their indices in increasing order to idx (host) and their
 * values to val (host), then sets them to 0 in v and, when u is not NULL,
 * in u. Ties at the threshold are taken in index order. */
int psk_topk(struct psk_backend *b, size_t n, float *v, float *u, size_t k, uint64_t *idx,
             float *val);
/* Error feedback, then psk_topk: v += g, or with u not NULL, u = mom u + g
 * (psk_scale, psk_axpy) and v += u; then the top k of v as psk_topk takes
 * them. The CPU backend makes the update in the selection's first pass. */
int psk_topk_accum(struct psk_backend *b, size_t n, const float *g, float mom, float *u, float *v,
                   size_t k, uint64_t *idx, float *val);
/* y <- a x + y. */
int psk_axpy(struct psk_backend *b, size_t n, float a, const float *x, float *y);
/* x <- a x. */
int psk_scale(struct psk_backend *b, size_t n, float a, float *x);

/* Mixed precision (psworker --precision). A model computing in 16 bits
 * rounds every tensor it makes (activations, gradients, a copy of its
 * weights) with psk_round, so that every GEMM input already is a 16-bit
 * value; psk_math.h has the rounding. */
enum psk_precision {
    PSK_PREC_F32 = 0,
    PSK_PREC_BF16 = 1,
    PSK_PREC_F16 = 2,
};
/* "f32", "bf16", "f16"; -1 for anything else. */
int psk_precision_parse(const char *s);
const char *psk_precision_name(int p);
/* GEMMs from now on get inputs rounded to p. CUDA then runs them on
 * tensor cores in p with f32 accumulation (cuBLAS's 32F_FAST_16BF or
 * 32F_FAST_16F compute), whose conversion of such inputs is exact; the
 * CPU runs f32 GEMM on them, which gives the same products. */
void psk_set_precision(struct psk_backend *b, int p);
/* x[i] <- x[i] rounded to precision p (PSK_PREC_F32: unchanged). */
int psk_round(struct psk_backend *b, int p, size_t n, float *x);
/* *count (host) <- how many of x[0..n) are NaN or infinite. */
int psk_count_nonfinite(struct psk_backend *b, size_t n, const float *x, uint64_t *count);

/* Convolution and pooling, NCHW. A convolution has c_out filters of
 * c_in x k x k (OIHW, PyTorch's layout), stride 1 and zero padding pad:
 * its output is n x c_out x ho x wo with ho = h + 2 pad - k + 1 (and wo
 * likewise). It runs as GEMMs over each image's column matrix
 * (psk_math.h has the indexing). */
struct psk_conv {
    int n, c_in, h, w;
    int c_out, k, pad;
};
/* Output rows (or columns) of a convolution of size with k and pad. */
static inline int psk_conv_out(int size, int k, int pad)
{
    return size + 2 * pad - k + 1;
}
/* col (c k k x ho wo) of one c x h x w image x. */
int psk_im2col(struct psk_backend *b, int c, int h, int w, int k, int pad, const float *x,
               float *col);
/* dx (c x h x w, overwritten) of one image from its column gradient. */
int psk_col2im(struct psk_backend *b, int c, int h, int w, int k, int pad, const float *dcol,
               float *dx);
/* s x s pooling, stride s, over planes planes of h x w (n x c of them):
 * y is planes x (h/s) x (w/s). Max pooling keeps each output's index in
 * its plane in arg (planes x (h/s) x (w/s) ints) for the backward pass;
 * psk_pool_backward takes arg NULL for average pooling. dx is
 * overwritten (0 past the last whole window). */
int psk_maxpool(struct psk_backend *b, int planes, int h, int w, int s, const float *x, float *y,
                int *arg);
int psk_avgpool(struct psk_backend *b, int planes, int h, int w, int s, const float *x, float *y);
int psk_pool_backward(struct psk_backend *b, int planes, int h, int w, int s, const float *dy,
                      const int *arg, float *dx);
/* Workspace of a convolution (floats): a column matrix and a row of ones;
 * psk_conv_ws_init fills the ones. */
size_t psk_conv_ws_floats(const struct psk_conv *g);
int psk_conv_ws_init(struct psk_backend *b, const struct psk_conv *g, float *ws);
/* y = conv(x, wt) + bias per output channel. */
int psk_conv_forward(struct psk_backend *b, const struct psk_conv *g, const float *x,
                     const float *wt, const float *bias, float *y, float *ws);
/* From dy (n x c_out x ho x wo): the weight and bias gradients gw, gb
 * (overwritten, summed over the images) and, when dx is not NULL, the
 * input gradient. */
int psk_conv_backward(struct psk_backend *b, const struct psk_conv *g, const float *x,
                      const float *wt, const float *dy, float *gw, float *gb, float *dx, float *ws);

#endif
