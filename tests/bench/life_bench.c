/* What a sparse table's life cycle costs, in one process on one core:
 * requests of 64k random rows (dim 16) pulled and pushed (SGD) through
 * psd's table code
 *   - without a life cycle: every id already has a row;
 *   - with admission (admit_after 2) and eviction (evict_at_budget, and
 *     evict_after) on, the table at its budget: the same ids, every one
 *     with a row (what the bookkeeping costs); and ids from twice as many
 *     (half of each request new or evicted: counted, admitted, evicting
 *     old rows);
 * against a plain gather and scatter loop over rows of the same layout
 * indexed by the id itself (no hash: the fastest a row store can be).
 * Medians of --repeat requests; keys per second and the ratios. Reports,
 * never fails on a number. (The table where every id has a row is filled
 * with each id pushed until it has one: a halving of the sketch between
 * an id's two pushes leaves it counted once.)
 *
 *   life_bench [--repeat N] [--rows R] [--json PATH] */
#include "bench_stats.h"
#include "table.h"

#include "ps_clock.h"
#include "ps_shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIM  16u
#define KEYS (1u << 16)

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005u + 1442695040888963407u;
    return *s >> 21;
}

static struct psd_table *make(uint64_t rows, int life)
{
    Ps__TableSpec s;
    ps__table_spec__init(&s);
    s.name = life ? "life" : "plain";
    s.sparse = 1;
    s.dim = DIM;
    s.rows_max = rows;
    s.lr = 0.01f;
    s.init = PS__INIT_KIND__INIT_UNIFORM;
    s.init_scale = 0.1f;
    if (life) {
        s.admit_after = 2;
        s.evict_after = 1u << 30; /* its slices run; nothing gets that old here */
        s.evict_at_budget = 1;
    }
    struct psd_table *t = NULL;
    if (psd_table_create(&s, 0, 0, 1, &t) != 0) {
        fprintf(stderr, "life_bench: cannot create a table of %llu rows\n",
                (unsigned long long)rows);
        exit(1);
    }
    return t;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* KEYS distinct random ids below space, sorted. */
static size_t draw(uint64_t *rng, uint64_t space, uint64_t *keys)
{
    for (size_t i = 0; i < KEYS; i++)
        keys[i] = rng_next(rng) % space;
    qsort(keys, KEYS, sizeof *keys, cmp_u64);
    size_t n = 0;
    for (size_t i = 0; i < KEYS; i++)
        if (n == 0 || keys[i] != keys[n - 1])
            keys[n++] = keys[i];
    return n;
}

int main(int argc, char **argv)
{
    int repeat = 21;
    uint64_t rows = 1u << 20;
    const char *json = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--repeat") == 0 && atoi(argv[i + 1]) >= 1 && atoi(argv[i + 1]) <= 1000)
            repeat = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--rows") == 0 && atol(argv[i + 1]) >= KEYS)
            rows = (uint64_t)atol(argv[i + 1]);
        else if (strcmp(argv[i], "--json") == 0)
            json = argv[i + 1];
        else {
            fprintf(stderr, "usage: life_bench [--repeat N] [--rows R] [--json PATH]\n");
            return 2;
        }
    }
    if (argc % 2 == 0) {
        fprintf(stderr, "usage: life_bench [--repeat N] [--rows R] [--json PATH]\n");
        return 2;
    }
    uint64_t *keys = malloc(KEYS * sizeof *keys);
    float *g = malloc((size_t)KEYS * DIM * sizeof *g), *out = malloc((size_t)KEYS * DIM * 4);
    /* the plain store: row = id, over the ids the life table sees (2x its rows) */
    uint64_t space = 2 * rows;
    float *plain = calloc(space * DIM, sizeof *plain);
    if (keys == NULL || g == NULL || out == NULL || plain == NULL) {
        fprintf(stderr, "life_bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < (size_t)KEYS * DIM; i++)
        g[i] = 1e-3f;
    struct psd_table *off = make(space, 0), *on = make(rows, 1), *steady = make(space, 1);
    char err[256];
    uint64_t rng = 1;
    /* fill: every id has a row in the plain table; the life table is
     * pushed until it is at its budget (each id twice: admitted) */
    for (uint64_t b = 0; b < space; b += KEYS) {
        size_t n = 0;
        for (uint64_t k = b; k < b + KEYS && k < space; k++)
            keys[n++] = k;
        psd_table_push_rows(off, keys, g, n, err, sizeof err);
        psd_table_push_rows(steady, keys, g, n, err, sizeof err); /* counted */
        psd_table_push_rows(steady, keys, g, n, err, sizeof err); /* admitted */
    }
    while (on->sp.nrows < rows) {
        size_t n = draw(&rng, space, keys);
        psd_table_push_rows(on, keys, g, n, err, sizeof err);
        psd_table_push_rows(on, keys, g, n, err, sizeof err);
    }
    if (steady->sp.nrows != space) { /* a halving between an id's two pushes: again */
        for (uint64_t b = 0; b < space && steady->sp.nrows < space; b += KEYS) {
            size_t n = 0;
            for (uint64_t k = b; k < b + KEYS && k < space; k++)
                keys[n++] = k;
            for (int k = 0; k < 3; k++)
                psd_table_push_rows(steady, keys, g, n, err, sizeof err);
        }
    }
    printf("(every id a row: %llu of %llu)\n", (unsigned long long)steady->sp.nrows,
           (unsigned long long)space);
    double t_off_push[1000], t_off_pull[1000], t_on_push[1000], t_on_pull[1000];
    double t_scatter[1000], t_gather[1000], t_st_push[1000], t_st_pull[1000];
    uint64_t ev0 = on->sp.evicted_budget, adm0 = on->sp.admitted, seen = 0;
    for (int r = 0; r < repeat; r++) {
        size_t n = draw(&rng, space, keys);
        seen += n;
        double t0 = ps_mono_s();
        psd_table_pull_rows(off, keys, n, out, err, sizeof err);
        double t1 = ps_mono_s();
        psd_table_push_rows(off, keys, g, n, err, sizeof err);
        double t2 = ps_mono_s();
        psd_table_pull_rows(on, keys, n, out, err, sizeof err);
        double t3 = ps_mono_s();
        psd_table_push_rows(on, keys, g, n, err, sizeof err);
        double t4 = ps_mono_s();
        bench_gather(out, plain, keys, n, DIM);
        double t5 = ps_mono_s();
        bench_scatter(plain, keys, g, n, DIM, 0.01f);
        double t6 = ps_mono_s();
        psd_table_pull_rows(steady, keys, n, out, err, sizeof err);
        double t7 = ps_mono_s();
        psd_table_push_rows(steady, keys, g, n, err, sizeof err);
        double t8 = ps_mono_s();
        t_st_pull[r] = (t7 - t6) / (double)n;
        t_st_push[r] = (t8 - t7) / (double)n;
        t_off_pull[r] = (t1 - t0) / (double)n;
        t_off_push[r] = (t2 - t1) / (double)n;
        t_on_pull[r] = (t3 - t2) / (double)n;
        t_on_push[r] = (t4 - t3) / (double)n;
        t_gather[r] = (t5 - t4) / (double)n;
        t_scatter[r] = (t6 - t5) / (double)n;
    }
    double op = 1 / bench_median(t_off_pull, repeat), os = 1 / bench_median(t_off_push, repeat);
    double np = 1 / bench_median(t_on_pull, repeat), ns = 1 / bench_median(t_on_push, repeat);
    double gp = 1 / bench_median(t_gather, repeat), gs = 1 / bench_median(t_scatter, repeat);
    double sp = 1 / bench_median(t_st_pull, repeat), ss = 1 / bench_median(t_st_push, repeat);
    printf("requests of up to %u random rows of %u floats, %llu ids, the life table's budget "
           "%llu rows; median of %d, keys/s on one core\n",
           KEYS, DIM, (unsigned long long)space, (unsigned long long)rows, repeat);
    printf("%-34s %14s %14s\n", "", "pull", "push (SGD)");
    printf("%-34s %14.3g %14.3g\n", "plain loop (row = id, no hash)", gp, gs);
    printf("%-34s %14.3g %14.3g\n", "psd, no life cycle", op, os);
    printf("%-34s %14.3g %14.3g\n", "psd, life cycle, every id a row", sp, ss);
    printf("%-34s %14.3g %14.3g\n", "psd, life cycle, half the ids new", np, ns);
    printf("life cycle against none, every id a row: pull %.1f%%, push %.1f%%; half new: pull "
           "%.1f%%, push %.1f%%\npsd against the loop: pull %.1f%%, push %.1f%% (with the life "
           "cycle, every id a row: %.1f%%, %.1f%%)\n",
           100 * sp / op, 100 * ss / os, 100 * np / op, 100 * ns / os, 100 * op / gp, 100 * os / gs,
           100 * sp / gp, 100 * ss / gs);
    printf("during the timed requests: %llu keys, %llu rows made, %llu evicted for room\n",
           (unsigned long long)seen, (unsigned long long)(on->sp.admitted - adm0),
           (unsigned long long)(on->sp.evicted_budget - ev0));
    if (json != NULL) {
        FILE *f = fopen(json, "w");
        if (f == NULL) {
            perror(json);
            return 1;
        }
        fprintf(f,
                "{\"gather_keys_per_s\": %.0f, \"scatter_keys_per_s\": %.0f, "
                "\"pull_keys_per_s\": %.0f, \"push_keys_per_s\": %.0f, "
                "\"life_pull_keys_per_s\": %.0f, \"life_push_keys_per_s\": %.0f, "
                "\"churn_pull_keys_per_s\": %.0f, \"churn_push_keys_per_s\": %.0f}\n",
                gp, gs, op, os, sp, ss, np, ns);
        fclose(f);
    }
    psd_table_destroy(off);
    psd_table_destroy(on);
    psd_table_destroy(steady);
    free(plain);
    free(keys);
    free(g);
    free(out);
    return 0;
}
