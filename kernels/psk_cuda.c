/* CUDA backend, host side: device selection, memory, cuBLAS GEMM, and the
 * kernel launchers. CUDA and cuBLAS errors are translated here, once, into
 * PS_EDEVICE with the library's own text in psk_last_error(). */
#include "psk_impl.h"

#include "psk_cuda_kernels.h"

#include "ps_err.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

struct cuda_state {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    unsigned long long *count; /* count_nonfinite's result */
};

static struct cuda_state *state(struct psk_backend *b)
{
    return b->impl;
}

static int cuda_check(struct psk_backend *b, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    psk__set_error(b, "%s: %s", what, cudaGetErrorString(e));
    return PS_EDEVICE;
}

static int blas_check(struct psk_backend *b, cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 0;
    psk__set_error(b, "%s: cuBLAS status %d", what, (int)s);
    return PS_EDEVICE;
}

static int cu_alloc(struct psk_backend *b, size_t bytes, void **ptr)
{
    return cuda_check(b, cudaMalloc(ptr, bytes == 0 ? 4 : bytes), "cudaMalloc");
}

static void cu_free(struct psk_backend *b, void *ptr)
{
    (void)b;
    cudaFree(ptr);
}

static int cu_upload(struct psk_backend *b, void *dst, const void *src, size_t bytes)
{
    return cuda_check(b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, state(b)->stream),
                      "upload");
}

static int cu_download(struct psk_backend *b, void *dst, const void *src, size_t bytes)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, state(b)->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(state(b)->stream);
    return cuda_check(b, e, "download");
}

static int cu_copy(struct psk_backend *b, void *dst, const void *src, size_t bytes)
{
    return cuda_check(
        b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, state(b)->stream), "copy");
}

static int cu_sync(struct psk_backend *b)
{
    return cuda_check(b, cudaStreamSynchronize(state(b)->stream), "sync");
}

static int cu_gemm(struct psk_backend *b, int ta, int tb, int m, int n, int k, float alpha,
                   const float *a, int lda, const float *bm, int ldb, float beta, float *c, int ldc)
{
    /* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T. */
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (b->precision == PSK_PREC_F32)
        return blas_check(
            b, cublasSgemm(state(b)->blas, ob, oa, n, m, k, &alpha, bm, ldb, a, lda, &beta, c, ldc),
            "cublasSgemm");
    /* f32 in and out, 16-bit tensor-core products, f32 accumulation */
    cublasComputeType_t ct =
        b->precision == PSK_PREC_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_FAST_16F;
    return blas_check(b,
                      cublasGemmEx(state(b)->blas, ob, oa, n, m, k, &alpha, bm, CUDA_R_32F, ldb, a,
                                   CUDA_R_32F, lda, &beta, c, CUDA_R_32F, ldc, ct,
                                   CUBLAS_GEMM_DEFAULT),
                      "cublasGemmEx");
}

static int cu_axpy(struct psk_backend *b, size_t n, float a, const float *x, float *y)
{
    return cuda_check(b, (cudaError_t)psk_cuda_launch_axpy(state(b)->stream, n, a, x, y), "axpy");
}

static int cu_scale(struct psk_backend *b, size_t n, float a, float *x)
{
    return cuda_check(b, (cudaError_t)psk_cuda_launch_scale(state(b)->stream, n, a, x), "scale");
}

static int cu_host_alloc(struct psk_backend *b, size_t bytes, void **ptr)
{
    return cuda_check(b, cudaMallocHost(ptr, bytes == 0 ? 4 : bytes), "cudaMallocHost");
}

static void cu_host_free(struct psk_backend *b, void *ptr)
{
    (void)b;
    cudaFreeHost(ptr);
}

static int cu_bias_add(struct psk_backend *b, int rows, int cols, const float *bias, float *y)
{
    return cuda_check(b,
                      (cudaError_t)psk_cuda_launch_bias_add(state(b)->stream, rows, cols, bias, y),
                      "bias_add");
}

static int cu_im2col(struct psk_backend *b, int c, int h, int w, int k, int pad, const float *x,
                     float *col)
{
    return cuda_check(
        b, (cudaError_t)psk_cuda_launch_im2col(state(b)->stream, c, h, w, k, pad, x, col),
        "im2col");
}

static int cu_col2im(struct psk_backend *b, int c, int h, int w, int k, int pad, const float *dcol,
                     float *dx)
{
    return cuda_check(
        b, (cudaError_t)psk_cuda_launch_col2im(state(b)->stream, c, h, w, k, pad, dcol, dx),
        "col2im");
}

static int cu_pool(struct psk_backend *b, int planes, int h, int w, int s, const float *x, float *y,
                   int *arg)
{
    return cuda_check(
        b, (cudaError_t)psk_cuda_launch_pool(state(b)->stream, planes, h, w, s, x, y, arg), "pool");
}

static int cu_pool_backward(struct psk_backend *b, int planes, int h, int w, int s, const float *dy,
                            const int *arg, float *dx)
{
    return cuda_check(
        b,
        (cudaError_t)psk_cuda_launch_pool_backward(state(b)->stream, planes, h, w, s, dy, arg, dx),
        "pool_backward");
}

