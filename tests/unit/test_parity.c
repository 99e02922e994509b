/* CPU vs CUDA parity on the same random cases (odd sizes, sizes that are
 * not multiples of the block size, zero-size edges). Exits 77 (skipped)
 * when the build has no CUDA backend or no device is usable, so a machine
 * without a GPU never counts it as passed. */
#include "psk.h"
#include "psk_math.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SKIP 77

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int failures;

static void check(const char *what, const float *a, const float *b, size_t n, double tol)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) {
            printf("FAIL %s: NaN at %zu\n", what, i);
            failures++;
            return;
        }
        num += (double)(a[i] - b[i]) * (a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    printf("%-40s n=%-8zu rel_err=%.3g %s\n", what, n, rel, rel <= tol ? "ok" : "FAIL");
    if (rel > tol)
        failures++;
}

/* Runs axpy then scale on backend b over host arrays; result in out. */
static int run_vec(struct psk_backend *b, size_t n, const float *hx, const float *hy, float *out)
{
    float *x = NULL, *y = NULL;
    int rc = psk_alloc(b, n * 4, (void **)&x) || psk_alloc(b, n * 4, (void **)&y) ||
             psk_upload(b, x, hx, n * 4) || psk_upload(b, y, hy, n * 4) ||
             psk_axpy(b, n, 1.5f, x, y) || psk_scale(b, n, -0.75f, y) ||
             psk_download(b, out, y, n * 4);
    psk_free(b, x);
    psk_free(b, y);
    return rc;
}

static int run_gemm(struct psk_backend *b, int ta, int tb, int m, int n, int k, const float *ha,
                    const float *hb, float *hc)
{
    size_t as = (size_t)m * k, bs = (size_t)k * n, cs = (size_t)m * n;
    float *a = NULL, *bm = NULL, *c = NULL;
    int rc = psk_alloc(b, as * 4, (void **)&a) || psk_alloc(b, bs * 4, (void **)&bm) ||
             psk_alloc(b, cs * 4, (void **)&c) || psk_upload(b, a, ha, as * 4) ||
             psk_upload(b, bm, hb, bs * 4) || psk_upload(b, c, hc, cs * 4) ||
             psk_gemm(b, ta, tb, m, n, k, 1.0f, a, ta ? m : k, bm, tb ? k : n, 0.5f, c, n) ||
             psk_download(b, hc, c, cs * 4);
    psk_free(b, a);
    psk_free(b, bm);
    psk_free(b, c);
    return rc;
}

/* Uploads n floats (or ints) to a fresh device buffer (h NULL: leaves it
 * as it is). */
static void *dev_copy(struct psk_backend *b, const void *h, size_t bytes)
{
    void *d = NULL;
    if (psk_alloc(b, bytes + 4, &d) != 0)
        return NULL;
    if (bytes > 0 && h != NULL && psk_upload(b, d, h, bytes) != 0) {
        psk_free(b, d);
        return NULL;
    }
    return d;
}

/* The layer ops of one MLP step on backend b: bias add, relu, relu
 * backward, softmax+xent, column sums. Outputs land in the host arrays. */
static int run_layer_ops(struct psk_backend *b, int rows, int cols, const float *x,
                         const float *bias, const int *labels, float *y, float *dx, float *dlog,
                         float *loss, int *pred, float *colsum)
{
    size_t n = (size_t)rows * cols, nb = n * 4;
    float *dx_ = dev_copy(b, x, nb), *db = dev_copy(b, bias, (size_t)cols * 4);
    float *dy = dev_copy(b, x, nb), *dd = dev_copy(b, x, nb), *dl = dev_copy(b, x, nb);
    float *dloss = dev_copy(b, loss, (size_t)rows * 4),
          *dcs = dev_copy(b, colsum, (size_t)cols * 4);
    int *dlab = dev_copy(b, labels, (size_t)rows * 4), *dpred = dev_copy(b, pred, (size_t)rows * 4);
    int rc = !dx_ || !db || !dy || !dd || !dl || !dloss || !dcs || !dlab || !dpred;
    rc = rc || psk_bias_add(b, rows, cols, db, dy) || psk_relu(b, n, dy, dy) ||
         psk_relu_backward(b, n, dy, dd) ||
         psk_softmax_xent(b, rows, cols, dx_, dlab, 1.0f / (rows ? rows : 1), dl, dloss, dpred) ||
         psk_col_sum(b, rows, cols, dl, dcs) || psk_download(b, y, dy, nb) ||
         psk_download(b, dx, dd, nb) || psk_download(b, dlog, dl, nb) ||
         psk_download(b, loss, dloss, (size_t)rows * 4) ||
         psk_download(b, pred, dpred, (size_t)rows * 4) ||
         psk_download(b, colsum, dcs, (size_t)cols * 4);
    void *all[] = {dx_, db, dy, dd, dl, dloss, dcs, dlab, dpred};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        psk_free(b, all[i]);
    return rc;
}

