/* conv_bench: the CNN's convolutions, forward and backward (data, weights
 * and bias gradients), on psk's CPU backend (im2col + OpenBLAS GEMM)
 * against oneDNN's convolution primitives (Debian's libdnnl, built only
 * where it is installed), on the same sizes in the same run.
 *
 * oneDNN runs twice: on plain NCHW/OIHW buffers (what psworker's layers
 * hold, so a drop-in swap), and on the blocked layouts it prefers
 * ("any"), the primitives alone, without the reorders to and from them
 * that a swap would add each step. Each result is checked against psk's
 * (relative error of the norm at most 1e-4), so a fast wrong answer does
 * not count. Threads: OPENBLAS_NUM_THREADS and OMP_NUM_THREADS (oneDNN's
 * OpenMP) as set; run it with both at 1 for one core each.
 *
 *   conv_bench [--repeat N] [--batch B] [--json PATH]
 * Reports milliseconds per layer pass and the ratios; never fails on them
 * (exit 1 only when something does not run or does not match). */
#include "psk.h"

#include <dnnl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what, dnnl_status_t st)
{
    fprintf(stderr, "conv_bench: %s: oneDNN status %d\n", what, (int)st);
    exit(1);
}

#define DN(call)                                                                                   \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success)                                                                   \
            die(#call, st_);                                                                       \
    } while (0)

