/* Sparse logistic regression: batch keys, pull rows, gradient, push rows. */
#include "sparse_lr.h"
#include "ps_limits.h"

#include "data.h"
#include "libsvm.h"
#include "mlp.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_shard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct slr {
    const struct psw_slr_config *cfg;
    struct psc_client *c;
    struct ps_log *log;
    uint32_t tw, tb; /* table handles: sparse rows, and the linear bias */
    uint32_t d;      /* floats per row: 1, or embed_dim */
    uint64_t *keys;  /* unique sorted keys of a batch */
    float *w, *g;    /* their rows and gradients (keys_cap x d) */
    size_t keys_cap;
    /* embedding variant */
    struct psk_backend *be;
    struct psw_mlp mlp;
    uint32_t tm[4];       /* fc1.weight, fc1.bias, fc2.weight, fc2.bias */
    float *hw[4], *hg[4]; /* host copies of the MLP's weights and gradients */
    float *pooled, *dxh;  /* batch x d: the MLP's input and its gradient */
    int *lab;
    uint64_t clock;
    uint64_t rows_pulled;
};

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Unique sorted keys of examples idx[0..n). Returns their count. */
static size_t batch_keys(struct slr *m, const struct psw_svm *d, const uint32_t *idx, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (uint64_t j = d->row[idx[i]]; j < d->row[idx[i] + 1]; j++)
            m->keys[k++] = d->key[j];
    qsort(m->keys, k, sizeof *m->keys, cmp_u64);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
        if (u == 0 || m->keys[i] != m->keys[u - 1])
            m->keys[u++] = m->keys[i];
    return u;
}

static int wait_ok(struct slr *m, uint64_t t, const char *what)
{
    int rc = psc_wait(m->c, t, m->cfg->timeout_ms);
    if (rc != 0)
        PS_LOG(m->log, PS_LOG_ERROR, W0310, "%s: %s", what, psc_last_error(m->c));
    return rc;
}

static int wait_ok(struct slr *m, uint64_t t, const char *what);

/* Embedding variant: pulls the MLP's tables and loads them on the device. */
static int pull_mlp(struct slr *m)
{
    uint64_t t[4];
    int rc = 0, n = 0;
    for (int k = 0; k < 4 && rc == 0; k++, n++)
        rc = psc_pull(m->c, m->tm[k], 0, psw_mlp_table_size(&m->mlp, k), m->hw[k], m->clock, &t[k]);
    if (rc != 0) {
        PS_LOG(m->log, PS_LOG_ERROR, W0313, "pull: %s", psc_last_error(m->c));
        n--;
    }
    for (int k = 0; k < n; k++) {
        int r = wait_ok(m, t[k], "pull mlp");
        rc = rc ? rc : r;
    }
    for (int k = 0; k < 4 && rc == 0; k++)
        if (psk_upload(m->be, psw_mlp_param(&m->mlp, k), m->hw[k],
                       (size_t)psw_mlp_table_size(&m->mlp, k) * 4))
            rc = PS_EDEVICE;
    return rc;
}

/* Pulls the rows of u keys and the bias (or the MLP) for `clock`. */
static int pull(struct slr *m, size_t u, float *bias)
{
    if (m->d > 1) {
        uint64_t a;
        int rc = psc_pull_rows(m->c, m->tw, m->keys, u, m->w, m->clock, &a);
        if (rc != 0) {
            PS_LOG(m->log, PS_LOG_ERROR, W0311, "pull: %s", psc_last_error(m->c));
            return rc;
        }
        int r1 = wait_ok(m, a, "pull rows"), r2 = pull_mlp(m);
        return r1 ? r1 : r2;
    }
    uint64_t a, b;
    int rc = psc_pull_rows(m->c, m->tw, m->keys, u, m->w, m->clock, &a);
    if (rc == 0 && (rc = psc_pull(m->c, m->tb, 0, 1, bias, m->clock, &b)) != 0)
        psc_cancel(m->c, a);
    if (rc != 0) {
        PS_LOG(m->log, PS_LOG_ERROR, W0311, "pull: %s", psc_last_error(m->c));
        return rc;
    }
    int r1 = wait_ok(m, a, "pull rows"), r2 = wait_ok(m, b, "pull bias");
    return r1 ? r1 : r2;
}

