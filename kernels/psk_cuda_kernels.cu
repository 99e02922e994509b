// CUDA kernels of the compute backend. Only indexing and launch geometry
// live here; the arithmetic is psk_math.h, shared with the CPU backend.
// Exposes extern "C" launchers only (psk_cuda_kernels.h).
#include "psk_cuda_kernels.h"
#include "psk_math.h"

#include <cuda_runtime.h>
#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/sort.h>

namespace
{

constexpr unsigned kBlock = 256;
constexpr size_t kGridMax = 65535;

unsigned grid_for(size_t n)
{
    size_t blocks = (n + kBlock - 1) / kBlock;
    return (unsigned)(blocks < kGridMax ? blocks : kGridMax);
}

__global__ void axpy_kernel(size_t n, float a, const float *__restrict__ x, float *__restrict__ y)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = psk_axpy1(a, x[i], y[i]);
}

__global__ void scale_kernel(size_t n, float a, float *__restrict__ x)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= a;
}

#define PSK_GRID_STRIDE(i, n)                                                                      \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

__global__ void bias_add_kernel(size_t n, int cols, const float *__restrict__ bias,
                                float *__restrict__ y)
{
    PSK_GRID_STRIDE(i, n)
    y[i] += bias[i % (size_t)cols];
}

__global__ void relu_kernel(size_t n, const float *x, float *y)
{
    PSK_GRID_STRIDE(i, n)
    y[i] = psk_el_relu(x[i]);
}

__global__ void relu_backward_kernel(size_t n, const float *__restrict__ y, float *__restrict__ dx)
{
    PSK_GRID_STRIDE(i, n)
    dx[i] = psk_el_relu_grad(y[i], dx[i]);
}

// One thread per row: the class count is small (10 for Fashion-MNIST), and
// the row routine is psk_math.h's, the very one the CPU backend runs.
__global__ void softmax_xent_kernel(int rows, int cols, const float *__restrict__ logits,
                                    const int *__restrict__ labels, float scale,
                                    float *__restrict__ dlogits, float *__restrict__ row_loss,
                                    int *__restrict__ pred)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows)
        return;
    psk_softmax_xent_row(logits + (size_t)r * cols, cols, labels[r], scale,
                         dlogits + (size_t)r * cols, &row_loss[r], &pred[r]);
}

__global__ void round_kernel(int p, size_t n, float *x)
{
    PSK_GRID_STRIDE(i, n)
    x[i] = psk_round16(p, x[i]);
}

__global__ void nonfinite_kernel(size_t n, const float *__restrict__ x,
                                 unsigned long long *__restrict__ count)
{
    unsigned long long c = 0;
    PSK_GRID_STRIDE(i, n)
    c += (unsigned long long)psk_nonfinite(x[i]);
    if (c != 0)
        atomicAdd(count, c);
}

// One thread per column; neighbouring threads read neighbouring addresses.
// Rows are summed in order, like the CPU loop, so results match closely.
__global__ void col_sum_kernel(int rows, int cols, const float *__restrict__ x,
                               float *__restrict__ out)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols)
        return;
    float s = 0.0f;
    for (int r = 0; r < rows; r++)
        s += x[(size_t)r * cols + c];
    out[c] = s;
}

__global__ void neg_abs_kernel(size_t n, const float *__restrict__ v, float *__restrict__ key,
                               uint32_t *__restrict__ idx)
{
    PSK_GRID_STRIDE(i, n)
    {
        key[i] = -fabsf(v[i]); // ascending sort puts the largest magnitudes first
        idx[i] = (uint32_t)i;
    }
}

__global__ void take_kernel(size_t k, const uint32_t *__restrict__ idx, float *__restrict__ v,
                            float *__restrict__ u, float *__restrict__ val,
                            unsigned long long *__restrict__ idx64)
{
    PSK_GRID_STRIDE(j, k)
    {
        uint32_t i = idx[j];
        val[j] = v[i];
        idx64[j] = i;
        v[i] = 0.0f;
        if (u != nullptr)
            u[i] = 0.0f;
    }
}

__global__ void im2col_kernel(int h, int w, int k, int pad, int wo, size_t hw, size_t n,
                              const float *__restrict__ x, float *__restrict__ col)
{
    PSK_GRID_STRIDE(i, n)
    col[i] = psk_im2col_el(x, h, w, k, pad, wo, (int)(i / hw), (int)(i % hw));
}

