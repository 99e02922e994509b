/* Per-element math shared by the CPU backend, the CUDA kernels and the
 * server's optimizers.
 *
 * Both gcc and nvcc compile this header (PSK_HD expands to __host__
 * __device__ under nvcc), so the unit tests on the CPU exercise the exact
 * arithmetic the GPU runs; only indexing and launch geometry are GPU-only.
 * Pure functions of their arguments: no memory, no globals, no logging.
 * Includes no CUDA header, so any part of the tree may include it. */
#ifndef PSK_MATH_H
#define PSK_MATH_H

#ifdef __CUDACC__
#define PSK_HD __host__ __device__ __forceinline__
#else
#include <math.h>
#define PSK_HD static inline
#endif

#include <stdint.h>
#include <string.h>

/* Mixed precision: a float rounded to the nearest value a 16-bit float
 * holds, ties to even, as PyTorch's casts round; kept as a float, so f32
 * arithmetic on such values is exact where a 16-bit unit's products with
 * f32 accumulation are (8 x 8 and 11 x 11 significant bits fit in 24).
 * NaN stays NaN. bfloat16 has f32's exponent: only the significand is cut
 * to 8 bits (the largest floats round to infinity). */
PSK_HD float psk_round_bf16(float x)
{
    uint32_t u, r;
    memcpy(&u, &x, sizeof u);
    r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    r = (u & 0x7f800000u) == 0x7f800000u ? u : r; /* infinity or NaN as it is */
    memcpy(&x, &r, sizeof r);
    return x;
}

/* IEEE half: 11 significant bits, 5 exponent bits. From 65520 up (the
 * midpoint past 65504, which rounds to even, upwards) the result is
 * infinite, as an overflowing f16 GEMM's is; below 2^-14 the subnormals'
 * spacing of 2^-24 applies, and what is smaller than 2^-25 becomes 0.
 * Selects rather than branches, so that the CPU's loop vectorises. */