/* Embedding variant of forward (see below): pooled rows -> MLP -> loss,
 * then the MLP's gradients to the host and the input gradient into rows. */
static double forward_embed(struct slr *m, const struct psw_svm *d, const uint32_t *idx, size_t n,
                            size_t u, int grad, uint64_t *correct, int *rc)
{
    uint32_t D = m->d;
    memset(m->pooled, 0, n * D * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        uint32_t e = idx[i];
        m->lab[i] = d->label[e];
        for (uint64_t j = d->row[e]; j < d->row[e + 1]; j++) {
            const float *row = m->w + ps_keys_below(m->keys, u, d->key[j]) * D;
            for (uint32_t c = 0; c < D; c++)
                m->pooled[i * D + c] += d->val[j] * row[c];
        }
    }
    double loss = 0;
    int ok = 0;
    if (psk_upload(m->be, m->mlp.act[0], m->pooled, n * D * 4) ||
        psw_mlp_forward(&m->mlp, (int)n) || psw_mlp_loss(&m->mlp, (int)n, m->lab, &loss, &ok) ||
        (grad && (psw_mlp_backward(&m->mlp, (int)n, NULL, NULL) ||
                  psk_download(m->be, m->dxh, m->mlp.dx, n * D * 4)))) {
        *rc = PS_EDEVICE;
        return 0;
    }
    *correct += (uint64_t)ok;
    if (!grad)
        return loss;
    for (int k = 0; k < 4; k++)
        if (psk_download(m->be, m->hg[k], psw_mlp_grad(&m->mlp, k),
                         (size_t)psw_mlp_table_size(&m->mlp, k) * 4)) {
            *rc = PS_EDEVICE;
            return 0;
        }
    memset(m->g, 0, u * D * sizeof *m->g);
    for (size_t i = 0; i < n; i++) {
        uint32_t e = idx[i];
        for (uint64_t j = d->row[e]; j < d->row[e + 1]; j++) {
            float *gr = m->g + ps_keys_below(m->keys, u, d->key[j]) * D;
            for (uint32_t c = 0; c < D; c++)
                gr[c] += d->val[j] * m->dxh[i * D + c];
        }
    }
    return loss;
}

/* Loss, correct predictions and (when grad) the gradient of the mean loss
 * over examples idx[0..n), with the pulled weights. */
static double forward(struct slr *m, const struct psw_svm *d, const uint32_t *idx, size_t n,
                      size_t u, float bias, int grad, float *gbias, uint64_t *correct)
{
    double loss = 0;
    if (grad) {
        memset(m->g, 0, u * sizeof *m->g);
        *gbias = 0;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t e = idx[i];
        double z = bias;
        for (uint64_t j = d->row[e]; j < d->row[e + 1]; j++)
            z += (double)m->w[ps_keys_below(m->keys, u, d->key[j])] * d->val[j];
        double p = 1.0 / (1.0 + exp(-z));
        int y = d->label[e];
        p = p < 1e-7 ? 1e-7 : (p > 1 - 1e-7 ? 1 - 1e-7 : p);
        loss -= y ? log(p) : log(1 - p);
        *correct += (p > 0.5) == (y == 1);
        if (!grad)
            continue;
        float dz = (float)((p - y) / (double)n);
        for (uint64_t j = d->row[e]; j < d->row[e + 1]; j++)
            m->g[ps_keys_below(m->keys, u, d->key[j])] += dz * d->val[j];
        *gbias += dz;
    }
    return loss;
}

