/* Convolution and pooling (psk.h): argument checks, and the convolution
 * as GEMMs over each image's column matrix on any backend. */
#include "psk_impl.h"

#include "ps_err.h"

#include <stdlib.h>

#define DIM_MAX 65536 /* any one size; products stay far below INT_MAX per image */

static int pool_ok(int planes, int h, int w, int s)
{
    return planes >= 0 && h > 0 && w > 0 && s > 0 && s <= h && s <= w && h <= DIM_MAX &&
           w <= DIM_MAX;
}

static int conv_ok(int c, int h, int w, int k, int pad)
{
    return c > 0 && h > 0 && w > 0 && k > 0 && pad >= 0 && pad < k && c <= DIM_MAX &&
           h <= DIM_MAX && w <= DIM_MAX && k <= 64 && psk_conv_out(h, k, pad) > 0 &&
           psk_conv_out(w, k, pad) > 0 &&
           (double)c * k * k * psk_conv_out(h, k, pad) * psk_conv_out(w, k, pad) < 2e9;
}

int psk_im2col(struct psk_backend *b, int c, int h, int w, int k, int pad, const float *x,
               float *col)
{
    if (!conv_ok(c, h, w, k, pad))
        return PS_EINVAL;
    return b->ops->im2col(b, c, h, w, k, pad, x, col);
}

int psk_col2im(struct psk_backend *b, int c, int h, int w, int k, int pad, const float *dcol,
               float *dx)
{
    if (!conv_ok(c, h, w, k, pad))
        return PS_EINVAL;
    return b->ops->col2im(b, c, h, w, k, pad, dcol, dx);
}

int psk_maxpool(struct psk_backend *b, int planes, int h, int w, int s, const float *x, float *y,
                int *arg)
{
    if (!pool_ok(planes, h, w, s) || arg == NULL)
        return PS_EINVAL;
    return planes == 0 ? 0 : b->ops->pool(b, planes, h, w, s, x, y, arg);
}

int psk_avgpool(struct psk_backend *b, int planes, int h, int w, int s, const float *x, float *y)
{
    if (!pool_ok(planes, h, w, s))
        return PS_EINVAL;
    return planes == 0 ? 0 : b->ops->pool(b, planes, h, w, s, x, y, NULL);
}

int psk_pool_backward(struct psk_backend *b, int planes, int h, int w, int s, const float *dy,
                      const int *arg, float *dx)
{
    if (!pool_ok(planes, h, w, s))
        return PS_EINVAL;
    return planes == 0 ? 0 : b->ops->pool_backward(b, planes, h, w, s, dy, arg, dx);
}

/* Output positions of one image, rows of its column matrix. */
static void sizes(const struct psk_conv *g, int *hw, int *ckk)
{
    *hw = psk_conv_out(g->h, g->k, g->pad) * psk_conv_out(g->w, g->k, g->pad);
    *ckk = g->c_in * g->k * g->k;
}

static int geometry_ok(const struct psk_conv *g)
{
    return g->n >= 0 && g->c_out > 0 && g->c_out <= DIM_MAX &&
           conv_ok(g->c_in, g->h, g->w, g->k, g->pad);
}

size_t psk_conv_ws_floats(const struct psk_conv *g)
{
    if (!geometry_ok(g))
        return 0;
    int hw, ckk;
    sizes(g, &hw, &ckk);
    return (size_t)ckk * hw + (size_t)hw;
}

int psk_conv_ws_init(struct psk_backend *b, const struct psk_conv *g, float *ws)
{
    if (!geometry_ok(g))
        return PS_EINVAL;
    int hw, ckk;
    sizes(g, &hw, &ckk);
    float *ones = malloc((size_t)hw * sizeof *ones);
    if (ones == NULL)
        return PS_ENOMEM;
    for (int i = 0; i < hw; i++)
        ones[i] = 1.0f;
    int rc = psk_upload(b, ws + (size_t)ckk * hw, ones, (size_t)hw * sizeof *ones);
    free(ones);
    return rc;
}

/* A convolution's sizes and its workspace's two parts. */
struct parts {
    int hw, ckk;       /* output positions; rows of the column matrix */
    size_t in, out;    /* floats of one input image, of one output image */
    float *col, *ones; /* in the workspace */
};

static int parts_of(const struct psk_conv *g, float *ws, struct parts *p)
{
    if (!geometry_ok(g))
        return 0;
    sizes(g, &p->hw, &p->ckk);
    p->in = (size_t)g->c_in * g->h * g->w;
    p->out = (size_t)g->c_out * p->hw;
    p->col = ws;
    p->ones = ws + (size_t)p->ckk * p->hw;
    return 1;
}

int psk_conv_forward(struct psk_backend *b, const struct psk_conv *g, const float *x,
                     const float *wt, const float *bias, float *y, float *ws)
{
    struct parts p;
    if (!parts_of(g, ws, &p))
        return PS_EINVAL;
    int hw = p.hw, ckk = p.ckk;
    for (int i = 0; i < g->n; i++) {
        float *yi = y + i * p.out;
        int rc = b->ops->im2col(b, g->c_in, g->h, g->w, g->k, g->pad, x + i * p.in, p.col);
        /* y_i = W (c_out x ckk) . col (ckk x hw), then + bias . ones^T */
        if (rc == 0)
            rc = psk_gemm(b, 0, 0, g->c_out, hw, ckk, 1.0f, wt, ckk, p.col, hw, 0.0f, yi, hw);
        if (rc == 0)
            rc = psk_gemm(b, 0, 0, g->c_out, hw, 1, 1.0f, bias, 1, p.ones, hw, 1.0f, yi, hw);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int psk_conv_backward(struct psk_backend *b, const struct psk_conv *g, const float *x,
                      const float *wt, const float *dy, float *gw, float *gb, float *dx, float *ws)
{
    struct parts p;
    if (!parts_of(g, ws, &p))
        return PS_EINVAL;
    int hw = p.hw, ckk = p.ckk;
    float *col = p.col, *ones = p.ones;
    size_t in = p.in, out = p.out;
    if (g->n == 0) { /* no images: zero gradients */
        int rc = psk_scale(b, (size_t)g->c_out * ckk, 0.0f, gw);
        return rc ? rc : psk_scale(b, (size_t)g->c_out, 0.0f, gb);
    }
    for (int i = 0; i < g->n; i++) {
        const float *dyi = dy + i * out;
        float beta = i == 0 ? 0.0f : 1.0f;
        int rc = b->ops->im2col(b, g->c_in, g->h, g->w, g->k, g->pad, x + i * in, col);
        /* gw += dy_i (c_out x hw) . col^T (hw x ckk); gb += dy_i . ones */
        if (rc == 0)
            rc = psk_gemm(b, 0, 1, g->c_out, ckk, hw, 1.0f, dyi, hw, col, hw, beta, gw, ckk);
        if (rc == 0)
            rc = psk_gemm(b, 0, 0, g->c_out, 1, hw, 1.0f, dyi, hw, ones, 1, beta, gb, 1);
        if (rc == 0 && dx != NULL) {
            /* dcol = W^T (ckk x c_out) . dy_i (c_out x hw), then gathered */
            rc = psk_gemm(b, 1, 0, ckk, hw, g->c_out, 1.0f, wt, ckk, dyi, hw, 0.0f, col, hw);
            if (rc == 0)
                rc = b->ops->col2im(b, g->c_in, g->h, g->w, g->k, g->pad, col, dx + i * in);
        }
        if (rc != 0)
            return rc;
    }
    return 0;
}
