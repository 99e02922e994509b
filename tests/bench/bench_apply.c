/* Server apply rate beside the memory's own limits, in one process.
 *
 * Dense: SGD, momentum and Adam over a 64 MiB shard through psd's table
 * code, against memcpy of the same bytes. An optimizer touches 3 floats per
 * parameter for SGD (read w, read g, write w), 5 for momentum, 7 for Adam;
 * memcpy touches 2 (read, write); the ratio compares bytes per second.
 * Sparse: 1M random sorted keys into a 10M-element table through the
 * keyed-push path, and into a sparse table of 10M rows (dim 1, every row
 * already there, created in random order: a hash lookup per key), against a plain scatter loop
 * doing the same SGD update; and a pull of the same rows against a plain
 * gather loop reading the same values.
 * Median of --repeat runs. Prints a table and the ratios; never fails on
 * numbers. --json PATH writes them for comparison over time. */
#include "bench_stats.h"
#include "table.h"

#include "ps_clock.h"
#include "ps_finite.h"
#include "ps_init.h"
#include "ps_opts.h"
#include "ps_shard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REPEAT_MAX 100 /* --repeat: the timings kept of each */

/* n elements dense, or (rows > 0) a sparse table of dim 1 holding rows */
static struct psd_table *make(const char *name, uint64_t n, Ps__OptimizerKind opt, uint64_t rows)
{
    Ps__TableSpec s;
    ps__table_spec__init(&s);
    s.name = (char *)name;
    s.size = n;
    s.sparse = rows > 0;
    s.dim = rows > 0 ? 1 : 0;
    s.rows_max = rows;
    s.optimizer = opt;
    s.lr = 0.01f;
    s.momentum = 0.9f;
    s.beta1 = 0.9f;
    s.beta2 = 0.999f;
    s.eps = 1e-8f;
    s.init = PS__INIT_KIND__INIT_UNIFORM;
    s.init_scale = 0.1f;
    struct psd_table *t = NULL;
    if (psd_table_create(&s, 0, 0, 1, &t) != 0) {
        fprintf(stderr, "bench_apply: cannot allocate %llu elements\n", (unsigned long long)n);
        exit(1);
    }
    return t;
}