__global__ void col2im_kernel(int h, int w, int k, int pad, int ho, int wo, size_t n,
                              const float *__restrict__ dcol, float *__restrict__ dx)
{
    PSK_GRID_STRIDE(i, n)
    {
        int j = (int)(i % w), r = (int)(i / w);
        dx[i] = psk_col2im_el(dcol, k, pad, ho, wo, r / h, r % h, j);
    }
}

__global__ void pool_kernel(int h, int w, int s, int ho, int wo, size_t n,
                            const float *__restrict__ x, float *__restrict__ y, int *arg)
{
    PSK_GRID_STRIDE(o, n)
    {
        int j = (int)(o % wo), i = (int)((o / wo) % ho);
        const float *xp = x + (o / ((size_t)ho * wo)) * (size_t)h * w;
        y[o] = arg != nullptr ? psk_maxpool_el(xp, w, s, i, j, &arg[o])
                              : psk_avgpool_el(xp, w, s, i, j);
    }
}

__global__ void pool_backward_kernel(int h, int w, int s, int ho, int wo, size_t n,
                                     const float *__restrict__ dy, const int *arg,
                                     float *__restrict__ dx)
{
    PSK_GRID_STRIDE(i, n)
    {
        int j = (int)(i % w), r = (int)((i / w) % h);
        size_t q = i / ((size_t)h * w), plane = q * (size_t)ho * wo;
        dx[i] = psk_pool_grad_el(dy + plane, arg != nullptr ? arg + plane : nullptr, w, s, ho, wo,
                                 r, j);
    }
}

} // namespace

extern "C" int psk_cuda_launch_axpy(void *stream, size_t n, float a, const float *x, float *y)
{
    if (n == 0)
        return 0;
    axpy_kernel<<<grid_for(n), kBlock, 0, (cudaStream_t)stream>>>(n, a, x, y);
    return (int)cudaGetLastError();
}

extern "C" int psk_cuda_launch_scale(void *stream, size_t n, float a, float *x)
{
    if (n == 0)
        return 0;
    scale_kernel<<<grid_for(n), kBlock, 0, (cudaStream_t)stream>>>(n, a, x);
    return (int)cudaGetLastError();
}

extern "C" int psk_cuda_launch_bias_add(void *stream, int rows, int cols, const float *bias,
                                        float *y)
{
    size_t n = (size_t)rows * cols;
    if (n == 0)
        return 0;
    bias_add_kernel<<<grid_for(n), kBlock, 0, (cudaStream_t)stream>>>(n, cols, bias, y);
    return (int)cudaGetLastError();
}

extern "C" int psk_cuda_launch_relu(void *stream, size_t n, const float *x, float *y)
{
    if (n == 0)
        return 0;
    relu_kernel<<<grid_for(n), kBlock, 0, (cudaStream_t)stream>>>(n, x, y);
    return (int)cudaGetLastError();
}

extern "C" int psk_cuda_launch_relu_backward(void *stream, size_t n, const float *y, float *dx)
{
    if (n == 0)
        return 0;
    relu_backward_kernel<<<grid_for(n), kBlock, 0, (cudaStream_t)stream>>>(n, y, dx);
    return (int)cudaGetLastError();
}

extern "C" int psk_cuda_launch_softmax_xent(void *stream, int rows, int cols, const float *logits,
                                            const int *labels, float scale, float *dlogits,
                                            float *row_loss, int *pred)
{
    if (rows <= 0)
        return 0;
    unsigned blocks = (unsigned)((rows + kBlock - 1) / kBlock);
    softmax_xent_kernel<<<blocks, kBlock, 0, (cudaStream_t)stream>>>(
        rows, cols, logits, labels, scale, dlogits, row_loss, pred);
    return (int)cudaGetLastError();
}

extern "C" int psk_cuda_launch_round(void *stream, int p, size_t n, float *x)
{
    if (n == 0)
        return 0;
    round_kernel<<<grid_for(n), kBlock, 0, (cudaStream_t)stream>>>(p, n, x);
    return (int)cudaGetLastError();
}

extern "C" int psk_cuda_launch_count_nonfinite(void *stream, size_t n, const float *x,
                                               unsigned long long *count)
{
    cudaError_t e = cudaMemsetAsync(count, 0, sizeof *count, (cudaStream_t)stream);
    if (e != cudaSuccess || n == 0)
        return (int)e;
    nonfinite_kernel<<<grid_for(n), kBlock, 0, (cudaStream_t)stream>>>(n, x, count);
    return (int)cudaGetLastError();
}

