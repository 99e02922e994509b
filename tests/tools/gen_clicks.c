/* gen_clicks: writes a synthetic click-style data set in libsvm text format
 * from a seeded ground-truth logistic model, so that tests and benchmarks
 * have data with a known optimum.
 *
 *   gen_clicks --out DIR [--train N] [--test M] [--features F] [--active K]
 *              [--alpha A] [--seed S]
 *   gen_clicks --criteo --out DIR [--train N] [--test M] [--features F]
 *              [--alpha A] [--drift D] [--fresh P] [--seed S]
 *
 * Each example activates K distinct features (value 1) drawn from a Zipf
 * law of exponent A over F features (a few very common, a long tail of
 * rare ones: millions of distinct keys are possible); its label is 1 with
 * probability sigmoid(b + sum of the true weights). Writes DIR/train.svm,
 * DIR/test.svm and DIR/truth.json holding the true model's own log-loss on
 * the test set: what a perfect learner would score.
 *
 * --criteo writes Criteo's shape instead (see write_criteo): 13 count
 * features and 26 categorical ones per example, in DIR/train.bin and
 * DIR/test.bin (fixed records), with ids that arrive and fade over the
 * stream. */
#include "ps_fs.h"
#include "ps_init.h"
#include "ps_opts.h"
#include "ps_shard.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cfg {
    const char *out;
    uint64_t train, test, features, active, seed;
    double alpha, drift, fresh;
    int criteo, help;
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
    {"criteo", PS_OPT_FLAG, offsetof(struct cfg, criteo), NULL, 0, 0, 0, 0, NULL,
     "Criteo's shape: 13 counts and 26 categorical fields per example, in .bin records"},
    {"drift", PS_OPT_F64, offsetof(struct cfg, drift), "0.5", 0, 0, 0.0, 10.0, "D",
     "--criteo: the share of each field's vocabulary replaced over the training stream"},
    {"fresh", PS_OPT_F64, offsetof(struct cfg, fresh), "0.05", 0, 0, 0.0, 1.0, "P",
     "--criteo: the chance that a draw of a large field is an id seen only once"},
    {"help", PS_OPT_FLAG, offsetof(struct cfg, help), NULL, 0, 0, 0, 0, NULL,
     "show this help and exit"},
};

#define NOPTS (sizeof opts / sizeof opts[0])

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

/* --criteo: Criteo's shape. Each example has 13 count features and 26
 * categorical fields, written as one fixed little-endian record:
 *
 *   float label; float counts[13]; uint64_t ids[26];     (264 bytes)
 *
 * Field f draws a popularity rank from a Zipf law of exponent --alpha
 * over F >> 2(f mod 5) ranks (fields of F, F/4, ... F/256 live ids, as
 * Criteo's range from millions to a handful). A rank is a slot whose id
 * is replaced now and then: over the training stream, a share --drift of
 * the slots get a new id, each at its own time, so new ids keep arriving
 * at every popularity and old ones go quiet for good. In the two largest
 * field shapes a draw is, with chance --fresh, an id seen only once. Ids
 * are 40-bit hashes. The test examples continue the stream (the day
 * after, as in Criteo's own split).
 *
 * The label is 1 with probability sigmoid(z), z the sum of a bias, a
 * weight per count feature times log(1 + count), a weight per id and a
 * factorization machine's pairwise term over the ids' 4-float latent
 * vectors: what a DLRM's embeddings and their dot products can learn. */
enum { CRITEO_COUNTS = 13, CRITEO_FIELDS = 26, CRITEO_LATENT = 4 };

struct criteo_rec {
    float label;
    float counts[CRITEO_COUNTS];
    uint64_t ids[CRITEO_FIELDS];
};

struct criteo {
    const struct cfg *c;
    double *cdf[5];
    uint64_t ranks[5], fresh_next;
    uint64_t *seen[CRITEO_FIELDS]; /* the training ids, to count distinct ones */
};

static uint64_t criteo_id(const struct criteo *k, int f, uint64_t rank, double t)
{
    /* The slot's phase spreads its replacements over the stream. */
    uint64_t h = ps_mix64(k->c->seed ^ ps_mix64(((uint64_t)f << 40) ^ rank));
    double gen = t * k->c->drift + ps_unit_double(h);
    uint64_t g = gen < 0 ? 0 : (uint64_t)gen;
    return ps_mix64(h ^ ps_mix64(g + 0x9e37)) >> 24;
}