static int step(struct slr *m, const struct psw_svm *d, const uint32_t *idx, size_t n, double *loss)
{
    size_t u = batch_keys(m, d, idx, n);
    m->rows_pulled += u;
    float bias = 0, gbias = 0;
    uint64_t correct = 0;
    int rc = pull(m, u, &bias);
    if (rc != 0)
        return rc;
    *loss = m->d > 1 ? forward_embed(m, d, idx, n, u, 1, &correct, &rc)
                     : forward(m, d, idx, n, u, bias, 1, &gbias, &correct);
    if (rc != 0)
        return rc;
    uint64_t t[5];
    int sent = 0;
    rc = psc_push_rows(m->c, m->tw, m->keys, u, m->g, m->clock, &t[sent]);
    sent += rc == 0;
    if (rc == 0 && m->d == 1) {
        rc = psc_push(m->c, m->tb, 0, 1, &gbias, m->clock, &t[sent]);
        sent += rc == 0;
    }
    for (int k = 0; k < 4 && rc == 0 && m->d > 1; k++) {
        rc = psc_push(m->c, m->tm[k], 0, psw_mlp_table_size(&m->mlp, k), m->hg[k], m->clock,
                      &t[sent]);
        sent += rc == 0;
    }
    if (rc != 0)
        PS_LOG(m->log, PS_LOG_ERROR, W0312, "push: %s", psc_last_error(m->c));
    for (int i = 0; i < sent; i++) {
        int r = wait_ok(m, t[i], "push");
        rc = rc ? rc : r;
    }
    m->clock++;
    return rc;
}

/* Rows evaluated at once, and the fewest a model's buffers hold: a batch
 * of evaluation or of training, whichever is larger. */
#define SLR_EVAL_ROWS 4096u

static int evaluate(struct slr *m, const struct psw_svm *d, double *logloss, double *acc)
{
    enum { EB = SLR_EVAL_ROWS };
    uint32_t idx[EB];
    double loss = 0;
    uint64_t correct = 0;
    for (uint32_t i = 0; i < d->n; i += EB) {
        size_t n = d->n - i < EB ? d->n - i : EB;
        for (size_t r = 0; r < n; r++)
            idx[r] = i + (uint32_t)r;
        size_t u = batch_keys(m, d, idx, n);
        float bias = 0;
        int rc = pull(m, u, &bias);
        if (rc != 0)
            return rc;
        loss += m->d > 1 ? forward_embed(m, d, idx, n, u, 0, &correct, &rc)
                         : forward(m, d, idx, n, u, bias, 0, NULL, &correct);
        if (rc != 0)
            return rc;
    }
    *logloss = loss / d->n;
    *acc = (double)correct / d->n;
    return 0;
}

/* Embedding variant: the backend, the MLP and its four dense tables. */
static int setup_mlp(struct slr *m, char *err, size_t errlen)
{
    const struct psw_slr_config *cfg = m->cfg;
    int rc = psk_open(cfg->device ? cfg->device : "auto", &m->be, err, errlen);
    if (rc != 0)
        return rc;
    if (err[0] != '\0') /* auto fell back to the CPU: say why */
        PS_LOG(m->log, PS_LOG_INFO, W0015, "--device %s: %s; training on the CPU",
               cfg->device ? cfg->device : "auto", err);
    PS_LOG(m->log, PS_LOG_INFO, W0018, "embedding MLP on %s", psk_describe(m->be));
    int dims[3] = {(int)cfg->embed_dim, (int)cfg->hidden, 2};
    int bmax = cfg->batch > SLR_EVAL_ROWS ? (int)cfg->batch : (int)SLR_EVAL_ROWS;
    if ((rc = psw_mlp_init(&m->mlp, m->be, dims, 2, bmax, err, errlen)) != 0 ||
        (rc = psw_mlp_enable_input_grad(&m->mlp)) != 0)
        return rc;
    m->pooled = malloc((size_t)bmax * cfg->embed_dim * sizeof(float));
    m->dxh = malloc((size_t)bmax * cfg->embed_dim * sizeof(float));
    m->lab = malloc((size_t)bmax * sizeof(int));
    if (m->pooled == NULL || m->dxh == NULL || m->lab == NULL)
        return PS_ENOMEM;
    for (int k = 0; k < 4; k++) {
        size_t n = (size_t)psw_mlp_table_size(&m->mlp, k);
        m->hw[k] = malloc(n * 4);
        m->hg[k] = malloc(n * 4);
        if (m->hw[k] == NULL || m->hg[k] == NULL)
            return PS_ENOMEM;
        char name[32];
        psw_mlp_table_name(k, name, sizeof name);
        struct psc_table_spec s;
        psc_table_spec_init(&s, name, n);
        /* the head is dense: Adagrad for the sparse-only optimizers */
        s.optimizer = cfg->optimizer == PSC_FTRL || cfg->optimizer == PSC_ROWWISE_ADAGRAD
                          ? PSC_ADAGRAD
                          : cfg->optimizer;
        s.lr = cfg->lr;
        s.eps = 1e-8f;
        s.seed = cfg->seed * 7919u + (uint64_t)k;
        if (k % 2 == 0) {
            s.init = PSC_INIT_NORMAL;
            s.init_scale = sqrtf(2.0f / (float)dims[k / 2]);
        }
        if ((rc = psc_table_create(m->c, &s, cfg->timeout_ms, &m->tm[k])) != 0) {
            snprintf(err, errlen, "create '%s': %s", name, psc_last_error(m->c));
            return rc;
        }
    }
    return 0;
}