static float *filled(size_t n, unsigned seed)
{
    float *v = malloc(n * sizeof *v);
    if (v == NULL) {
        fprintf(stderr, "conv_bench: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        v[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
    return v;
}

static double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (double)(a[i] - b[i]) * (a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

struct layer {
    const char *name;
    struct psk_conv g;
};

/* One layer's buffers, and psk's results as the reference. */
struct bufs {
    size_t nx, nw, ny;
    int ho, wo;
    float *x, *w, *b, *dy;
    float *y, *gw, *gb, *dx; /* psk's */
    float *y2, *gw2, *gb2, *dx2;
};

/* oneDNN's three primitives over one set of layouts (tag: plain or
 * any), with memories holding the user's data in those layouts. */
struct dn {
    dnnl_primitive_t fwd, bwd_data, bwd_w;
    dnnl_memory_t x, w, b, y, dy, dx, gw, gb;
    int blocked;
};

static dnnl_engine_t eng;
static dnnl_stream_t strm;

static dnnl_memory_t mem(const dnnl_memory_desc_t *md, void *handle)
{
    dnnl_memory_t m;
    DN(dnnl_memory_create(&m, md, eng, handle ? handle : DNNL_MEMORY_ALLOCATE));
    return m;
}

static const dnnl_memory_desc_t *md_of(const_dnnl_primitive_desc_t pd, dnnl_query_t q)
{
    return dnnl_primitive_desc_query_md(pd, q, 0);
}

/* Copies between a plain user buffer and memory m (any layout). */
static void reorder(const dnnl_memory_desc_t *from_md, void *from, dnnl_memory_t to, int back)
{
    const dnnl_memory_desc_t *to_md;
    DN(dnnl_memory_get_memory_desc(to, &to_md));
    dnnl_memory_t user = mem(from_md, from);
    dnnl_primitive_desc_t pd;
    DN(dnnl_reorder_primitive_desc_create(&pd, back ? to_md : from_md, eng, back ? from_md : to_md,
                                          eng, NULL));
    dnnl_primitive_t r;
    DN(dnnl_primitive_create(&r, pd));
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, back ? to : user}, {DNNL_ARG_TO, back ? user : to}};
    DN(dnnl_primitive_execute(r, strm, 2, args));
    DN(dnnl_stream_wait(strm));
    dnnl_primitive_destroy(r);
    dnnl_primitive_desc_destroy(pd);
    dnnl_memory_destroy(user);
}

static void dn_setup(struct dn *d, const struct psk_conv *g, struct bufs *B, int blocked)
{
    dnnl_dims_t xd = {g->n, g->c_in, g->h, g->w}, wd = {g->c_out, g->c_in, g->k, g->k},
                bd = {g->c_out}, yd = {g->n, g->c_out, B->ho, B->wo};
    dnnl_dims_t strides = {1, 1}, pad = {g->pad, g->pad};
    dnnl_memory_desc_t xm, wm, bm, ym, xp, wp, yp;
    dnnl_format_tag_t act = blocked ? dnnl_format_tag_any : dnnl_nchw,
                      wt = blocked ? dnnl_format_tag_any : dnnl_oihw;
    DN(dnnl_memory_desc_init_by_tag(&xm, 4, xd, dnnl_f32, act));
    DN(dnnl_memory_desc_init_by_tag(&wm, 4, wd, dnnl_f32, wt));
    DN(dnnl_memory_desc_init_by_tag(&bm, 1, bd, dnnl_f32, dnnl_x));
    DN(dnnl_memory_desc_init_by_tag(&ym, 4, yd, dnnl_f32, act));
    DN(dnnl_memory_desc_init_by_tag(&xp, 4, xd, dnnl_f32, dnnl_nchw));
    DN(dnnl_memory_desc_init_by_tag(&wp, 4, wd, dnnl_f32, dnnl_oihw));
    DN(dnnl_memory_desc_init_by_tag(&yp, 4, yd, dnnl_f32, dnnl_nchw));
    dnnl_convolution_desc_t fd, bdd, bwd;
    DN(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, &xm,
                                          &wm, &bm, &ym, strides, pad, pad));
    DN(dnnl_convolution_backward_data_desc_init(&bdd, dnnl_convolution_direct, &xm, &wm, &ym,
                                                strides, pad, pad));
    DN(dnnl_convolution_backward_weights_desc_init(&bwd, dnnl_convolution_direct, &xm, &wm, &bm,
                                                   &ym, strides, pad, pad));
    dnnl_primitive_desc_t fpd, dpd, wpd;
    DN(dnnl_primitive_desc_create(&fpd, &fd, NULL, eng, NULL));
    DN(dnnl_primitive_desc_create(&dpd, &bdd, NULL, eng, fpd));
    DN(dnnl_primitive_desc_create(&wpd, &bwd, NULL, eng, fpd));
    DN(dnnl_primitive_create(&d->fwd, fpd));
    DN(dnnl_primitive_create(&d->bwd_data, dpd));
    DN(dnnl_primitive_create(&d->bwd_w, wpd));
    d->blocked = blocked;
    /* plain: the user's buffers themselves; blocked: memories of the
     * primitives' layouts, filled once by reorders (not timed) */
    d->x = mem(md_of(fpd, dnnl_query_src_md), blocked ? NULL : B->x);
    d->w = mem(md_of(fpd, dnnl_query_weights_md), blocked ? NULL : B->w);
    d->b = mem(&bm, B->b);
    d->y = mem(md_of(fpd, dnnl_query_dst_md), blocked ? NULL : B->y2);
    d->dy = mem(md_of(dpd, dnnl_query_diff_dst_md), blocked ? NULL : B->dy);
    d->dx = mem(md_of(dpd, dnnl_query_diff_src_md), blocked ? NULL : B->dx2);
    d->gw = mem(md_of(wpd, dnnl_query_diff_weights_md), blocked ? NULL : B->gw2);
    d->gb = mem(&bm, B->gb2);
    if (blocked) {
        reorder(&xp, B->x, d->x, 0);
        reorder(&wp, B->w, d->w, 0);
        reorder(&yp, B->dy, d->dy, 0);
    }
    dnnl_primitive_desc_destroy(fpd);
    dnnl_primitive_desc_destroy(dpd);
    dnnl_primitive_desc_destroy(wpd);
}

/* Backward of the weights needs the forward's diff_dst layout, which the
 * weights primitive may want otherwise: both read d->dy here, and oneDNN
 * refuses a mismatch at execution (the run then fails loudly). */
