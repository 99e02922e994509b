/* gen_clicks: writes a synthetic click-style data set in libsvm text format
 * from a seeded ground-truth logistic model, so that tests and benchmarks
 * have data with a known optimum.
 *
 *   gen_clicks --out DIR [--train N] [--test M] [--features F] [--active K]
 *              [--alpha A] [--seed S]
 *
 * Each example activates K distinct features (value 1) drawn from a Zipf
 * law of exponent A over F features (a few very common, a long tail of
 * rare ones: millions of distinct keys are possible); its label is 1 with
 * probability sigmoid(b + sum of the true weights). Writes DIR/train.svm,
 * DIR/test.svm and DIR/truth.json holding the true model's own log-loss on
 * the test set: what a perfect learner would score. */
#include "ps_init.h"
#include "ps_opts.h"
#include "ps_shard.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct cfg {
    const char *out;
    uint64_t train, test, features, active, seed;
    double alpha;
    int help;
};

static const struct ps_opt opts[] = {
    {"out", PS_OPT_STR, offsetof(struct cfg, out), NULL, 0, 0, 0, 0, "DIR", "output directory"},
    {"train", PS_OPT_U64, offsetof(struct cfg, train), "100000", 1, 100000000, 0, 0, "N",
     "training examples"},
    {"test", PS_OPT_U64, offsetof(struct cfg, test), "20000", 1, 100000000, 0, 0, "M",
     "held-out examples"},
    {"features", PS_OPT_U64, offsetof(struct cfg, features), "1000", 2, 50000000, 0, 0, "F",
     "distinct features"},
    {"active", PS_OPT_U64, offsetof(struct cfg, active), "8", 1, 1000, 0, 0, "K",
     "features per example"},
    {"alpha", PS_OPT_F64, offsetof(struct cfg, alpha), "1.1", 0, 0, 0.0, 3.0, "A",
     "Zipf exponent of feature frequencies"},
    {"seed", PS_OPT_U64, offsetof(struct cfg, seed), "1", 0, UINT64_MAX, 0, 0, "S", "seed"},
    {"help", PS_OPT_FLAG, offsetof(struct cfg, help), NULL, 0, 0, 0, 0, NULL,
     "show this help and exit"},
};

#define NOPTS (sizeof opts / sizeof opts[0])

/* mkdir -p: dir and the folders above it. 0, or -1 with errno. */
static int make_dirs(const char *dir)
{
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *q = p + 1; *q != '\0'; q++) {
        if (*q != '/')
            continue;
        *q = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return -1;
        *q = '/';
    }
    return mkdir(p, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static double true_weight(uint64_t seed, uint64_t f)
{
    return ps_init_value(PS_INIT_NORMAL, 0.6f, seed, f);
}

static uint64_t draw(const double *cdf, uint64_t n, double u)
{
    uint64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Writes n examples; returns the true model's mean log-loss on them. */
static double write_split(const struct cfg *c, const char *path, uint64_t n, const double *cdf,
                          uint64_t *state)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "gen_clicks: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    const double bias = -1.0;
    uint64_t feats[1000];
    double loss = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t k = 0;
        for (int tries = 0; k < c->active && tries < 100000; tries++) {
            *state = ps_mix64(*state + 1);
            uint64_t x = draw(cdf, c->features, ps_unit_double(*state));
            int dup = 0;
            for (uint64_t j = 0; j < k && !dup; j++)
                dup = feats[j] == x;
            if (!dup)
                feats[k++] = x;
        }
        qsort(feats, k, sizeof *feats, cmp_u64);
        double z = bias;
        for (uint64_t j = 0; j < k; j++)
            z += true_weight(c->seed, feats[j]);
        double p = 1.0 / (1.0 + exp(-z));
        *state = ps_mix64(*state + 1);
        int y = ps_unit_double(*state) < p;
        loss -= y ? log(p) : log(1.0 - p);
        fprintf(f, "%d", y);
        for (uint64_t j = 0; j < k; j++)
            fprintf(f, " %llu:1", (unsigned long long)feats[j]);
        fputc('\n', f);
    }
    fclose(f);
    return loss / (double)n;
}

int main(int argc, char **argv)
{
    struct cfg c;
    char err[256];
    memset(&c, 0, sizeof c);
    if (ps_opts_parse(opts, NOPTS, &c, argc, argv, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "gen_clicks: %s (see --help)\n", err);
        return 2;
    }
    if (c.help) {
        ps_opts_usage(stdout, "gen_clicks --out DIR [OPTIONS]",
                      "Writes DIR/train.svm and DIR/test.svm (libsvm text) from a seeded logistic "
                      "model, and DIR/truth.json with that model's own test log-loss.",
                      opts, NOPTS);
        return 0;
    }
    if (c.out == NULL) {
        fprintf(stderr, "gen_clicks: --out DIR is required (see --help)\n");
        return 2;
    }
    if (c.active > c.features) {
        fprintf(stderr,
                "gen_clicks: --active %llu is more than --features %llu: an example "
                "takes distinct features\n",
                (unsigned long long)c.active, (unsigned long long)c.features);
        return 2;
    }
    if (make_dirs(c.out) != 0) {
        fprintf(stderr, "gen_clicks: --out %s: cannot create it: %s\n", c.out, strerror(errno));
        return 1;
    }
    double *cdf = malloc(c.features * sizeof *cdf), sum = 0;
    if (cdf == NULL)
        return 1;
    for (uint64_t f = 0; f < c.features; f++)
        cdf[f] = (sum += pow((double)(f + 1), -c.alpha));
    for (uint64_t f = 0; f < c.features; f++)
        cdf[f] /= sum;
    char path[4096];
    uint64_t state = ps_mix64(c.seed ^ UINT64_C(0xc11c));
    snprintf(path, sizeof path, "%s/train.svm", c.out);
    write_split(&c, path, c.train, cdf, &state);
    snprintf(path, sizeof path, "%s/test.svm", c.out);
    double truth = write_split(&c, path, c.test, cdf, &state);
    snprintf(path, sizeof path, "%s/truth.json", c.out);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "gen_clicks: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    fprintf(f, "{\"test_logloss\": %.6f, \"features\": %llu, \"train\": %llu, \"test\": %llu}\n",
            truth, (unsigned long long)c.features, (unsigned long long)c.train,
            (unsigned long long)c.test);
    fclose(f);
    printf("gen_clicks: %llu + %llu examples over %llu features; true test log-loss %.6f\n",
           (unsigned long long)c.train, (unsigned long long)c.test, (unsigned long long)c.features,
           truth);
    free(cdf);
    return 0;
}