PSK_HD float psk_round_f16(float x)
{
    uint32_t u, a, s, sub_u, r;
    memcpy(&u, &x, sizeof u);
    s = u & 0x80000000u;
    a = u ^ s; /* |x| */
    float fa, sub;
    memcpy(&fa, &a, sizeof a);
    /* a multiple of 2^-24, ties to even: adding and taking 2^23 away rounds
     * y = |x| 2^24 (below 2^10 where it is used) to an integer, as rintf
     * would, without a call */
    sub = ((fa * 16777216.0f + 8388608.0f) - 8388608.0f) * 5.9604644775390625e-08f;
    memcpy(&sub_u, &sub, sizeof sub);
    r = (a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u; /* 10 fraction bits, to even */
    /* masks, not branches: below 2^-14, below 65520, not NaN */
    uint32_t m_sub = 0u - (uint32_t)(a < 0x38800000u), m_fin = 0u - (uint32_t)(a < 0x477ff000u);
    uint32_t m_num = 0u - (uint32_t)(a <= 0x7f800000u);
    uint32_t big = (0x7f800000u & m_num) | (a & ~m_num); /* overflow: infinity; NaN stays */
    r = (sub_u & m_sub) | (r & ~m_sub & m_fin) | (big & ~m_fin);
    r |= s;
    memcpy(&x, &r, sizeof r);
    return x;
}

/* p: enum psk_precision (psk.h). */
PSK_HD float psk_round16(int p, float x)
{
    return p == 1 ? psk_round_bf16(x) : p == 2 ? psk_round_f16(x) : x;
}

PSK_HD int psk_nonfinite(float x)
{
    return !(fabsf(x) <= 3.402823466e+38f);
}

PSK_HD float psk_axpy1(float a, float x, float y)
{
    return a * x + y;
}

PSK_HD float psk_el_relu(float x)
{
    return x > 0.0f ? x : 0.0f;
}

/* d relu / dx given the forward input (0 at x == 0, like PyTorch). */
PSK_HD float psk_el_relu_grad(float x, float dy)
{
    return x > 0.0f ? dy : 0.0f;
}

/* Softmax / cross-entropy, one row at a time, in three steps that the CPU
 * loop and the CUDA kernel both call: the row maximum m (for stability),
 * the sum of exp(x - m), then per element the probability and gradient. */
PSK_HD float psk_exp_shifted(float x, float m)
{
    return expf(x - m);
}

/* -log softmax(x)[label] = log(sum) + m - x[label]. */
PSK_HD float psk_xent_loss(float sum, float m, float x_label)
{
    return logf(sum) + m - x_label;
}

/* d loss / d x = (softmax - onehot) * scale (scale = 1/batch for a mean). */
PSK_HD float psk_xent_grad(float e, float sum, int is_label, float scale)
{
    return (e / sum - (is_label ? 1.0f : 0.0f)) * scale;
}

/* Gradient with L2 weight decay folded in (PyTorch's weight_decay). */
PSK_HD float psk_decay(float g, float w, float weight_decay)
{
    return g + weight_decay * w;
}

/* SGD: w <- w - lr * g. */
PSK_HD float psk_sgd(float w, float g, float lr)
{
    return w - lr * g;
}

/* Momentum (PyTorch convention): v <- mu v + g; w <- w - lr v, or with
 * Nesterov w <- w - lr (g + mu v). Updates *v, returns the new w. */
PSK_HD float psk_momentum(float w, float g, float *v, float lr, float mu, int nesterov)
{
    float nv = mu * *v + g;
    *v = nv;
    return w - lr * (nesterov ? g + mu * nv : nv);
}

/* Adagrad: h <- h + g^2; w <- w - lr g / (sqrt(h) + eps). */
PSK_HD float psk_adagrad(float w, float g, float *h, float lr, float eps)
{
    float nh = *h + g * g;
    *h = nh;
    return w - lr * g / (sqrtf(nh) + eps);
}

/* Adam with bias correction; bc1 = 1 - beta1^t, bc2 = 1 - beta2^t for step
 * t >= 1 (computed once per apply by the caller, not per element). */
PSK_HD float psk_adam(float w, float g, float *m, float *v, float lr, float beta1, float beta2,
                      float eps, float bc1, float bc2)
{
    float nm = beta1 * *m + (1.0f - beta1) * g;
    float nv = beta2 * *v + (1.0f - beta2) * g * g;
    *m = nm;
    *v = nv;
    float mhat = nm / bc1;
    float vhat = nv / bc2;
    return w - lr * mhat / (sqrtf(vhat) + eps);
}

/* FTRL-proximal (McMahan et al. 2013), per coordinate; z and n are its
 * state. alpha = lr, beta smooths the per-coordinate rate; l1 makes
 * weights exactly 0 while |z| <= l1. Returns the new weight. */
PSK_HD float psk_ftrl(float w, float g, float *z, float *n, float alpha, float beta, float l1,
                      float l2)
{
    float nn = *n + g * g;
    float sigma = (sqrtf(nn) - sqrtf(*n)) / alpha;
    float nz = *z + g - sigma * w;
    *z = nz;
    *n = nn;
    if (fabsf(nz) <= l1)
        return 0.0f;
    float sgn = nz < 0.0f ? -1.0f : 1.0f;
    return -(nz - sgn * l1) / ((beta + sqrtf(nn)) / alpha + l2);
}

/* One row of fused softmax + cross-entropy over cols logits x: writes the
 * gradient d (softmax - onehot, times scale), returns the loss in *loss and
 * the argmax in *pred. A label outside [0, cols) gives loss 0 and no
 * gradient. The CPU backend loops over rows with it and the CUDA kernel
 * runs it one row per thread: the same code on both. */
PSK_HD void psk_softmax_xent_row(const float *x, int cols, int label, float scale, float *d,
                                 float *loss, int *pred)
{
    int arg = 0;
    float m = x[0];
    for (int c = 1; c < cols; c++)
        if (x[c] > m) {
            m = x[c];
            arg = c;
        }
    float sum = 0.0f;
    for (int c = 0; c < cols; c++)
        sum += psk_exp_shifted(x[c], m);
    int valid = label >= 0 && label < cols;
    for (int c = 0; c < cols; c++)
        d[c] = valid ? psk_xent_grad(psk_exp_shifted(x[c], m), sum, c == label, scale) : 0.0f;
    *loss = valid ? psk_xent_loss(sum, m, x[label]) : 0.0f;
    *pred = arg;
}

/* Convolution as GEMM (stride 1, zero padding pad, a k x k kernel) over one
 * image of c channels, h x w, NCHW. Its column matrix has a row per
 * (channel, kernel row, kernel column), r = (ci * k + kh) * k + kw, and a
 * column per output position, p = oh * wo + ow; element (r, p) is the
 * input the kernel tap r sees at p, 0 in the padding. */
PSK_HD float psk_im2col_el(const float *x, int h, int w, int k, int pad, int wo, int r, int p)
{
    int kw = r % k, kh = (r / k) % k, ci = r / (k * k);
    int ih = p / wo + kh - pad, iw = p % wo + kw - pad;
    return ih >= 0 && ih < h && iw >= 0 && iw < w ? x[((long)ci * h + ih) * w + iw] : 0.0f;
}

/* The reverse, as a gather: input element (ci, ih, iw)'s gradient is the
 * sum of the column gradients of every tap that read it, taken in
 * (kh, kw) order, so the CPU and the GPU add in the same order. */
PSK_HD float psk_col2im_el(const float *dcol, int k, int pad, int ho, int wo, int ci, int ih,
                           int iw)
{
    float s = 0.0f;
    long hw = (long)ho * wo;
    for (int kh = 0; kh < k; kh++) {
        int oh = ih - kh + pad;
        if (oh < 0 || oh >= ho)
            continue;
        for (int kw = 0; kw < k; kw++) {
            int ow = iw - kw + pad;
            if (ow < 0 || ow >= wo)
                continue;
            s += dcol[((long)(ci * k + kh) * k + kw) * hw + (long)oh * wo + ow];
        }
    }
    return s;
}

/* s x s pooling with stride s over one channel plane of width w (windows
 * that do not fit are dropped, as PyTorch's default floor mode does).
 * Max: the window's largest value (a NaN wins, as in PyTorch), its index
 * in the plane in *arg, the first one on ties. */
PSK_HD float psk_maxpool_el(const float *x, int w, int s, int oh, int ow, int *arg)
{
    int i0 = oh * s, j0 = ow * s;
    float m = x[(long)i0 * w + j0];
    int at = i0 * w + j0;
    for (int i = i0; i < i0 + s; i++)
        for (int j = j0; j < j0 + s; j++) {
            float v = x[(long)i * w + j];
            if (v > m || (v != v && m == m)) {
                m = v;
                at = i * w + j;
            }
        }
    *arg = at;
    return m;
}

PSK_HD float psk_avgpool_el(const float *x, int w, int s, int oh, int ow)
{
    float sum = 0.0f;
    for (int i = oh * s; i < oh * s + s; i++)
        for (int j = ow * s; j < ow * s + s; j++)
            sum += x[(long)i * w + j];
    return sum / (float)(s * s);
}

/* Pooling's input gradient at (ih, iw) of a plane of width w: the windows
 * do not overlap, so one output (or none, past the last whole window)
 * feeds it. arg NULL: average pooling. */
PSK_HD float psk_pool_grad_el(const float *dy, const int *arg, int w, int s, int ho, int wo, int ih,
                              int iw)
{
    int oh = ih / s, ow = iw / s;
    if (oh >= ho || ow >= wo)
        return 0.0f;
    long o = (long)oh * wo + ow;
    if (arg == NULL)
        return dy[o] / (float)(s * s);
    return arg[o] == ih * w + iw ? dy[o] : 0.0f;
}

#endif