extern "C" int psk_cuda_launch_col_sum(void *stream, int rows, int cols, const float *x, float *out)
{
    if (cols <= 0)
        return 0;
    unsigned blocks = (unsigned)((cols + kBlock - 1) / kBlock);
    col_sum_kernel<<<blocks, kBlock, 0, (cudaStream_t)stream>>>(rows, cols, x, out);
    return (int)cudaGetLastError();
}

// Sort-based selection (thrust): exact, O(n log n) on the device. Ties at
// the threshold are broken by the stable sort, i.e. in index order.
extern "C" int psk_cuda_topk(void *stream, size_t n, float *v, float *u, size_t k, uint64_t *idx,
                             float *val)
{
    if (k == 0)
        return 0;
    if (n > 0xffffffffu)
        return (int)cudaErrorInvalidValue;
    cudaStream_t s = (cudaStream_t)stream;
    float *key = nullptr, *dval = nullptr;
    uint32_t *ord = nullptr;
    unsigned long long *d64 = nullptr;
    cudaError_t e = cudaMallocAsync(&key, n * sizeof(float), s);
    if (e == cudaSuccess)
        e = cudaMallocAsync(&ord, n * sizeof(uint32_t), s);
    if (e == cudaSuccess)
        e = cudaMallocAsync(&dval, k * sizeof(float), s);
    if (e == cudaSuccess)
        e = cudaMallocAsync(&d64, k * sizeof(unsigned long long), s);
    if (e == cudaSuccess) {
        neg_abs_kernel<<<grid_for(n), kBlock, 0, s>>>(n, v, key, ord);
        thrust::stable_sort_by_key(thrust::cuda::par.on(s), key, key + n, ord);
        thrust::sort(thrust::cuda::par.on(s), ord, ord + k);
        take_kernel<<<grid_for(k), kBlock, 0, s>>>(k, ord, v, u, dval, d64);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(val, dval, k * sizeof(float), cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(idx, d64, k * sizeof(uint64_t), cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    cudaFreeAsync(key, s);
    cudaFreeAsync(ord, s);
    cudaFreeAsync(dval, s);
    cudaFreeAsync(d64, s);
    return (int)e;
}

extern "C" int psk_cuda_launch_im2col(void *stream, int c, int h, int w, int k, int pad,
                                      const float *x, float *col)
{
    int ho = h + 2 * pad - k + 1, wo = w + 2 * pad - k + 1;
    size_t hw = (size_t)ho * wo, n = (size_t)c * k * k * hw;
    im2col_kernel<<<grid_for(n), kBlock, 0, (cudaStream_t)stream>>>(h, w, k, pad, wo, hw, n, x,
                                                                    col);
    return (int)cudaGetLastError();
}

extern "C" int psk_cuda_launch_col2im(void *stream, int c, int h, int w, int k, int pad,
                                      const float *dcol, float *dx)
{
    int ho = h + 2 * pad - k + 1, wo = w + 2 * pad - k + 1;
    size_t n = (size_t)c * h * w;
    col2im_kernel<<<grid_for(n), kBlock, 0, (cudaStream_t)stream>>>(h, w, k, pad, ho, wo, n, dcol,
                                                                    dx);
    return (int)cudaGetLastError();
}

extern "C" int psk_cuda_launch_pool(void *stream, int planes, int h, int w, int s, const float *x,
                                    float *y, int *arg)
{
    int ho = h / s, wo = w / s;
    size_t n = (size_t)planes * ho * wo;
    pool_kernel<<<grid_for(n), kBlock, 0, (cudaStream_t)stream>>>(h, w, s, ho, wo, n, x, y, arg);
    return (int)cudaGetLastError();
}

extern "C" int psk_cuda_launch_pool_backward(void *stream, int planes, int h, int w, int s,
                                             const float *dy, const int *arg, float *dx)
{
    int ho = h / s, wo = w / s;
    size_t n = (size_t)planes * h * w;
    pool_backward_kernel<<<grid_for(n), kBlock, 0, (cudaStream_t)stream>>>(h, w, s, ho, wo, n, dy,
                                                                           arg, dx);
    return (int)cudaGetLastError();
}
