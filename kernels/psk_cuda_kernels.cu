// CUDA kernels of the compute backend. Only indexing and launch geometry
// live here; the arithmetic is psk_math.h, shared with the CPU backend.
// Exposes extern "C" launchers only (psk_cuda_kernels.h).
#include "psk_cuda_kernels.h"
#include "psk_math.h"

#include <cuda_runtime.h>

namespace {

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