static int setup_tables(struct slr *m, char *err, size_t errlen)
{
    const struct psw_slr_config *cfg = m->cfg;
    struct psc_table_spec s;
    psc_table_spec_init(&s, m->d > 1 ? "emb.weight" : "lr.weight", 0);
    s.sparse = 1;
    s.dim = m->d;
    if (m->d > 1) { /* random rows break the symmetry between features */
        s.init = PSC_INIT_UNIFORM;
        s.init_scale = 0.05f;
    }
    s.rows_max = cfg->rows_max;
    s.admit_after = cfg->admit_after;
    s.evict_after = cfg->evict_after;
    s.evict_at_budget = cfg->evict_at_budget;
    s.evict_half_life = cfg->evict_half_life;
    s.optimizer = cfg->optimizer;
    s.lr = cfg->lr;
    s.eps = cfg->optimizer == PSC_FTRL ? 1.0f : 1e-8f;
    s.l1 = cfg->l1;
    s.l2 = cfg->l2;
    s.seed = cfg->seed;
    int rc = psc_table_create(m->c, &s, cfg->timeout_ms, &m->tw);
    if (rc == 0 && m->d > 1)
        return setup_mlp(m, err, errlen);
    if (rc == 0) {
        s.sparse = 0;
        s.dim = 0;
        s.rows_max = 0;
        s.name = "lr.bias";
        s.size = 1;
        s.admit_after = 0; /* a dense table: no life cycle */
        s.evict_after = 0;
        s.evict_at_budget = 0;
        s.evict_half_life = 0;
        if (s.optimizer == PSC_ROWWISE_ADAGRAD) /* one value, no rows */
            s.optimizer = PSC_ADAGRAD;
        rc = psc_table_create(m->c, &s, cfg->timeout_ms, &m->tb);
    }
    if (rc != 0)
        snprintf(err, errlen, "create tables: %s", psc_last_error(m->c));
    return rc;
}

