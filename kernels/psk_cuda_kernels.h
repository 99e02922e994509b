/* Internal: extern "C" launchers implemented in psk_cuda_kernels.cu. The
 * stream is a cudaStream_t passed as void * so that no CUDA type leaks into
 * C code. Each returns 0 or the cudaError_t of the launch. */
#ifndef PSK_CUDA_KERNELS_H
#define PSK_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int psk_cuda_launch_axpy(void *stream, size_t n, float a, const float *x, float *y);
int psk_cuda_launch_scale(void *stream, size_t n, float a, float *x);
int psk_cuda_launch_bias_add(void *stream, int rows, int cols, const float *bias, float *y);
int psk_cuda_launch_relu(void *stream, size_t n, const float *x, float *y);
int psk_cuda_launch_relu_backward(void *stream, size_t n, const float *y, float *dx);
int psk_cuda_launch_softmax_xent(void *stream, int rows, int cols, const float *logits,
                                 const int *labels, float scale, float *dlogits, float *row_loss,
                                 int *pred);
/* Top-k by magnitude (see psk_topk); idx and val are host arrays. */
int psk_cuda_topk(void *stream, size_t n, float *v, float *u, size_t k, uint64_t *idx, float *val);
/* p: enum psk_precision */
int psk_cuda_launch_round(void *stream, int p, size_t n, float *x);
/* *count (device memory) <- the NaNs and infinities among x[0..n). */
int psk_cuda_launch_count_nonfinite(void *stream, size_t n, const float *x,
                                    unsigned long long *count);
int psk_cuda_launch_col_sum(void *stream, int rows, int cols, const float *x, float *out);
int psk_cuda_launch_im2col(void *stream, int c, int h, int w, int k, int pad, const float *x,
                           float *col);
int psk_cuda_launch_col2im(void *stream, int c, int h, int w, int k, int pad, const float *dcol,
                           float *dx);
/* arg NULL: average pooling */
int psk_cuda_launch_pool(void *stream, int planes, int h, int w, int s, const float *x, float *y,
                         int *arg);
int psk_cuda_launch_pool_backward(void *stream, int planes, int h, int w, int s, const float *dy,
                                  const int *arg, float *dx);

#ifdef __cplusplus
}
#endif

#endif