int main(int argc, char **argv)
{
    int repeat = 5;
    FILE *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) {
            uint64_t v = 0;
            if (ps_parse_u64(argv[++i], 1, REPEAT_MAX, &v) != 0) {
                fprintf(stderr,
                        "bench_apply: --repeat must be a whole number from 1 to %d, not '%s'\n",
                        REPEAT_MAX, argv[i]);
                return 2;
            }
            repeat = (int)v;
        } else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
            if (json != NULL)
                fclose(json);
            if ((json = fopen(argv[++i], "w")) == NULL) {
                fprintf(stderr, "bench_apply: --json %s: %s\n", argv[i], strerror(errno));
                return 1;
            }
        } else {
            fprintf(stderr, "usage: bench_apply [--repeat N] [--json PATH]\n");
            return 2;
        }
    }
    const uint64_t n = 16u << 20; /* 64 MiB of f32 */
    float *g = malloc(n * 4), *dst = malloc(n * 4);
    if (g == NULL || dst == NULL) {
        fprintf(stderr, "bench_apply: cannot allocate 2 x %llu bytes\n", (unsigned long long)n * 4);
        return 1;
    }
    ps_init_fill(g, n, PS_INIT_UNIFORM, 0.01f, 2, 0);
    memset(dst, 1, n * 4);
    double t_copy[REPEAT_MAX], t_opt[3][REPEAT_MAX], t_check[REPEAT_MAX];
    size_t bad = 0;
    const Ps__OptimizerKind kinds[3] = {PS__OPTIMIZER_KIND__OPT_SGD,
                                        PS__OPTIMIZER_KIND__OPT_MOMENTUM,
                                        PS__OPTIMIZER_KIND__OPT_ADAM};
    const char *names[3] = {"sgd", "momentum", "adam"};
    const int floats_touched[3] = {3, 5, 7};
    struct psd_table *t[3];
    for (int k = 0; k < 3; k++)
        t[k] = make(names[k], n, kinds[k], 0);
    for (int r = 0; r < repeat; r++) { /* interleaved, so drift hits all alike */
        double a = ps_mono_s();
        memcpy(dst, g, n * 4);
        t_copy[r] = ps_mono_s() - a;
        a = ps_mono_s(); /* psd's look for a NaN or an infinity before each push */
        bad += ps_first_nonfinite(g, n) != n;
        t_check[r] = ps_mono_s() - a;
        for (int k = 0; k < 3; k++) {
            a = ps_mono_s();
            psd_table_apply(t[k], 0, n, g, (uint64_t)r + 1);
            t_opt[k][r] = ps_mono_s() - a;
        }
    }
    double copy = bench_median(t_copy, repeat);
    double copy_bw = 2.0 * n * 4 / copy;
    printf("\napply over a dense shard of %llu floats (64 MiB), median of %d\n",
           (unsigned long long)n, repeat);
    printf("%-14s %12s %14s %12s\n", "", "ms", "updates/s", "GB/s touched");
    printf("%-14s %12.2f %14s %12.2f\n", "memcpy", copy * 1e3, "-", copy_bw / 1e9);
    double ratio[3], check = bench_median(t_check, repeat), check_share[3];
    for (int k = 0; k < 3; k++) {
        double s = bench_median(t_opt[k], repeat), bw = (double)floats_touched[k] * n * 4 / s;
        ratio[k] = bw / copy_bw;
        check_share[k] = check / s;
        printf("%-14s %12.2f %14.3g %12.2f\n", names[k], s * 1e3, n / s, bw / 1e9);
    }
    printf("%-14s %12.2f   (%.1f%% of sgd's apply, %.1f%% of adam's; %zu found)\n", "finite check",
           check * 1e3, 100 * check_share[0], 100 * check_share[2], bad);
    /* pushes as psd sees them: 1 MiB of gradient just received (in the
     * cache), checked, then applied to the next 1 MiB of the table (whose
     * weights are not: the table is 64 MiB) */
    enum { SMALL = 1 << 18, ROUNDS = 64 };
    size_t (*volatile look)(const float *, size_t) = ps_first_nonfinite; /* each call made */
    double t_fc[REPEAT_MAX], t_sa[3][REPEAT_MAX], small_share[3];
    for (int r = 0; r < repeat; r++) {
        t_fc[r] = t_sa[0][r] = t_sa[1][r] = t_sa[2][r] = 0;
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < ROUNDS; i++) {
                uint64_t off = (uint64_t)((r * ROUNDS + i) % (int)(n / SMALL)) * SMALL;
                double a = ps_mono_s();
                bad += look(g + off, SMALL) != SMALL;
                double b = ps_mono_s();
                psd_table_apply(t[k], off, SMALL, g + off, (uint64_t)(repeat + r * ROUNDS + i) + 1);
                t_fc[r] += k == 0 ? b - a : 0;
                t_sa[k][r] += ps_mono_s() - b;
            }
    }
    for (int k = 0; k < 3; k++)
        small_share[k] = bench_median(t_fc, repeat) / bench_median(t_sa[k], repeat);
    printf("%-14s %12.4f   (a 1 MiB push: %.1f%% of sgd's apply of it, %.1f%% of momentum's, "
           "%.1f%% of adam's)\n",
           "finite check", bench_median(t_fc, repeat) / ROUNDS * 1e3, 100 * small_share[0],
           100 * small_share[1], 100 * small_share[2]);
    double small_share_sgd = small_share[0];

    /* sparse: 1M sorted random keys into 10M elements */
    const uint64_t rows = 10000000u, nk = 1u << 20;
    struct psd_table *st = make("sparse", rows, PS__OPTIMIZER_KIND__OPT_SGD, 0);
    struct psd_table *rt = make("rows", 0, PS__OPTIMIZER_KIND__OPT_SGD, rows);
    char err[256];
    uint64_t *all = malloc(rows * 8);
    float *zero = calloc(rows, 4);
    for (uint64_t i = 0; i < rows; i++)
        all[i] = i;
    /* rows created in a random order, as a table's first touches make them:
     * then rows next in key order are not next in memory */
    for (uint64_t i = rows - 1, h = 3; i > 0; i--) {
        h = ps_mix64(h);
        uint64_t j = h % (i + 1), x = all[i];
        all[i] = all[j];
        all[j] = x;
    }
    if (psd_table_push_rows(rt, all, zero, rows, err, sizeof err) != 0) {
        fprintf(stderr, "bench_apply: %s\n", err);
        return 1;
    }
    free(all);
    free(zero);
    uint64_t *keys = malloc(nk * 8);
    float *plain = malloc(rows * 4);
    memcpy(plain, st->w, rows * 4);
    uint64_t step = rows / nk, h = 7;
    for (uint64_t i = 0; i < nk; i++) { /* sorted, unique, random within strata */
        h = ps_mix64(h);
        keys[i] = i * step + h % step;
    }
    double t_sp[REPEAT_MAX], t_sc[REPEAT_MAX], t_rw[REPEAT_MAX], t_rp[REPEAT_MAX], t_ga[REPEAT_MAX];
    float *out = malloc(nk * 4);
    for (int r = 0; r < repeat; r++) {
        double a = ps_mono_s();
        psd_table_apply_keys(st, keys, g, nk, (uint64_t)r + 1);
        t_sp[r] = ps_mono_s() - a;
        a = ps_mono_s();
        psd_table_push_rows(rt, keys, g, nk, err, sizeof err);
        t_rw[r] = ps_mono_s() - a;
        a = ps_mono_s();
        for (uint64_t i = 0; i < nk; i++) /* the same SGD update, plainly */
            plain[keys[i]] -= 0.01f * g[i];
        t_sc[r] = ps_mono_s() - a;
        a = ps_mono_s();
        psd_table_pull_rows(rt, keys, nk, out, err, sizeof err);
        t_rp[r] = ps_mono_s() - a;
        a = ps_mono_s();
        for (uint64_t i = 0; i < nk; i++) /* the same values read, plainly */
            out[i] = plain[keys[i]];
        t_ga[r] = ps_mono_s() - a;
        if (out[nk / 2] != plain[keys[nk / 2]]) /* keeps the loop */
            fprintf(stderr, "bench_apply: the gather loop read %g\n", (double)out[nk / 2]);
    }
    double sp = bench_median(t_sp, repeat), sc = bench_median(t_sc, repeat),
           rw = bench_median(t_rw, repeat), rp = bench_median(t_rp, repeat),
           ga = bench_median(t_ga, repeat);
    printf("\nsparse apply of %llu random keys into %llu elements, median of %d\n",
           (unsigned long long)nk, (unsigned long long)rows, repeat);
    printf("%-14s %12s %14s\n", "", "ms", "updates/s");
    printf("%-14s %12.2f %14.3g\n", "scatter loop", sc * 1e3, nk / sc);
    printf("%-14s %12.2f %14.3g\n", "psd (sgd)", sp * 1e3, nk / sp);
    printf("%-14s %12.2f %14.3g   (sparse table of %llu rows: hash lookup per key)\n", "psd rows",
           rw * 1e3, nk / rw, (unsigned long long)rows);
    printf("%-14s %12.2f %14.3g\n", "gather loop", ga * 1e3, nk / ga);
    printf("%-14s %12.2f %14.3g   (the same rows read)\n", "psd row pull", rp * 1e3, nk / rp);
    printf("\nratios: sgd %.1f%%, momentum %.1f%%, adam %.1f%% of memcpy's bytes/s; "
           "sparse %.1f%%, rows %.1f%% of the scatter loop; row pull %.1f%% of the gather loop\n",
           100 * ratio[0], 100 * ratio[1], 100 * ratio[2], 100 * sc / sp, 100 * sc / rw,
           100 * ga / rp);
    if (json != NULL) {
        fprintf(json,
                "{\"memcpy_gbps\": %.3f, \"sgd_ratio\": %.4f, \"momentum_ratio\": %.4f, "
                "\"adam_ratio\": %.4f, \"sparse_updates_per_s\": %.0f, "
                "\"scatter_updates_per_s\": %.0f, \"sparse_ratio\": %.4f, "
                "\"rows_updates_per_s\": %.0f, \"rows_ratio\": %.4f, "
                "\"row_pulls_per_s\": %.0f, \"gather_per_s\": %.0f, \"row_pull_ratio\": %.4f, "
                "\"finite_check_sgd_share\": %.4f, \"finite_check_cached_share\": %.4f}\n",
                copy_bw / 1e9, ratio[0], ratio[1], ratio[2], nk / sp, nk / sc, sc / sp, nk / rw,
                sc / rw, nk / rp, nk / ga, ga / rp, check_share[0], small_share_sgd);
        if (fclose(json) != 0) {
            fprintf(stderr, "bench_apply: writing --json: %s\n", strerror(errno));
            return 1;
        }
    }
    for (int k = 0; k < 3; k++)
        psd_table_destroy(t[k]);
    psd_table_destroy(st);
    psd_table_destroy(rt);
    free(g);
    free(dst);
    free(keys);
    free(plain);
    free(out);
    return 0;
}