static int load(const char *dir, const char *name, struct psw_svm *d, char *err, size_t errlen)
{
    char path[PS_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return psw_svm_load(path, d, err, errlen);
}

int psw_slr_train(const struct psw_slr_config *cfg, struct psc_client *c, struct ps_log *log,
                  struct psw_slr_result *res, char *err, size_t errlen)
{
    memset(res, 0, sizeof *res);
    struct slr m = {.cfg = cfg, .c = c, .log = log, .d = cfg->embed_dim ? cfg->embed_dim : 1};
    struct psw_svm train, test;
    int rc = load(cfg->data, "train.svm", &train, err, errlen);
    if (rc != 0)
        return rc;
    if ((rc = load(cfg->data, "test.svm", &test, err, errlen)) != 0) {
        psw_svm_free(&train);
        return rc;
    }
    uint64_t gb = cfg->batch * cfg->workers, steps = train.n / gb;
    uint32_t *perm = malloc((size_t)train.n * sizeof *perm);
    /* A batch touches at most (its rows) x (the widest row) keys. */
    uint64_t widest = 1, rows = cfg->batch > SLR_EVAL_ROWS ? cfg->batch : SLR_EVAL_ROWS;
    for (uint32_t i = 0; i < train.n; i++)
        widest =
            train.row[i + 1] - train.row[i] > widest ? train.row[i + 1] - train.row[i] : widest;
    for (uint32_t i = 0; i < test.n; i++)
        widest = test.row[i + 1] - test.row[i] > widest ? test.row[i + 1] - test.row[i] : widest;
    m.keys_cap = (size_t)(rows * widest);
    m.keys = malloc(m.keys_cap * sizeof *m.keys);
    m.w = malloc(m.keys_cap * m.d * sizeof *m.w);
    m.g = malloc(m.keys_cap * m.d * sizeof *m.g);
    if (steps == 0) {
        snprintf(err, errlen, "--batch %llu x --workers %u exceeds the %u examples",
                 (unsigned long long)cfg->batch, cfg->workers, train.n);
        rc = PS_EINVAL;
    } else if (perm == NULL || m.keys == NULL || m.w == NULL || m.g == NULL) {
        snprintf(err, errlen, "out of memory");
        rc = PS_ENOMEM;
    } else {
        rc = setup_tables(&m, err, errlen);
    }
    /* the run's steps: the epochs', or --max-steps when that is fewer */
    uint64_t total = steps * cfg->epochs;
    if (cfg->max_steps && cfg->max_steps < total)
        total = cfg->max_steps;
    for (uint64_t e = 0; rc == 0 && e < cfg->epochs; e++) {
        psw_data_permute(perm, train.n, cfg->seed, e);
        double t0 = ps_mono_s(), loss_sum = 0;
        uint64_t s = 0, end = total - e * steps < steps ? total - e * steps : steps;
        for (; s < steps && rc == 0; s++) {
            if (cfg->max_steps && m.clock >= cfg->max_steps)
                break;
            double loss = 0;
            rc = step(&m, &train, perm + (s * cfg->workers + cfg->rank) * cfg->batch,
                      (size_t)cfg->batch, &loss);
            if (cfg->test_delay_ms) { /* tests: a run slow enough to act on mid-way */
                struct timespec ts = {(time_t)(cfg->test_delay_ms / 1000),
                                      (long)(cfg->test_delay_ms % 1000) * 1000000L};
                nanosleep(&ts, NULL);
            }
            loss_sum += loss;
            res->samples += cfg->batch;
            if ((s + 1) % cfg->log_every == 0 || s + 1 == end) {
                double el = ps_mono_s() - t0,
                       sps = el > 0 ? (double)((s + 1) * cfg->batch) / el : 0;
                PS_LOG(log, PS_LOG_INFO, W0220,
                       "epoch %llu/%llu step %llu/%llu log-loss %.4f %.0f samples/s ETA %.0fs",
                       (unsigned long long)e + 1, (unsigned long long)((total + steps - 1) / steps),
                       (unsigned long long)s + 1, (unsigned long long)end,
                       loss_sum / ((s + 1) * cfg->batch), sps,
                       el / (double)(s + 1) * (double)(end - s - 1));
            }
        }
        res->train_seconds += ps_mono_s() - t0;
        if (cfg->max_steps && m.clock >= cfg->max_steps)
            break;
    }
    if (rc == 0)
        rc = evaluate(&m, &test, &res->test_logloss, &res->test_accuracy);
    if (rc == 0)
        PS_LOG(log, PS_LOG_INFO, W0221, "held-out log-loss %.5f, accuracy %.4f", res->test_logloss,
               res->test_accuracy);
    res->steps = m.clock;
    res->rows_pulled = m.rows_pulled;
    for (int k = 0; k < 4; k++) {
        free(m.hw[k]);
        free(m.hg[k]);
    }
    free(m.pooled);
    free(m.dxh);
    free(m.lab);
    if (m.be != NULL) {
        psw_mlp_fini(&m.mlp);
        psk_close(m.be);
    }
    free(perm);
    free(m.keys);
    free(m.w);
    free(m.g);
    psw_svm_free(&train);
    psw_svm_free(&test);
    return rc;
}