static void layer_case(struct psk_backend *cpu, struct psk_backend *gpu, int rows, int cols,
                       uint64_t *seed)
{
    size_t n = (size_t)rows * cols;
    float *x = malloc(n * 4 + 4), *bias = malloc((size_t)cols * 4 + 4);
    int *lab = malloc((size_t)rows * 4 + 4);
    for (size_t i = 0; i < n; i++)
        x[i] = 4.0f * frand(seed);
    for (int c = 0; c < cols; c++)
        bias[c] = frand(seed);
    for (int r = 0; r < rows; r++)
        lab[r] = (int)((frand(seed) + 1.0f) * 0.5f * cols) % cols;
    float *out[2][5];
    int *pred[2];
    struct psk_backend *bk[2] = {cpu, gpu};
    int rc = 0;
    for (int k = 0; k < 2; k++) {
        for (int j = 0; j < 3; j++) {
            out[k][j] = malloc(n * 4 + 4);
            for (size_t i = 0; i < n; i++)
                out[k][j][i] = NAN; /* poison */
        }
        out[k][3] = malloc((size_t)rows * 4 + 4);
        out[k][4] = malloc((size_t)cols * 4 + 4);
        pred[k] = malloc((size_t)rows * 4 + 4);
        for (int r = 0; r < rows; r++) {
            out[k][3][r] = NAN;
            pred[k][r] = -1;
        }
        for (int c = 0; c < cols; c++)
            out[k][4][c] = NAN;
        rc |= run_layer_ops(bk[k], rows, cols, x, bias, lab, out[k][0], out[k][1], out[k][2],
                            out[k][3], pred[k], out[k][4]);
    }
    char what[96];
    if (rc != 0) {
        printf("FAIL: layer ops %dx%d: %s\n", rows, cols, psk_last_error(gpu));
        failures++;
    } else {
        const char *names[5] = {"bias_add+relu", "relu_backward", "softmax_xent grad",
                                "softmax_xent loss", "col_sum"};
        size_t lens[5] = {n, n, n, (size_t)rows, (size_t)cols};
        for (int j = 0; j < 5; j++) {
            snprintf(what, sizeof what, "%s %dx%d", names[j], rows, cols);
            check(what, out[1][j], out[0][j], lens[j], 1e-5);
        }
        int mism = 0;
        for (int r = 0; r < rows; r++)
            mism += pred[0][r] != pred[1][r];
        printf("%-40s mismatches=%d %s\n", "argmax", mism, mism ? "FAIL" : "ok");
        failures += mism != 0;
    }
    for (int k = 0; k < 2; k++) {
        for (int j = 0; j < 5; j++)
            free(out[k][j]);
        free(pred[k]);
    }
    free(x);
    free(bias);
    free(lab);
}

/* A convolution forward and backward, then a max-pool and an average
 * pool (of the random dy, so both backends pool the same floats) with
 * their backward passes, on backend b: outputs y, gw, gb, dx, then the
 * pools' y and dx, in out[0..7] (host). */
