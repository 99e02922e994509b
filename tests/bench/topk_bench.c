/* topk_bench: top-k selection by magnitude on the host, the sampled
 * selection (psk_topk_sampled, what psworker --topk and psc_topk_select
 * run) against the exact one it falls back to (psk_topk_exact, the
 * selection before sampling), in the same run: the median time of each
 * per call, their ratio, the sampled one's mean (what a run of many
 * steps pays, its retries and fallbacks included), and how often it
 * retried with a lower threshold and fell back. Sizes:
 * psworker's MLP (235,146 weights), its CNN (421,642) and 4M; ratios
 * 1% and 0.1%; gradients drawn as N(0, 1) with heavier tails
 * (a normal's cube), fresh each call.
 *
 *   topk_bench [--calls N] [--json PATH]
 * Never fails on a number: exit 1 only when a call fails. */
#include "bench_stats.h"
#include "psk_select.h"

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

static float gauss(uint64_t *s)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
        u[i] = ((double)(*s >> 11) + 0.5) / 9007199254740992.0;
    }
    return (float)(sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

int main(int argc, char **argv)
{
    int calls = 21;
    const char *json = NULL;
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--calls") == 0 && v && atoi(v) >= 1 && atoi(v) <= 10000) {
            calls = atoi(v);
        } else if (strcmp(argv[i], "--json") == 0 && v) {
            json = v;
        } else {
            fprintf(stderr, "topk_bench: unknown or incomplete option '%s'\n", argv[i]);
            return 2;
        }
    }
    const size_t sizes[] = {235146, 421642, 4u << 20};
    const double ratios[] = {0.01, 0.001};
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (json && jf == NULL) {
        perror(json);
        return 1;
    }
    if (jf)
        fprintf(jf, "[");
    printf("%10s %6s %8s %12s %12s %8s %12s %9s %10s\n", "n", "ratio", "k", "exact us",
           "sampled us", "speedup", "sampled mean", "retried", "fell back");
    int first = 1;
    uint64_t seed = 3;
    for (size_t a = 0; a < sizeof sizes / sizeof sizes[0]; a++) {
        size_t n = sizes[a];
        float *g = malloc(n * sizeof *g), *v = malloc(n * sizeof *v);
        for (size_t b = 0; b < sizeof ratios / sizeof ratios[0]; b++) {
            size_t k = (size_t)ceil(ratios[b] * (double)n);
            uint64_t *idx = malloc(k * sizeof *idx);
            float *val = malloc(k * sizeof *val);
            double *te = malloc((size_t)calls * sizeof *te),
                   *ts = malloc((size_t)calls * sizeof *ts);
            if (!g || !v || !idx || !val || !te || !ts) {
                fprintf(stderr, "topk_bench: out of memory\n");
                return 1;
            }
            int fell = 0, retried = 0;
            double sum = 0;
            for (int c = 0; c < calls; c++) {
                for (size_t i = 0; i < n; i++) {
                    float x = gauss(&seed);
                    g[i] = c % 2 ? x * x * x : x;
                }
                /* interleaved, each on its own copy of the same gradient */
                memcpy(v, g, n * sizeof *v);
                double t0 = now_s();
                int rc = psk_topk_exact(n, v, NULL, k, idx, val);
                te[c] = now_s() - t0;
                memcpy(v, g, n * sizeof *v);
                int path = 0;
                t0 = now_s();
                rc |= psk_topk_sampled(n, v, NULL, k, idx, val, &path);
                ts[c] = now_s() - t0;
                sum += ts[c];
                fell += path == PSK_TOPK_PATH_EXACT;
                retried += path == PSK_TOPK_PATH_RETRIED;
                if (rc != 0) {
                    fprintf(stderr, "topk_bench: selection failed (%d)\n", rc);
                    return 1;
                }
            }
            double e = bench_median(te, calls) * 1e6, s = bench_median(ts, calls) * 1e6;
            double mean = sum / calls * 1e6;
            printf("%10zu %5.1f%% %8zu %12.1f %12.1f %7.1fx %12.1f %5d/%d %6d/%d\n", n,
                   ratios[b] * 100, k, e, s, e / s, mean, retried, calls, fell, calls);
            if (jf)
                fprintf(jf,
                        "%s\n {\"n\": %zu, \"ratio\": %g, \"k\": %zu, \"exact_us\": %.1f, "
                        "\"sampled_us\": %.1f, \"sampled_mean_us\": %.1f, \"retried\": %d, "
                        "\"fell_back\": %d, \"calls\": %d}",
                        first ? "" : ",", n, ratios[b], k, e, s, mean, retried, fell, calls);
            first = 0;
            free(idx);
            free(val);
            free(te);
            free(ts);
        }
        free(g);
        free(v);
    }
    if (jf) {
        fprintf(jf, "\n]\n");
        fclose(jf);
    }
    return 0;
}