static int cu_relu(struct psk_backend *b, size_t n, const float *x, float *y)
{
    return cuda_check(b, (cudaError_t)psk_cuda_launch_relu(state(b)->stream, n, x, y), "relu");
}

static int cu_relu_backward(struct psk_backend *b, size_t n, const float *y, float *dx)
{
    return cuda_check(b, (cudaError_t)psk_cuda_launch_relu_backward(state(b)->stream, n, y, dx),
                      "relu_backward");
}

static int cu_softmax_xent(struct psk_backend *b, int rows, int cols, const float *logits,
                           const int *labels, float scale, float *dlogits, float *row_loss,
                           int *pred)
{
    return cuda_check(b,
                      (cudaError_t)psk_cuda_launch_softmax_xent(state(b)->stream, rows, cols,
                                                                logits, labels, scale, dlogits,
                                                                row_loss, pred),
                      "softmax_xent");
}

static int cu_col_sum(struct psk_backend *b, int rows, int cols, const float *x, float *out)
{
    return cuda_check(b, (cudaError_t)psk_cuda_launch_col_sum(state(b)->stream, rows, cols, x, out),
                      "col_sum");
}

static int cu_topk(struct psk_backend *b, size_t n, float *v, float *u, size_t k, uint64_t *idx,
                   float *val)
{
    return cuda_check(b, (cudaError_t)psk_cuda_topk(state(b)->stream, n, v, u, k, idx, val),
                      "topk");
}

static int cu_round(struct psk_backend *b, int p, size_t n, float *x)
{
    return cuda_check(b, (cudaError_t)psk_cuda_launch_round(state(b)->stream, p, n, x), "round");
}

static int cu_count_nonfinite(struct psk_backend *b, size_t n, const float *x, uint64_t *count)
{
    struct cuda_state *s = state(b);
    unsigned long long h = 0;
    int rc = cuda_check(b, (cudaError_t)psk_cuda_launch_count_nonfinite(s->stream, n, x, s->count),
                        "count_nonfinite");
    if (rc == 0)
        rc = cu_download(b, &h, s->count, sizeof h);
    *count = (uint64_t)h;
    return rc;
}

static void cu_close(struct psk_backend *b)
{
    struct cuda_state *s = state(b);
    if (s == NULL)
        return;
    if (s->blas != NULL)
        cublasDestroy(s->blas);
    if (s->count != NULL)
        cudaFree(s->count);
    if (s->stream != NULL)
        cudaStreamDestroy(s->stream);
    free(s);
    b->impl = NULL;
}

static const struct psk_ops cuda_ops = {
    .alloc = cu_alloc,
    .free = cu_free,
    .upload = cu_upload,
    .download = cu_download,
    .copy = cu_copy,
    .sync = cu_sync,
    .gemm = cu_gemm,
    .axpy = cu_axpy,
    .scale = cu_scale,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .bias_add = cu_bias_add,
    .relu = cu_relu,
    .im2col = cu_im2col,
    .col2im = cu_col2im,
    .pool = cu_pool,
    .pool_backward = cu_pool_backward,
    .relu_backward = cu_relu_backward,
    .softmax_xent = cu_softmax_xent,
    .col_sum = cu_col_sum,
    .topk = cu_topk,
    .round = cu_round,
    .count_nonfinite = cu_count_nonfinite,
    .close = cu_close,
};

int psk_cuda_built(void)
{
    return 1;
}

int psk__cuda_open(struct psk_backend *b, int device, char *err, size_t errlen)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
        (e == cudaSuccess && count == 0)) {
        /* no GPU, or no NVIDIA driver loaded: the runtime then speaks of the
         * driver's version, which misleads */
        snprintf(err, errlen,
                 "no CUDA device on this machine (no NVIDIA GPU or driver; the CUDA "
                 "runtime says: %s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return PS_ENODEV;
    }
    if (e != cudaSuccess) {
        snprintf(err, errlen, "CUDA cannot list its devices: %s", cudaGetErrorString(e));
        return PS_ENODEV;
    }
    int dev = device < 0 ? 0 : device;
    if (dev >= count) {
        snprintf(err, errlen, "cuda:%d requested but only %d device(s)", dev, count);
        return PS_ENODEV;
    }
    struct cuda_state *s = calloc(1, sizeof *s);
    if (s == NULL)
        return PS_ENOMEM;
    s->device = dev;
    b->impl = s;
    b->ops = &cuda_ops;
    b->kind = PSK_CUDA;
    struct cudaDeviceProp prop;
    if (cudaSetDevice(dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess ||
        cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cublasCreate(&s->blas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(s->blas, s->stream) != CUBLAS_STATUS_SUCCESS ||
        cudaMalloc((void **)&s->count, sizeof *s->count) != cudaSuccess) {
        snprintf(err, errlen, "cuda:%d: cannot initialise device, stream or cuBLAS", dev);
        cu_close(b);
        return PS_EDEVICE;
    }
    snprintf(b->desc, sizeof b->desc, "cuda:%d (%.96s, sm_%d%d)", dev, prop.name, prop.major,
             prop.minor);
    return 0;
}
