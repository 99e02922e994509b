/* Internal: extern "C" launchers implemented in psk_cuda_kernels.cu. The
 * stream is a cudaStream_t passed as void * so that no CUDA type leaks into
 * C code. Each returns 0 or the cudaError_t of the launch. */
#ifndef PSK_CUDA_KERNELS_H
#define PSK_CUDA_KERNELS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

int psk_cuda_launch_axpy(void *stream, size_t n, float a, const float *x, float *y);
int psk_cuda_launch_scale(void *stream, size_t n, float a, float *x);

#ifdef __cplusplus
}
#endif

#endif
