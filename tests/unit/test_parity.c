/* CPU vs CUDA parity on the same random cases (odd sizes, sizes that are
 * not multiples of the block size, zero-size edges). Exits 77 (skipped)
 * when the build has no CUDA backend or no device is usable, so a machine
 * without a GPU never counts it as passed. */
#include "psk.h"

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
    psk_close(cpu);
    psk_close(gpu);
    printf("parity: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
