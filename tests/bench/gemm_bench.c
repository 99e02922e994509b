/* gemm_bench: the GEMMs of one training step of psworker's MLP and CNN
 * (their default --layers and --arch), each shape timed alone through
 * psk_gemm on a backend (cuBLAS SGEMM on "cuda", OpenBLAS on "cpu"), with
 * a large square product as the backend's peak. Prints each shape's
 * GFLOP/s and the sum over a step (count x time): the time a step's
 * products take at the rates the backend reaches on them one by one. Set
 * beside a measured step time (tests/gpu/check.sh does), the difference
 * is what a step spends outside SGEMM (launches, other kernels, copies,
 * the exchange with psd).
 *
 *   gemm_bench [--device auto|cpu|cuda[:N]] [--batch B] [--seconds S] [--peak N]
 *              [--json PATH]
 * --seconds: the least time each shape is run for (default 0.2);
 * --peak N: the square product's size (default 4096; 0 leaves it out).
 * Never fails on a number: exit 1 only when a backend call fails. */
#include "psk.h"

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

/* One product of a step: C (m x n) = op(A) op(B), op(A) m x k; count
 * times a step ("B" in what: once per image). */
struct shape {
    const char *model, *what;
    int ta, tb, m, n, k;
    int per_image; /* count = batch when set, else 1 */
    double beta;
};

/* psworker's MLP 784-256-128-10 (mlp.c) and CNN
 * conv3x3:32,relu,maxpool2,conv3x3:64,relu,maxpool2,fc:128,relu,fc:10
 * (psk_conv.c: a product per image and layer) at batch B; m or n of 0
 * stands for B. */
static const struct shape SHAPES[] = {
    {"mlp", "fc1 forward", 0, 1, 0, 256, 784, 0, 0},
    {"mlp", "fc2 forward", 0, 1, 0, 128, 256, 0, 0},
    {"mlp", "fc3 forward", 0, 1, 0, 10, 128, 0, 0},
    {"mlp", "fc3 weight grad", 1, 0, 10, 128, 0, 0, 0},
    {"mlp", "fc3 input grad", 0, 0, 0, 128, 10, 0, 0},
    {"mlp", "fc2 weight grad", 1, 0, 128, 256, 0, 0, 0},
    {"mlp", "fc2 input grad", 0, 0, 0, 256, 128, 0, 0},
    {"mlp", "fc1 weight grad", 1, 0, 256, 784, 0, 0, 0},
    {"cnn", "conv1 forward (an image)", 0, 0, 32, 676, 9, 1, 0},
    {"cnn", "conv1 bias (an image)", 0, 0, 32, 676, 1, 1, 1},
    {"cnn", "conv2 forward (an image)", 0, 0, 64, 121, 288, 1, 0},
    {"cnn", "conv2 bias (an image)", 0, 0, 64, 121, 1, 1, 1},
    {"cnn", "fc1 forward", 0, 1, 0, 128, 1600, 0, 0},
    {"cnn", "fc2 forward", 0, 1, 0, 10, 128, 0, 0},
    {"cnn", "fc2 weight grad", 1, 0, 10, 128, 0, 0, 0},
    {"cnn", "fc2 input grad", 0, 0, 0, 128, 10, 0, 0},
    {"cnn", "fc1 weight grad", 1, 0, 128, 1600, 0, 0, 0},
    {"cnn", "fc1 input grad", 0, 0, 0, 1600, 128, 0, 0},
    {"cnn", "conv2 weight grad (an image)", 0, 1, 64, 288, 121, 1, 1},
    {"cnn", "conv2 bias grad (an image)", 0, 0, 64, 1, 121, 1, 1},
    {"cnn", "conv2 input grad (an image)", 1, 0, 288, 121, 64, 1, 0},
    {"cnn", "conv1 weight grad (an image)", 0, 1, 32, 9, 676, 1, 1},
    {"cnn", "conv1 bias grad (an image)", 0, 0, 32, 1, 676, 1, 1},
};
#define NSHAPES (sizeof SHAPES / sizeof SHAPES[0])

struct result {
    double us;     /* one product */
    double gflops; /* its rate */
    int count;     /* a step's */
};