static int run_conv_pool(struct psk_backend *b, const struct psk_conv *g, int s, float *const *in,
                         float **out)
{
    int ho = psk_conv_out(g->h, g->k, g->pad), wo = psk_conv_out(g->w, g->k, g->pad);
    size_t nx = (size_t)g->n * g->c_in * g->h * g->w, nw = (size_t)g->c_out * g->c_in * g->k * g->k;
    size_t ny = (size_t)g->n * g->c_out * ho * wo, nws = psk_conv_ws_floats(g);
    int planes = g->n * g->c_out;
    size_t np = (size_t)planes * (ho / s) * (wo / s);
    float *x = dev_copy(b, in[0], nx * 4), *w = dev_copy(b, in[1], nw * 4);
    float *bias = dev_copy(b, in[2], (size_t)g->c_out * 4), *dy = dev_copy(b, in[3], ny * 4);
    float *dp = dev_copy(b, in[4], np * 4);
    float *y = dev_copy(b, NULL, ny * 4), *gw = dev_copy(b, NULL, nw * 4);
    float *gb = dev_copy(b, NULL, (size_t)g->c_out * 4), *dx = dev_copy(b, NULL, nx * 4);
    float *ws = dev_copy(b, NULL, nws * 4), *py = dev_copy(b, NULL, np * 4);
    float *pdx = dev_copy(b, NULL, ny * 4);
    int *arg = dev_copy(b, NULL, np * 4);
    int rc =
        !x || !w || !bias || !dy || !dp || !y || !gw || !gb || !dx || !ws || !py || !pdx || !arg;
    rc = rc || psk_conv_ws_init(b, g, ws) || psk_conv_forward(b, g, x, w, bias, y, ws) ||
         psk_conv_backward(b, g, x, w, dy, gw, gb, dx, ws) || psk_download(b, out[0], y, ny * 4) ||
         psk_download(b, out[1], gw, nw * 4) || psk_download(b, out[2], gb, (size_t)g->c_out * 4) ||
         psk_download(b, out[3], dx, nx * 4) || psk_maxpool(b, planes, ho, wo, s, dy, py, arg) ||
         psk_pool_backward(b, planes, ho, wo, s, dp, arg, pdx) ||
         psk_download(b, out[4], py, np * 4) || psk_download(b, out[5], pdx, ny * 4) ||
         psk_avgpool(b, planes, ho, wo, s, dy, py) ||
         psk_pool_backward(b, planes, ho, wo, s, dp, NULL, pdx) ||
         psk_download(b, out[6], py, np * 4) || psk_download(b, out[7], pdx, ny * 4);
    void *all[] = {x, w, bias, dy, dp, y, gw, gb, dx, ws, py, pdx, arg};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        psk_free(b, all[i]);
    return rc;
}

static void conv_case(struct psk_backend *cpu, struct psk_backend *gpu, struct psk_conv g, int s,
                      uint64_t *seed)
{
    int ho = psk_conv_out(g.h, g.k, g.pad), wo = psk_conv_out(g.w, g.k, g.pad);
    size_t nx = (size_t)g.n * g.c_in * g.h * g.w, nw = (size_t)g.c_out * g.c_in * g.k * g.k;
    size_t ny = (size_t)g.n * g.c_out * ho * wo;
    size_t np = (size_t)g.n * g.c_out * (ho / s) * (wo / s);
    size_t nin[5] = {nx, nw, (size_t)g.c_out, ny, np};
    size_t nout[8] = {ny, nw, (size_t)g.c_out, nx, np, ny, np, ny};
    float *in[5], *out[2][8];
    for (int j = 0; j < 5; j++) {
        in[j] = malloc(nin[j] * 4 + 4);
        for (size_t i = 0; i < nin[j]; i++)
            in[j][i] = frand(seed);
    }
    struct psk_backend *bk[2] = {cpu, gpu};
    int rc = 0;
    for (int k = 0; k < 2; k++) {
        for (int j = 0; j < 8; j++) {
            out[k][j] = malloc(nout[j] * 4 + 4);
            for (size_t i = 0; i < nout[j]; i++)
                out[k][j][i] = NAN; /* poison */
        }
        rc |= run_conv_pool(bk[k], &g, s, in, out[k]);
    }
    if (rc != 0) {
        printf("FAIL: conv/pool n%d c%d %dx%d -> %d k%d pad%d: %s\n", g.n, g.c_in, g.h, g.w,
               g.c_out, g.k, g.pad, psk_last_error(gpu));
        failures++;
    } else {
        /* the convolutions go through GEMMs (another summation order on
         * cuBLAS); the pools pick or average the same floats: exact */
        const char *names[8] = {"conv y",    "conv gw",    "conv gb",   "conv dx",
                                "maxpool y", "maxpool dx", "avgpool y", "avgpool dx"};
        for (int j = 0; j < 8; j++) {
            char what[96];
            snprintf(what, sizeof what, "%s n%d c%d %dx%d k%d p%d s%d", names[j], g.n, g.c_in, g.h,
                     g.w, g.k, g.pad, s);
            check(what, out[1][j], out[0][j], nout[j], j < 4 ? 1e-5 : 0.0);
        }
    }
    for (int j = 0; j < 5; j++)
        free(in[j]);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 8; j++)
            free(out[k][j]);
}