/* The truth's parameters of an id, drawn from its hash. */
static double criteo_weight(uint64_t seed, int f, uint64_t id)
{
    return ps_init_value(PS_INIT_NORMAL, 0.25f, seed ^ 0xa11, id * 32 + (uint64_t)f);
}

static double criteo_latent(uint64_t seed, int f, uint64_t id, int j)
{
    return ps_init_value(PS_INIT_NORMAL, 0.15f, seed ^ 0xfac, (id * 32 + (uint64_t)f) * 4 + j);
}

/* Writes examples [first, first + n) of the stream; returns the truth's
 * mean log-loss on them. */
static double write_criteo(struct criteo *k, const char *path, uint64_t first, uint64_t n,
                           uint64_t *state)
{
    const struct cfg *c = k->c;
    FILE *out = fopen(path, "wb");
    if (out == NULL) {
        fprintf(stderr, "gen_clicks: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    double loss = 0;
    for (uint64_t i = first; i < first + n; i++) {
        struct criteo_rec r;
        memset(&r, 0, sizeof r);
        double t = (double)i / (double)c->train, z = -1.2;
        for (int j = 0; j < CRITEO_COUNTS; j++) {
            *state = ps_mix64(*state + 1);
            double g = ps_init_value(PS_INIT_NORMAL, 1.0f, *state, (uint64_t)j);
            double x = floor(exp(0.5 + 0.25 * (j % 4) + g));
            r.counts[j] = (float)x;
            z += ps_init_value(PS_INIT_NORMAL, 0.15f, c->seed ^ 0xd, (uint64_t)j) *
                 (log1p(x) - (0.9 + 0.25 * (j % 4)));
        }
        double v[CRITEO_FIELDS][CRITEO_LATENT], sum[CRITEO_LATENT] = {0}, sq = 0;
        for (int f = 0; f < CRITEO_FIELDS; f++) {
            int shape = f % 5;
            *state = ps_mix64(*state + 1);
            uint64_t id;
            if (shape <= 1 && ps_unit_double(*state) < c->fresh) {
                id = ps_mix64(c->seed ^ ps_mix64(0xf7e54 + k->fresh_next++)) >> 24;
            } else {
                *state = ps_mix64(*state + 1);
                uint64_t rank = draw(k->cdf[shape], k->ranks[shape], ps_unit_double(*state));
                id = criteo_id(k, f, rank, t);
            }
            r.ids[f] = id;
            if (k->seen[f] != NULL)
                k->seen[f][i - first] = id;
            z += criteo_weight(c->seed, f, id);
            for (int j = 0; j < CRITEO_LATENT; j++) {
                v[f][j] = criteo_latent(c->seed, f, id, j);
                sum[j] += v[f][j];
                sq += v[f][j] * v[f][j];
            }
        }
        /* sum over pairs f < g of <v_f, v_g> = (|sum v|^2 - sum |v|^2) / 2 */
        double pairs = -sq;
        for (int j = 0; j < CRITEO_LATENT; j++)
            pairs += sum[j] * sum[j];
        z += pairs / 2;
        double p = 1.0 / (1.0 + exp(-z));
        *state = ps_mix64(*state + 1);
        int y = ps_unit_double(*state) < p;
        r.label = (float)y;
        loss -= y ? log(p) : log(1.0 - p);
        if (fwrite(&r, sizeof r, 1, out) != 1) {
            fprintf(stderr, "gen_clicks: cannot write %s: %s\n", path, strerror(errno));
            exit(1);
        }
    }
    if (fclose(out) != 0) {
        fprintf(stderr, "gen_clicks: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    return loss / (double)n;
}

static uint64_t count_distinct(uint64_t *ids, uint64_t n)
{
    qsort(ids, n, sizeof *ids, cmp_u64);
    uint64_t d = 0;
    for (uint64_t i = 0; i < n; i++)
        d += i == 0 || ids[i] != ids[i - 1];
    return d;
}

static int criteo_main(const struct cfg *c)
{
    _Static_assert(sizeof(struct criteo_rec) == 264, "the record is 264 bytes");
    struct criteo k;
    memset(&k, 0, sizeof k);
    k.c = c;
    for (int s = 0; s < 5; s++) {
        uint64_t n = c->features >> (2 * s);
        k.ranks[s] = n < 3 ? 3 : n;
        k.cdf[s] = malloc(k.ranks[s] * sizeof(double));
        if (k.cdf[s] == NULL)
            return 1;
        double sum = 0;
        for (uint64_t r = 0; r < k.ranks[s]; r++)
            k.cdf[s][r] = (sum += pow((double)(r + 1), -c->alpha));
        for (uint64_t r = 0; r < k.ranks[s]; r++)
            k.cdf[s][r] /= sum;
    }
    for (int f = 0; f < CRITEO_FIELDS; f++)
        if ((k.seen[f] = malloc(c->train * sizeof(uint64_t))) == NULL) {
            fprintf(stderr, "gen_clicks: out of memory for %llu training ids\n",
                    (unsigned long long)c->train);
            return 1;
        }
    char path[4096];
    uint64_t state = ps_mix64(c->seed ^ UINT64_C(0xc217e0));
    snprintf(path, sizeof path, "%s/train.bin", c->out);
    write_criteo(&k, path, 0, c->train, &state);
    uint64_t distinct[CRITEO_FIELDS], total = 0;
    for (int f = 0; f < CRITEO_FIELDS; f++) {
        total += distinct[f] = count_distinct(k.seen[f], c->train);
        free(k.seen[f]);
        k.seen[f] = NULL;
    }
    snprintf(path, sizeof path, "%s/test.bin", c->out);
    double truth = write_criteo(&k, path, c->train, c->test, &state);
    snprintf(path, sizeof path, "%s/truth.json", c->out);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "gen_clicks: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    fprintf(f,
            "{\"test_logloss\": %.6f, \"format\": \"criteo\", \"counts\": %d, \"fields\": %d, "
            "\"record_bytes\": %zu, \"train\": %llu, \"test\": %llu, \"alpha\": %.3f, "
            "\"drift\": %.3f, \"fresh\": %.3f, \"distinct_ids\": %llu, \"distinct\": [",
            truth, CRITEO_COUNTS, CRITEO_FIELDS, sizeof(struct criteo_rec),
            (unsigned long long)c->train, (unsigned long long)c->test, c->alpha, c->drift, c->fresh,
            (unsigned long long)total);
    for (int i = 0; i < CRITEO_FIELDS; i++)
        fprintf(f, "%s%llu", i ? ", " : "", (unsigned long long)distinct[i]);
    fprintf(f, "]}\n");
    fclose(f);
    printf("gen_clicks: %llu + %llu Criteo-shaped examples, %llu distinct training ids; "
           "true test log-loss %.6f\n",
           (unsigned long long)c->train, (unsigned long long)c->test, (unsigned long long)total,
           truth);
    for (int s = 0; s < 5; s++)
        free(k.cdf[s]);
    return 0;
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
        ps_opts_usage(
            stdout, "gen_clicks --out DIR [OPTIONS]",
            "Writes DIR/train.svm and DIR/test.svm (libsvm text) from a seeded logistic "
            "model, and DIR/truth.json with that model's own test log-loss; with --criteo, "
            "DIR/train.bin and DIR/test.bin of 264-byte records (float label, float "
            "counts[13], uint64 ids[26], little-endian).",
            opts, NOPTS);
        return 0;
    }
    if (c.out == NULL) {
        fprintf(stderr, "gen_clicks: --out DIR is required (see --help)\n");
        return 2;
    }
    if (c.criteo) {
        if (ps_mkdirs(c.out, 0755) != 0) {
            fprintf(stderr, "gen_clicks: --out %s: cannot create it: %s\n", c.out, strerror(errno));
            return 1;
        }
        return criteo_main(&c);
    }
    if (c.active > c.features) {
        fprintf(stderr,
                "gen_clicks: --active %llu is more than --features %llu: an example "
                "takes distinct features\n",
                (unsigned long long)c.active, (unsigned long long)c.features);
        return 2;
    }
    if (ps_mkdirs(c.out, 0755) != 0) {
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