static int pos_arg(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* Times op(A) op(B) of m x n x k for at least secs (after a warm-up);
 * buffers are device memory big enough for every shape. */
static int time_gemm(struct psk_backend *be, int ta, int tb, int m, int n, int k, float beta,
                     const float *a, const float *b, float *c, double secs, double *us)
{
    int lda = ta ? m : k, ldb = tb ? k : n;
    for (int w = 0; w < 3; w++)
        if (psk_gemm(be, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, n) != 0)
            return -1;
    if (psk_sync(be) != 0)
        return -1;
    long reps = 0, batch = 1;
    double t0 = now_s(), t = 0;
    while (t < secs) {
        for (long r = 0; r < batch; r++)
            if (psk_gemm(be, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, n) != 0)
                return -1;
        if (psk_sync(be) != 0)
            return -1;
        reps += batch;
        t = now_s() - t0;
        if (batch < (1L << 20))
            batch *= 2;
    }
    *us = t / (double)reps * 1e6;
    return 0;
}

int main(int argc, char **argv)
{
    const char *device = "auto", *json = NULL;
    long batch = 64, peak = 4096;
    double secs = 0.2;
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--device") == 0 && v) {
            device = v;
        } else if (strcmp(a, "--json") == 0 && v) {
            json = v;
        } else if (strcmp(a, "--batch") == 0 && v) {
            if (pos_arg(v, 1, 4096, &batch) != 0) {
                fprintf(stderr, "gemm_bench: --batch '%s' is not in [1, 4096]\n", v);
                return 2;
            }
        } else if (strcmp(a, "--peak") == 0 && v) {
            if (pos_arg(v, 0, 16384, &peak) != 0) {
                fprintf(stderr, "gemm_bench: --peak '%s' is not in [0, 16384]\n", v);
                return 2;
            }
        } else if (strcmp(a, "--seconds") == 0 && v) {
            char *end;
            secs = strtod(v, &end);
            if (*end != '\0' || !(secs > 0 && secs <= 60)) {
                fprintf(stderr, "gemm_bench: --seconds '%s' is not in (0, 60]\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "gemm_bench: unknown or incomplete option '%s'\n", a);
            return 2;
        }
    }
    char err[256];
    struct psk_backend *be = NULL;
    if (psk_open(device, &be, err, sizeof err) != 0) {
        fprintf(stderr, "gemm_bench: device '%s': %s\n", device, err);
        return 1;
    }
    size_t most = (size_t)peak * (size_t)peak;
    for (size_t s = 0; s < NSHAPES; s++) {
        const struct shape *g = &SHAPES[s];
        size_t m = g->m ? (size_t)g->m : (size_t)batch, n = g->n ? (size_t)g->n : (size_t)batch,
               k = g->k ? (size_t)g->k : (size_t)batch;
        size_t big = m * k > k * n ? m * k : k * n;
        big = big > m * n ? big : m * n;
        most = most > big ? most : big;
    }
    float *host = malloc(most * sizeof(float));
    float *buf[3] = {NULL, NULL, NULL};
    if (host == NULL) {
        fprintf(stderr, "gemm_bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < most; i++)
        host[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (int i = 0; i < 3; i++)
        if (psk_alloc(be, most * sizeof(float), (void **)&buf[i]) != 0 ||
            psk_upload(be, buf[i], host, most * sizeof(float)) != 0) {
            fprintf(stderr, "gemm_bench: device memory: %s\n", psk_last_error(be));
            return 1;
        }
    printf("gemm_bench on %s, batch %ld, each shape for %.2f s\n", psk_describe(be), batch, secs);
    printf("%-34s %5s %5s %5s %7s %10s %9s\n", "product (m x n x k)", "m", "n", "k", "a step",
           "us each", "GFLOP/s");
    struct result res[NSHAPES];
    double step_us[2] = {0, 0};
    for (size_t s = 0; s < NSHAPES; s++) {
        const struct shape *g = &SHAPES[s];
        int m = g->m ? g->m : (int)batch, n = g->n ? g->n : (int)batch,
            k = g->k ? g->k : (int)batch;
        if (time_gemm(be, g->ta, g->tb, m, n, k, (float)g->beta, buf[0], buf[1], buf[2], secs,
                      &res[s].us) != 0) {
            fprintf(stderr, "gemm_bench: %s %s: %s\n", g->model, g->what, psk_last_error(be));
            return 1;
        }
        res[s].count = g->per_image ? (int)batch : 1;
        res[s].gflops = 2.0 * m * n * k / (res[s].us * 1e3);
        step_us[strcmp(g->model, "cnn") == 0] += res[s].us * res[s].count;
        printf("%-4s %-29s %5d %5d %5d %7d %10.2f %9.1f\n", g->model, g->what, m, n, k,
               res[s].count, res[s].us, res[s].gflops);
    }
    double peak_gflops = 0;
    if (peak > 0) {
        double us;
        int p = (int)peak;
        if (time_gemm(be, 0, 0, p, p, p, 0.0f, buf[0], buf[1], buf[2], secs, &us) != 0) {
            fprintf(stderr, "gemm_bench: peak: %s\n", psk_last_error(be));
            return 1;
        }
        peak_gflops = 2.0 * p * p * (double)p / (us * 1e3);
        printf("peak: %d x %d x %d, %.1f GFLOP/s\n", p, p, p, peak_gflops);
    }
    printf("a step's products at these rates: mlp %.1f us, cnn %.1f us\n", step_us[0], step_us[1]);
    if (json != NULL) {
        FILE *f = fopen(json, "w");
        if (f == NULL) {
            perror(json);
            return 1;
        }
        fprintf(f,
                "{\"device\": \"%s\", \"batch\": %ld, \"peak_gflops\": %.3f, "
                "\"mlp_step_gemm_us\": %.3f, \"cnn_step_gemm_us\": %.3f, \"shapes\": [",
                psk_kind_of(be) == PSK_CUDA ? "cuda" : "cpu", batch, peak_gflops, step_us[0],
                step_us[1]);
        for (size_t s = 0; s < NSHAPES; s++)
            fprintf(f,
                    "%s{\"model\": \"%s\", \"what\": \"%s\", \"us\": %.3f, \"gflops\": %.3f, "
                    "\"count\": %d}",
                    s ? ", " : "", SHAPES[s].model, SHAPES[s].what, res[s].us, res[s].gflops,
                    res[s].count);
        fprintf(f, "]}\n");
        if (fclose(f) != 0) {
            perror(json);
            return 1;
        }
    }
    for (int i = 0; i < 3; i++)
        psk_free(be, buf[i]);
    free(host);
    psk_close(be);
    return 0;
}