int main(void)
{
    if (!psk_cuda_built()) {
        printf("SKIP: built without the CUDA backend\n");
        return SKIP;
    }
    struct psk_backend *cpu = NULL, *gpu = NULL;
    char err[256];
    if (psk_open("cuda", &gpu, err, sizeof err) != 0) {
        printf("SKIP: %s\n", err);
        return SKIP;
    }
    if (psk_open("cpu", &cpu, err, sizeof err) != 0) {
        printf("FAIL: cpu backend: %s\n", err);
        return 1;
    }
    printf("parity: %s vs %s\n", psk_describe(gpu), psk_describe(cpu));
    uint64_t seed = 11;
    const size_t sizes[] = {0, 1, 255, 256, 257, 1000003};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        float *x = malloc(n * 4 + 4), *y = malloc(n * 4 + 4), *o1 = malloc(n * 4 + 4),
              *o2 = malloc(n * 4 + 4);
        for (size_t i = 0; i < n; i++) {
            x[i] = frand(&seed);
            y[i] = frand(&seed);
            o2[i] = NAN; /* poison: every element must be written */
        }
        if (run_vec(cpu, n, x, y, o1) || run_vec(gpu, n, x, y, o2)) {
            printf("FAIL: vector ops n=%zu: %s\n", n, psk_last_error(gpu));
            failures++;
        } else {
            char what[64];
            snprintf(what, sizeof what, "axpy+scale");
            check(what, o2, o1, n, 1e-6);
        }
        free(x);
        free(y);
        free(o1);
        free(o2);
    }
    const int shapes[][3] = {{1, 1, 1}, {7, 13, 3}, {33, 65, 129}, {257, 10, 784}, {64, 1, 5}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        for (int t = 0; t < 4; t++) {
            int m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
            size_t as = (size_t)m * k, bs = (size_t)k * n, cs = (size_t)m * n;
            float *a = malloc(as * 4), *b = malloc(bs * 4), *c1 = malloc(cs * 4),
                  *c2 = malloc(cs * 4);
            for (size_t i = 0; i < as; i++)
                a[i] = frand(&seed);
            for (size_t i = 0; i < bs; i++)
                b[i] = frand(&seed);
            for (size_t i = 0; i < cs; i++)
                c1[i] = c2[i] = frand(&seed);
            if (run_gemm(cpu, t & 1, t >> 1, m, n, k, a, b, c1) ||
                run_gemm(gpu, t & 1, t >> 1, m, n, k, a, b, c2)) {
                printf("FAIL: gemm: %s\n", psk_last_error(gpu));
                failures++;
            } else {
                char what[64];
                snprintf(what, sizeof what, "gemm %dx%dx%d ta=%d tb=%d", m, n, k, t & 1, t >> 1);
                check(what, c2, c1, cs, 1e-5); /* cuBLAS may use another summation order */
            }
            free(a);
            free(b);
            free(c1);
            free(c2);
        }
    }
    /* mixed precision: rounding bit for bit (odd sizes, the f16 edges,
     * infinities, NaN), the non-finite count, and 16-bit tensor-core
     * GEMMs on rounded inputs against the CPU's f32 GEMM of the same */
    for (int p = PSK_PREC_BF16; p <= PSK_PREC_F16; p++) {
        const size_t rn[] = {1, 255, 257, 100003};
        for (size_t ri = 0; ri < sizeof rn / sizeof rn[0]; ri++) {
            size_t n = rn[ri];
            float *h = malloc(n * 4), *r[2] = {malloc(n * 4), malloc(n * 4)};
            const float edge[] = {65504.0f, 65520.0f, -65519.0f, 3e-8f, 6.1e-5f, INFINITY, NAN};
            for (size_t i = 0; i < n; i++)
                h[i] = i < 7 ? edge[i] : frand(&seed) * (float)(i % 97) * 1000.0f;
            uint64_t cnt[2] = {0, 0};
            struct psk_backend *bk[2] = {cpu, gpu};
            int rc = 0;
            for (int j = 0; j < 2; j++) {
                float *d = dev_copy(bk[j], h, n * 4);
                rc |= d == NULL || psk_round(bk[j], p, n, d) ||
                      psk_count_nonfinite(bk[j], n, d, &cnt[j]) ||
                      psk_download(bk[j], r[j], d, n * 4);
                psk_free(bk[j], d);
            }
            int same = rc == 0 && memcmp(r[0], r[1], n * 4) == 0 && cnt[0] == cnt[1];
            printf("%-40s n=%-8zu %s\n", p == PSK_PREC_BF16 ? "round bf16" : "round f16", n,
                   same ? "ok (bit for bit)" : "FAIL");
            failures += !same;
            free(h);
            free(r[0]);
            free(r[1]);
        }
        const int gs[][3] = {{7, 13, 3}, {33, 65, 129}, {64, 128, 1600}};
        for (size_t si = 0; si < sizeof gs / sizeof gs[0]; si++) {
            int m = gs[si][0], n = gs[si][1], k = gs[si][2];
            size_t as = (size_t)m * k, bs = (size_t)k * n, cs = (size_t)m * n;
            float *a = malloc(as * 4), *b = malloc(bs * 4), *c1 = calloc(cs, 4),
                  *c2 = calloc(cs, 4);
            for (size_t i = 0; i < as; i++)
                a[i] = psk_round16(p, frand(&seed));
            for (size_t i = 0; i < bs; i++)
                b[i] = psk_round16(p, frand(&seed));
            psk_set_precision(gpu, p);
            int rc =
                run_gemm(cpu, 0, 1, m, n, k, a, b, c1) || run_gemm(gpu, 0, 1, m, n, k, a, b, c2);
            psk_set_precision(gpu, PSK_PREC_F32);
            if (rc) {
                printf("FAIL: 16-bit gemm: %s\n", psk_last_error(gpu));
                failures++;
            } else {
                char what[64];
                snprintf(what, sizeof what, "gemm %s %dx%dx%d", psk_precision_name(p), m, n, k);
                check(what, c2, c1, cs, 1e-5);
            }
            free(a);
            free(b);
            free(c1);
            free(c2);
        }
    }
    /* top-k: distinct random magnitudes, so both must pick the same set */
    const size_t tk[][2] = {{1, 1}, {1000, 10}, {200704, 2007}, {257, 257}};
    for (size_t ti = 0; ti < sizeof tk / sizeof tk[0]; ti++) {
        size_t n = tk[ti][0], k = tk[ti][1];
        float *hv = malloc(n * 4), *val[2] = {malloc(k * 4), malloc(k * 4)};
        uint64_t *idx[2] = {malloc(k * 8), malloc(k * 8)};
        for (size_t i = 0; i < n; i++)
            hv[i] = frand(&seed) * (float)(i + 1);
        struct psk_backend *bk[2] = {cpu, gpu};
        int rc = 0;
        for (int j = 0; j < 2; j++) {
            float *dv = NULL;
            rc |= psk_alloc(bk[j], n * 4, (void **)&dv) || psk_upload(bk[j], dv, hv, n * 4) ||
                  psk_topk(bk[j], n, dv, NULL, k, idx[j], val[j]);
            psk_free(bk[j], dv);
        }
        int same =
            rc == 0 && memcmp(idx[0], idx[1], k * 8) == 0 && memcmp(val[0], val[1], k * 4) == 0;
        printf("%-40s n=%-8zu k=%-6zu %s\n", "topk", n, k, same ? "ok" : "FAIL");
        failures += !same;
        free(hv);
        free(val[0]);
        free(val[1]);
        free(idx[0]);
        free(idx[1]);
    }
    const int lshapes[][2] = {{0, 10}, {1, 1}, {17, 10}, {257, 10}, {64, 256}, {1000, 3}};
    for (size_t si = 0; si < sizeof lshapes / sizeof lshapes[0]; si++)
        layer_case(cpu, gpu, lshapes[si][0], lshapes[si][1], &seed);
    /* odd sizes, padding, a 1x1 and a 5x5 kernel, the CNN's own layers */
    const struct psk_conv convs[] = {{3, 1, 7, 9, 5, 3, 0},    {2, 3, 5, 5, 4, 3, 1},
                                     {1, 2, 6, 4, 3, 1, 0},    {4, 5, 11, 13, 7, 5, 2},
                                     {5, 1, 28, 28, 32, 3, 0}, {3, 32, 13, 13, 64, 3, 0}};
    const int pools[] = {2, 3, 1, 2, 2, 2};
    for (size_t ci = 0; ci < sizeof convs / sizeof convs[0]; ci++)
        conv_case(cpu, gpu, convs[ci], pools[ci], &seed);
    psk_close(cpu);
    psk_close(gpu);
    printf("parity: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