static void dn_pass(struct dn *d)
{
    dnnl_exec_arg_t f[] = {{DNNL_ARG_SRC, d->x},
                           {DNNL_ARG_WEIGHTS, d->w},
                           {DNNL_ARG_BIAS, d->b},
                           {DNNL_ARG_DST, d->y}};
    dnnl_exec_arg_t bd[] = {
        {DNNL_ARG_DIFF_DST, d->dy}, {DNNL_ARG_WEIGHTS, d->w}, {DNNL_ARG_DIFF_SRC, d->dx}};
    dnnl_exec_arg_t bw[] = {{DNNL_ARG_SRC, d->x},
                            {DNNL_ARG_DIFF_DST, d->dy},
                            {DNNL_ARG_DIFF_WEIGHTS, d->gw},
                            {DNNL_ARG_DIFF_BIAS, d->gb}};
    DN(dnnl_primitive_execute(d->fwd, strm, 4, f));
    DN(dnnl_primitive_execute(d->bwd_data, strm, 3, bd));
    DN(dnnl_primitive_execute(d->bwd_w, strm, 4, bw));
    DN(dnnl_stream_wait(strm));
}

static void dn_free(struct dn *d)
{
    dnnl_primitive_destroy(d->fwd);
    dnnl_primitive_destroy(d->bwd_data);
    dnnl_primitive_destroy(d->bwd_w);
    dnnl_memory_t all[] = {d->x, d->w, d->b, d->y, d->dy, d->dx, d->gw, d->gb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        dnnl_memory_destroy(all[i]);
}

/* A whole decimal in [lo, hi], or -1. */
static int int_arg(const char *s, int lo, int hi)
{
    char *end;
    long v = strtol(s, &end, 10);
    return *s != '\0' && *end == '\0' && v >= lo && v <= hi ? (int)v : -1;
}

static int median_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int repeat = 20, batch = 64;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) {
            if ((repeat = int_arg(argv[++i], 1, 1000)) < 0) {
                fprintf(stderr, "conv_bench: --repeat '%s' is not in [1, 1000]\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
            if ((batch = int_arg(argv[++i], 1, 1024)) < 0) {
                fprintf(stderr, "conv_bench: --batch '%s' is not in [1, 1024]\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
            json = argv[++i];
        } else {
            fprintf(stderr, "usage: conv_bench [--repeat N] [--batch B] [--json PATH]\n");
            return 2;
        }
    }
    struct psk_backend *be;
    char err[256];
    if (psk_open("cpu", &be, err, sizeof err) != 0) {
        fprintf(stderr, "conv_bench: %s\n", err);
        return 1;
    }
    DN(dnnl_engine_create(&eng, dnnl_cpu, 0));
    DN(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));
    /* psworker --model cnn's default --arch */
    const struct layer layers[] = {
        {"conv1 1->32 28x28", {batch, 1, 28, 28, 32, 3, 0}},
        {"conv2 32->64 13x13", {batch, 32, 13, 13, 64, 3, 0}},
    };
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (json && jf == NULL) {
        fprintf(stderr, "conv_bench: cannot write %s\n", json);
        return 1;
    }
    if (jf)
        fprintf(jf, "{\"batch\": %d", batch);
    printf("convolution forward + backward (data, weights, bias), batch %d, median of %d, ms\n",
           batch, repeat);
    printf("%-20s %10s %12s %14s %10s %10s\n", "layer", "psk", "onednn nchw", "onednn blocked",
           "psk/nchw", "psk/blocked");
    int bad = 0;
    for (size_t li = 0; li < sizeof layers / sizeof layers[0]; li++) {
        const struct psk_conv *g = &layers[li].g;
        struct bufs B;
        B.ho = psk_conv_out(g->h, g->k, g->pad);
        B.wo = psk_conv_out(g->w, g->k, g->pad);
        B.nx = (size_t)g->n * g->c_in * g->h * g->w;
        B.nw = (size_t)g->c_out * g->c_in * g->k * g->k;
        B.ny = (size_t)g->n * g->c_out * B.ho * B.wo;
        B.x = filled(B.nx, 1);
        B.w = filled(B.nw, 2);
        B.b = filled((size_t)g->c_out, 3);
        B.dy = filled(B.ny, 4);
        B.y = filled(B.ny, 5);
        B.gw = filled(B.nw, 6);
        B.gb = filled((size_t)g->c_out, 7);
        B.dx = filled(B.nx, 8);
        B.y2 = filled(B.ny, 9);
        B.gw2 = filled(B.nw, 10);
        B.gb2 = filled((size_t)g->c_out, 11);
        B.dx2 = filled(B.nx, 12);
        float *ws = malloc(psk_conv_ws_floats(g) * sizeof(float));
        if (ws == NULL || psk_conv_ws_init(be, g, ws) != 0) {
            fprintf(stderr, "conv_bench: workspace\n");
            return 1;
        }
        struct dn plain, blk;
        dn_setup(&plain, g, &B, 0);
        dn_setup(&blk, g, &B, 1);
        double *t[3];
        for (int k = 0; k < 3; k++)
            t[k] = malloc((size_t)repeat * sizeof(double));
        for (int r = -1; r < repeat; r++) { /* r = -1: a warm-up pass of each */
            double t0 = now_s();
            if (psk_conv_forward(be, g, B.x, B.w, B.b, B.y, ws) ||
                psk_conv_backward(be, g, B.x, B.w, B.dy, B.gw, B.gb, B.dx, ws)) {
                fprintf(stderr, "conv_bench: psk: %s\n", psk_last_error(be));
                return 1;
            }
            double t1 = now_s();
            dn_pass(&plain);
            double t2 = now_s();
            dn_pass(&blk);
            double t3 = now_s();
            if (r >= 0) {
                t[0][r] = (t1 - t0) * 1e3;
                t[1][r] = (t2 - t1) * 1e3;
                t[2][r] = (t3 - t2) * 1e3;
            }
        }
        /* the plain run wrote straight into y2, dx2, gw2, gb2 */
        double e[4] = {rel_err(B.y2, B.y, B.ny), rel_err(B.dx2, B.dx, B.nx),
                       rel_err(B.gw2, B.gw, B.nw), rel_err(B.gb2, B.gb, (size_t)g->c_out)};
        for (int k = 0; k < 4; k++)
            if (!(e[k] <= 1e-4)) {
                fprintf(stderr, "conv_bench: %s: oneDNN differs from psk (output %d: %.3g)\n",
                        layers[li].name, k, e[k]);
                bad = 1;
            }
        double m[3];
        for (int k = 0; k < 3; k++) {
            qsort(t[k], (size_t)repeat, sizeof(double), median_cmp);
            m[k] = t[k][repeat / 2];
            free(t[k]);
        }
        printf("%-20s %10.3f %12.3f %14.3f %9.2fx %10.2fx\n", layers[li].name, m[0], m[1], m[2],
               m[1] / m[0], m[2] / m[0]);
        if (jf)
            fprintf(jf,
                    ", \"conv%zu_psk_ms\": %.4f, \"conv%zu_onednn_nchw_ms\": %.4f, "
                    "\"conv%zu_onednn_blocked_ms\": %.4f",
                    li + 1, m[0], li + 1, m[1], li + 1, m[2]);
        dn_free(&plain);
        dn_free(&blk);
        free(ws);
        float *all[] = {B.x, B.w, B.b, B.dy, B.y, B.gw, B.gb, B.dx, B.y2, B.gw2, B.gb2, B.dx2};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            free(all[i]);
    }
    printf("(ratios over 1 mean oneDNN took longer)\n");
    if (jf) {
        fprintf(jf, "}\n");
        fclose(jf);
    }
    dnnl_stream_destroy(strm);
    dnnl_engine_destroy(eng);
    psk_close(be);
    return bad;
}
