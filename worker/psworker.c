/* psworker: trains a model on its shard of the data through psd (or alone
 * with --standalone). Each step pulls the weights for clock t, runs forward
 * and backward on its backend, and pushes each layer's gradient the moment
 * backward produces it, asking for that layer's clock t+1 weights right
 * behind it, so communication overlaps the rest of the backward pass. */
#include "data.h"
#include "mlp.h"
#include "psclient.h"
#include "ps_safetensors.h"
#include "sparse_lr.h"

#include "psk.h"
#include "psk_optim.h"

#include "ps_clock.h"
#include "ps_cpus.h"
#include "ps_curve.h"
#include "ps_err.h"
#include "ps_init.h"
#include "ps_limits.h"
#include "ps_log.h"
#include "ps_metrics.h"
#include "ps_notify.h"
#include "ps_opts.h"
#include "ps_zsock.h"
#include "ps_shard.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EVAL_BATCH  1000
#define TABLES_MAX  (2 * PSW_LAYERS_MAX)
#define TICKETS_MAX 1024 /* push-pulls of one step: one per weight chunk and bias */

struct config {
    const char *servers;
    uint64_t rank, workers;
    const char *model, *layers, *data;
    uint64_t batch, epochs, seed;
    double lr, momentum, weight_decay, topk, l1, l2;
    uint64_t rows_max, embed_dim, embed_hidden;
    const char *optimizer, *device, *lr_schedule, *wire_dtype;
    const char *summary_json, *save, *log_level, *curve_secret, *curve_server_key, *config;
    const char *metrics_listen, *cpus, *io_cpus;
    int standalone, no_local_ipc, no_shm, no_batch;
    uint64_t max_steps, log_every, timeout_ms, test_delay_ms, accum_steps, retry_ms, heartbeat_ms;
    uint64_t compute_threads;
    int help;
};

#define OPT(...)  PS_OPT(struct config, __VA_ARGS__)
#define FOPT(...) PS_FOPT(struct config, __VA_ARGS__)

static const struct ps_opt opts[] = {
    OPT("servers", PS_OPT_STR, servers, NULL, 0, 0, "EP[,EP...]",
        "psd endpoints, shard 0 first (required unless --standalone)"),
    OPT("rank", PS_OPT_U64, rank, "0", 0, PS_WORKERS_MAX - 1, "R", "this worker's rank"),
    OPT("workers", PS_OPT_U64, workers, "1", 1, PS_WORKERS_MAX, "W", "number of workers"),
    OPT("model", PS_OPT_STR, model, "mlp", 0, 0, "NAME",
        "mlp (IDX images), or sparse-lr (libsvm DIR/train.svm and DIR/test.svm)"),
    FOPT("l1", l1, "0", 0.0, 1e6, "L1", "sparse-lr with ftrl: L1 strength"),
    FOPT("l2", l2, "0", 0.0, 1e6, "L2", "sparse-lr with ftrl: L2 strength"),
    OPT("embed-dim", PS_OPT_U64, embed_dim, "0", 0, 1024, "D",
        "sparse-lr: embed each feature in D floats and classify with an MLP (0: linear)"),
    OPT("embed-hidden", PS_OPT_U64, embed_hidden, "64", 1, 65536, "H",
        "sparse-lr with --embed-dim: hidden width of the MLP"),
    OPT("rows-max", PS_OPT_U64, rows_max, "10000000", 1, UINT64_C(1) << 31, "N",
        "sparse-lr: rows one shard may hold"),
    OPT("layers", PS_OPT_STR, layers, "784,256,128,10", 0, 0, "N,N,...", "MLP widths"),
    OPT("data", PS_OPT_STR, data, "/usr/share/datasets/fashion-mnist", 0, 0, "DIR",
        "IDX files (gzip or plain)"),
    OPT("batch", PS_OPT_U64, batch, "64", 1, 65536, "B", "examples per step on this worker"),
    OPT("accum-steps", PS_OPT_U64, accum_steps, "1", 1, 1024, "N",
        "sum N mini-batch gradients locally, push once (one clock per push)"),
    OPT("compute-threads", PS_OPT_U64, compute_threads, "0", 0, 2, "N",
        "CPU backend: 2 has a helper thread share the pieces of each big matrix product with the "
        "training thread (OpenBLAS then runs 1 thread per call), 1 leaves threading to OpenBLAS, "
        "0 picks 2 where this process may run on 2 or more CPUs; 2 and 1 give the same bits when "
        "OpenBLAS runs 1 thread (OPENBLAS_NUM_THREADS=1): its own threads split a product their "
        "own way, and the last bits may differ"),
    OPT("epochs", PS_OPT_U64, epochs, "5", 1, 100000, "E", "passes over the training set"),
    FOPT("lr", lr, "0.02", 0.0, 100.0, "LR", "learning rate"),
    OPT("optimizer", PS_OPT_STR, optimizer, "momentum", 0, 0, "NAME",
        "sgd, momentum, adagrad, adam, or ftrl (FTRL-proximal, --model sparse-lr only)"),
    OPT("lr-schedule", PS_OPT_STR, lr_schedule, "cosine", 0, 0, "NAME",
        "constant, or cosine decay to 0 over the whole run"),
    FOPT("momentum", momentum, "0.9", 0.0, 0.999999, "M", "momentum coefficient"),
    FOPT("topk", topk, "0", 0.0, 1.0, "FRACTION",
         "send only this fraction of each gradient (largest first; the rest is kept and "
         "added next step; with momentum, momentum moves to the worker as in DGC); 0: off"),
    FOPT("weight-decay", weight_decay, "0", 0.0, 1.0, "WD", "L2 weight decay"),
    OPT("wire-dtype", PS_OPT_STR, wire_dtype, "f32", 0, 0, "DTYPE",
        "values on the wire: f32, f16 or bf16 (servers keep f32)"),
    OPT("device", PS_OPT_STR, device, "auto", 0, 0, "DEV", "auto, cpu, cuda or cuda:N"),
    OPT("seed", PS_OPT_U64, seed, "1", 0, UINT64_MAX, "S", "seed for init and shuffling"),
    OPT("summary-json", PS_OPT_STR, summary_json, NULL, 0, 0, "PATH",
        "write a JSON summary here at exit"),
    OPT("save", PS_OPT_STR, save, NULL, 0, 0, "PATH",
        "rank 0 / standalone: write the trained model as safetensors"),
    OPT("standalone", PS_OPT_FLAG, standalone, NULL, 0, 0, NULL,
        "train in this process without servers (the baseline)"),
    OPT("no-local-ipc", PS_OPT_FLAG, no_local_ipc, NULL, 0, 0, NULL,
        "stay on the --servers endpoints even where a shard on this host offers its Unix "
        "socket"),
    OPT("no-shm", PS_OPT_FLAG, no_shm, NULL, 0, 0, NULL,
        "send values in ZeroMQ frames even to shards on this host (by default the CPU "
        "backend shares its gradients and pulled weights with them in memory)"),
    OPT("no-batch", PS_OPT_FLAG, no_batch, NULL, 0, 0, NULL,
        "send every request in a message of its own (by default the requests of a step that "
        "carry no values, such as those through shared memory, go to each shard as one)"),
    OPT("cpus", PS_OPT_STR, cpus, NULL, 0, 0, "LIST",
        "run this worker's threads (training, BLAS) on these CPUs (as taskset -c writes them: "
        "0,2-3); default: wherever the scheduler puts them"),
    OPT("io-cpus", PS_OPT_STR, io_cpus, NULL, 0, 0, "LIST",
        "run ZeroMQ's I/O thread on these CPUs instead (e.g. beside a psd on this host, away "
        "from training)"),
    OPT("max-steps", PS_OPT_U64, max_steps, "0", 0, UINT64_MAX, "N",
        "stop after N steps (0: none)"),
    OPT("log-every", PS_OPT_U64, log_every, "100", 1, 1000000, "N",
        "steps between progress lines when stderr is not a terminal"),
    OPT("timeout-ms", PS_OPT_U64, timeout_ms, "120000", 100, 86400000, "MS",
        "longest wait for one request"),
    OPT("retry-ms", PS_OPT_U64, retry_ms, "5000", 0, 3600000, "MS",
        "re-send a request unanswered this long (a restarted server); 0: never"),
    OPT("heartbeat-ms", PS_OPT_U64, heartbeat_ms, "1000", 0, 3600000, "MS",
        "tell the servers this worker is alive when it has sent nothing for this long (keep "
        "it well under psd --worker-timeout); 0: never"),
    OPT("test-delay-ms", PS_OPT_U64, test_delay_ms, "0", 0, 60000, "MS",
        "testing only: sleep this long every step"),
    OPT("curve-secret", PS_OPT_STR, curve_secret, NULL, 0, 0, "FILE",
        "this worker's CURVE key file (psd --keygen); needs --curve-server-key"),
    OPT("curve-server-key", PS_OPT_STR, curve_server_key, NULL, 0, 0, "FILE",
        "the servers' public key file (their .pub)"),
    OPT("log-level", PS_OPT_STR, log_level, "info", 0, 0, "LEVEL", "error, warn, info or debug"),
    OPT("config", PS_OPT_STR, config, NULL, 0, 0, "FILE",
        "read options from an INI file (NAME = VALUE, names as the long flags); flags on the "
        "command line win"),
    OPT("metrics-listen", PS_OPT_STR, metrics_listen, NULL, 0, 0, "ADDR:PORT",
        "serve Prometheus /metrics and /healthz over HTTP here (port 0 picks a free port)"),
    OPT("help", PS_OPT_FLAG, help, NULL, 0, 0, NULL, "show this help and exit"),
};
#define NOPTS (sizeof opts / sizeof opts[0])

struct trainer {
    const char *const *eps; /* --servers, while psc_create says hello (log_hello_waiting) */
    uint32_t neps;
    struct config cfg;
    struct ps_log log;
    struct psk_backend *be;
    struct psw_mlp mlp;
    struct psw_split train, test;
    uint32_t *perm;
    float *h_in; /* a device's batch before its upload (NULL on the CPU backend) */
    int *h_lab;
    int ntables;
    float *hw[TABLES_MAX], *hg[TABLES_MAX]; /* host weights and gradients */
    /* with shared memory: two sets of weights in the region; the model
     * reads set wcur while the pulls of the next clock land in the other */
    float *wset[2][TABLES_MAX];
    int wcur, wsets;
    struct ps_pool *pool; /* --compute-threads 2 */
    /* distributed */
    struct psc_client *c;
    uint32_t th[TABLES_MAX];
    uint64_t pull_tk[TICKETS_MAX]; /* pulls, or push-pulls, in flight */
    struct pull_range {            /* what each brings: table k's [first, first+n) */
        int k;                     /* -1: no weights (a top-k push) */
        uint64_t first, n;
        int done; /* waited for */
    } pull_at[TICKETS_MAX];
    int pulls_pending;
    int alias;                    /* CPU backend: host buffers are the model's own buffers */
    struct ps_cpus cpus, io_cpus; /* --cpus, --io-cpus (n == 0: not given) */
    /* standalone */
    struct psk_optim opt;
    float *s1[TABLES_MAX], *s2[TABLES_MAX];
    float *acc[TABLES_MAX]; /* --accum-steps > 1: summed gradients (device) */
    /* --topk: residual and (momentum correction) velocity on the device,
     * the selection on the host */
    float *resid[TABLES_MAX], *vel[TABLES_MAX];
    uint64_t *sel_idx[TABLES_MAX];
    float *sel_val[TABLES_MAX];
    int sel_shm[TABLES_MAX]; /* sel_idx and sel_val lie in the shared region */
    size_t sel_k[TABLES_MAX];
    uint64_t decay_steps; /* optimizer steps of the whole run (lr schedule) */
    uint64_t clock;       /* steps done (in the run: a rejoining worker starts later) */
    uint64_t clock0;      /* where this process started */
    uint64_t done;        /* steps this process took */
    int fresh;            /* device weights are those of `clock` */
    double train_seconds;
    /* --metrics-listen */
    struct ps_metrics *metrics;
    struct ps_buf mtext;
    double m_at, m_sps, m_loss, m_accuracy; /* last publish; its rate; last step; last eval */
    uint64_t m_done;                        /* steps at the last publish */
};

/* The gradient a step sends for table k: backward's own, or the sum of
 * the accumulated micro-batches. */
static float *grad_src(struct trainer *tr, int k)
{
    return tr->acc[k] ? tr->acc[k] : psw_mlp_grad(&tr->mlp, k);
}

/* ---- tables ---------------------------------------------------------------- */

/* With --topk and momentum, momentum runs on the worker (DGC's momentum
 * correction) and the servers apply plain SGD. */
static int momentum_on_worker(const struct config *c)
{
    return c->topk > 0 && psk_optim_parse(c->optimizer) == PSK_OPT_MOMENTUM;
}

static int server_optimizer(const struct config *c)
{
    return momentum_on_worker(c) ? PSK_OPT_SGD : psk_optim_parse(c->optimizer);
}

static void table_spec(const struct trainer *tr, int k, struct psc_table_spec *s, char *name,
                       size_t len)
{
    psw_mlp_table_name(k, name, len);
    psc_table_spec_init(s, name, psw_mlp_table_size(&tr->mlp, k));
    s->optimizer = server_optimizer(&tr->cfg);
    s->lr = (float)tr->cfg.lr;
    s->momentum = (float)tr->cfg.momentum;
    s->weight_decay = (float)tr->cfg.weight_decay;
    s->seed = ps_mix64(tr->cfg.seed * 1000003u + (uint64_t)k);
    s->lr_schedule = strcmp(tr->cfg.lr_schedule, "cosine") == 0 ? 1 : 0;
    s->lr_decay_steps = tr->decay_steps;
    if (k % 2 == 0) { /* He init for ReLU layers: N(0, 2 / fan_in) */
        s->init = PSC_INIT_NORMAL;
        s->init_scale = sqrtf(2.0f / (float)tr->mlp.dims[k / 2]);
    }
}

/* Elements --topk sends of a table of n. */
static size_t topk_count(const struct trainer *tr, size_t n)
{
    size_t kk = (size_t)ceil(tr->cfg.topk * (double)n);
    return kk < 1 ? 1 : (kk > n ? n : kk);
}

static int setup_topk(struct trainer *tr, int k, size_t n)
{
    size_t kk = tr->sel_k[k] = topk_count(tr, n);
    float *zeros = calloc(n, sizeof *zeros);
    /* in the shared region when shards took it: the keys and values of
     * the keyed push then move without sockets */
    tr->sel_shm[k] = tr->c != NULL && psc_shm_shards(tr->c) > 0 &&
                     (tr->sel_idx[k] = psc_shm_alloc(tr->c, kk * sizeof(uint64_t))) != NULL &&
                     (tr->sel_val[k] = psc_shm_alloc(tr->c, kk * sizeof(float))) != NULL;
    if (!tr->sel_shm[k]) {
        tr->sel_idx[k] = malloc(kk * sizeof *tr->sel_idx[k]);
        tr->sel_val[k] = malloc(kk * sizeof *tr->sel_val[k]);
    }
    int rc = zeros == NULL || tr->sel_idx[k] == NULL || tr->sel_val[k] == NULL ||
             psk_alloc(tr->be, n * 4, (void **)&tr->resid[k]) ||
             psk_upload(tr->be, tr->resid[k], zeros, n * 4);
    if (rc == 0 && momentum_on_worker(&tr->cfg))
        rc = psk_alloc(tr->be, n * 4, (void **)&tr->vel[k]) ||
             psk_upload(tr->be, tr->vel[k], zeros, n * 4);
    free(zeros);
    return rc ? PS_ENOMEM : 0;
}

static int setup_tables(struct trainer *tr, char *err, size_t errlen)
{
    tr->ntables = psw_mlp_tables(&tr->mlp);
    for (int k = 0; k < tr->ntables; k++) {
        size_t n = (size_t)psw_mlp_table_size(&tr->mlp, k);
        if (tr->cfg.accum_steps > 1 && psk_alloc(tr->be, n * 4, (void **)&tr->acc[k])) {
            snprintf(err, errlen, "cannot allocate accumulation buffers");
            return PS_ENOMEM;
        }
        if (tr->cfg.topk > 0 && setup_topk(tr, k, n) != 0) {
            snprintf(err, errlen, "cannot allocate top-k buffers");
            return PS_ENOMEM;
        }
        if (tr->alias) {
            tr->hw[k] = psw_mlp_param(&tr->mlp, k);
            tr->hg[k] = grad_src(tr, k);
        } else if (psk_host_alloc(tr->be, n * 4, (void **)&tr->hw[k]) ||
                   psk_host_alloc(tr->be, n * 4, (void **)&tr->hg[k])) {
            snprintf(err, errlen, "cannot allocate host buffers");
            return PS_ENOMEM;
        }
        struct psc_table_spec s;
        char name[64];
        table_spec(tr, k, &s, name, sizeof name);
        if (tr->cfg.standalone) {
            /* the same initialiser the servers run, element by element */
            ps_init_fill(tr->hw[k], n, (enum ps_init_kind)s.init, s.init_scale, s.seed, 0);
            tr->s1[k] = calloc(n, 4);
            tr->s2[k] = calloc(n, 4);
            if (!tr->s1[k] || !tr->s2[k])
                return PS_ENOMEM;
            continue;
        }
        int rc = psc_table_create(tr->c, &s, (int)tr->cfg.timeout_ms, &tr->th[k]);
        if (rc != 0) {
            snprintf(err, errlen, "create table '%s': %s", name, psc_last_error(tr->c));
            return rc;
        }
    }
    tr->opt = (struct psk_optim){.kind = server_optimizer(&tr->cfg),
                                 .lr = (float)tr->cfg.lr,
                                 .weight_decay = (float)tr->cfg.weight_decay,
                                 .momentum = (float)tr->cfg.momentum,
                                 .beta1 = 0.9f,
                                 .beta2 = 0.999f,
                                 .eps = 1e-8f,
                                 .schedule = strcmp(tr->cfg.lr_schedule, "cosine") == 0,
                                 .decay_steps = tr->decay_steps};
    return 0;
}

static void worker_metrics(struct trainer *tr, int force);

/* Where pulls of table k land: with two sets of weights, the one the
 * model is not reading (a shard writes it when it answers, and backward
 * may still be reading the weights then); otherwise hw, which a pull
 * writes inside psc_wait only. */
static float *pull_dst(struct trainer *tr, int k)
{
    return tr->wsets ? tr->wset[1 - tr->wcur][k] : tr->hw[k];
}

/* The pulls of the next clock are all on their way into the other set:
 * the model reads that one from now on (forward waits for each piece of
 * it as before), and the next pulls land in this one. */
static void next_weights(struct trainer *tr)
{
    if (!tr->wsets)
        return;
    tr->wcur = 1 - tr->wcur;
    memcpy(tr->hw, tr->wset[tr->wcur], (size_t)tr->ntables * sizeof *tr->hw);
    psw_mlp_point_params(&tr->mlp, tr->hw);
}

/* Notes what pull i (a ticket in pull_tk) brings. */
static void note_pull(struct trainer *tr, int i, int k, uint64_t first, uint64_t n)
{
    tr->pull_at[i] = (struct pull_range){k, first, n, 0};
}

/* Waits for the pulls not yet waited for that bring elements [a, b) of
 * table k (k < 0: every pull), uploading each range to the device when
 * upload is set. Returns the first error; waits for the others anyway. */
static int wait_pulls(struct trainer *tr, int k, uint64_t a, uint64_t b, int upload)
{
    int first = 0;
    for (int i = 0; i < tr->pulls_pending; i++) {
        struct pull_range *p = &tr->pull_at[i];
        if (p->done || (k >= 0 && (p->k != k || p->first >= b || p->first + p->n <= a)))
            continue;
        p->done = 1;
        /* in slices, petting the service watchdog while a round waits */
        int rc = PS_ETIMEDOUT;
        double until = ps_mono_s() + (double)tr->cfg.timeout_ms / 1e3;
        while (rc == PS_ETIMEDOUT && ps_mono_s() < until) {
            rc = psc_wait(tr->c, tr->pull_tk[i], 1000);
            ps_notify_watchdog();
            if (rc == PS_ETIMEDOUT)
                worker_metrics(tr, 0); /* waiting, not stuck: /healthz stays ok */
        }
        if (rc == PS_ETIMEDOUT)
            psc_cancel(tr->c, tr->pull_tk[i]);
        if (rc == 0 && upload && p->k >= 0 &&
            psk_upload(tr->be, psw_mlp_param(&tr->mlp, p->k) + p->first, tr->hw[p->k] + p->first,
                       (size_t)p->n * 4))
            rc = PS_EDEVICE;
        if (rc != 0 && first == 0) {
            first = rc;
            PS_LOG(&tr->log, PS_LOG_ERROR, "W0300", "pull %d of this step failed: %s%s", i,
                   rc == PS_EDEVICE ? "device upload" : psc_last_error(tr->c),
                   rc == PS_ETIMEDOUT ? " (the whole --timeout-ms passed)" : "");
        }
    }
    return first;
}

static int pull_table(struct trainer *tr, int k, uint64_t clock)
{
    uint64_t n = psw_mlp_table_size(&tr->mlp, k);
    note_pull(tr, k, k, 0, n);
    int rc = psc_pull(tr->c, tr->th[k], 0, n, pull_dst(tr, k), clock, &tr->pull_tk[k]);
    if (rc != 0)
        PS_LOG(&tr->log, PS_LOG_ERROR, "W0301", "pull: %s", psc_last_error(tr->c));
    return rc;
}

/* Requests from here to cork(tr, 0) go to each shard together where they
 * can (psc_cork), unless --no-batch. */
static void cork(struct trainer *tr, int on)
{
    if (tr->c != NULL && !tr->cfg.no_batch)
        (void)psc_cork(tr->c, on); /* PS_ENOMEM: they go one by one */
}

/* Pulls every table at `clock` (start, rejoin). */
static int pull_all(struct trainer *tr, uint64_t clock)
{
    int rc = 0;
    cork(tr, 1);
    for (int k = 0; k < tr->ntables && rc == 0; k++)
        rc = pull_table(tr, k, clock);
    cork(tr, 0);
    tr->pulls_pending = tr->ntables;
    next_weights(tr);
    return rc;
}

/* Makes the device hold the weights for the current clock: distributed,
 * every pull still in flight is waited for and its range uploaded (the
 * step's pulls cover every table); standalone, the host copies the
 * optimizer updated are uploaded. */
static int sync_weights(struct trainer *tr)
{
    if (tr->fresh)
        return 0;
    if (!tr->cfg.standalone) {
        int rc = wait_pulls(tr, -1, 0, UINT64_MAX, !tr->alias);
        tr->pulls_pending = 0;
        if (rc != 0)
            return rc;
    }
    for (int k = 0; k < tr->ntables && !tr->alias && tr->cfg.standalone; k++)
        if (psk_upload(tr->be, psw_mlp_param(&tr->mlp, k), tr->hw[k],
                       (size_t)psw_mlp_table_size(&tr->mlp, k) * 4))
            return PS_EDEVICE;
    tr->fresh = 1;
    return 0;
}

/* Forward's ready callback: the weights of layer l's rows [r0, r1) (its
 * bias when r0 == r1) have arrived, so the forward pass of the next step
 * starts on the first rows while the last are still on the wire. */
static int weights_ready(void *arg, int l, int r0, int r1)
{
    struct trainer *tr = arg;
    if (r0 == r1)
        return wait_pulls(tr, 2 * l + 1, 0, UINT64_MAX, !tr->alias);
    uint64_t in = (uint64_t)tr->mlp.dims[l];
    return wait_pulls(tr, 2 * l, (uint64_t)r0 * in, (uint64_t)r1 * in, !tr->alias);
}

/* Sends [first, first+n) of table k's gradient as a push-pull: this
 * clock's gradient out, the next clock's weights for the same range back. */
static int send_range(struct trainer *tr, int k, uint64_t first, uint64_t n)
{
    if (tr->acc[k] != NULL) { /* last micro-batch: add it, then average */
        float *a = tr->acc[k] + first;
        if (psk_axpy(tr->be, n, 1.0f, psw_mlp_grad(&tr->mlp, k) + first, a) ||
            psk_scale(tr->be, n, 1.0f / (float)tr->cfg.accum_steps, a))
            return PS_EDEVICE;
    }
    if (tr->cfg.topk > 0)
        return 0; /* selected and sent after backward (send_topk) */
    if (!tr->alias && psk_download(tr->be, tr->hg[k] + first, grad_src(tr, k) + first, n * 4))
        return PS_EDEVICE;
    if (tr->cfg.standalone)
        return 0; /* applied after backward, which still reads the weights */
    if (tr->pulls_pending >= TICKETS_MAX)
        return PS_ELIMIT;
    note_pull(tr, tr->pulls_pending, k, first, n);
    int rc = psc_push_pull(tr->c, tr->th[k], first, n, tr->hg[k] + first, pull_dst(tr, k) + first,
                           tr->clock, &tr->pull_tk[tr->pulls_pending]);
    if (rc != 0) {
        PS_LOG(&tr->log, PS_LOG_ERROR, "W0302", "push: %s", psc_last_error(tr->c));
        return rc;
    }
    tr->pulls_pending++;
    return 0;
}

/* --topk: adds this step's gradient to the residual (through the local
 * velocity when momentum is corrected), takes the largest entries out of
 * it and sends them as a sparse push, and asks for the next clock's
 * weights. Standalone applies them with the same optimizer code. */
static int send_topk(struct trainer *tr, int k)
{
    size_t n = (size_t)psw_mlp_table_size(&tr->mlp, k);
    const float *g = grad_src(tr, k);
    float *v = tr->resid[k], *u = tr->vel[k];
    int rc = u != NULL ? psk_scale(tr->be, n, (float)tr->cfg.momentum, u) ||
                             psk_axpy(tr->be, n, 1.0f, g, u) || psk_axpy(tr->be, n, 1.0f, u, v)
                       : psk_axpy(tr->be, n, 1.0f, g, v);
    if (rc || psk_topk(tr->be, n, v, u, tr->sel_k[k], tr->sel_idx[k], tr->sel_val[k]))
        return PS_EDEVICE;
    if (tr->cfg.standalone) {
        psk_optim_apply_sparse(&tr->opt, tr->clock + 1, tr->hw[k], tr->s1[k], tr->s2[k],
                               tr->sel_idx[k], 0, tr->sel_val[k], tr->sel_k[k]);
        return 0;
    }
    if (tr->pulls_pending + 2 > TICKETS_MAX)
        return PS_ELIMIT;
    note_pull(tr, tr->pulls_pending, -1, 0, 0);
    note_pull(tr, tr->pulls_pending + 1, k, 0, n);
    rc = psc_push_keys(tr->c, tr->th[k], tr->sel_idx[k], tr->sel_val[k], tr->sel_k[k], tr->clock,
                       &tr->pull_tk[tr->pulls_pending]);
    if (rc == 0)
        rc = psc_pull(tr->c, tr->th[k], 0, n, pull_dst(tr, k), tr->clock + 1,
                      &tr->pull_tk[tr->pulls_pending + 1]);
    if (rc != 0) {
        PS_LOG(&tr->log, PS_LOG_ERROR, "W0303", "top-k push: %s", psc_last_error(tr->c));
        return rc;
    }
    tr->pulls_pending += 2;
    return 0;
}

/* Backward callback: rows [r0, r1) of layer l's weight gradient are ready
 * (and, with the last rows, its bias gradient). They go out at once while
 * backward goes on. Replies are read only inside psc_wait, i.e. after
 * backward, so weights still needed below are not overwritten under it. */
static int on_chunk(void *arg, int l, int r0, int r1)
{
    struct trainer *tr = arg;
    uint64_t in = (uint64_t)tr->mlp.dims[l];
    int rc = send_range(tr, 2 * l, (uint64_t)r0 * in, (uint64_t)(r1 - r0) * in);
    if (rc == 0 && r1 == tr->mlp.dims[l + 1])
        rc = send_range(tr, 2 * l + 1, 0, (uint64_t)r1);
    return rc;
}

/* Rows idx[0..rows) of split d as the model's input, their labels into
 * h_lab. On the CPU backend the batch is built in the model's input
 * buffer itself; a device gets it uploaded from h_in. */
static int load_batch(struct trainer *tr, const struct psw_split *d, const uint32_t *idx, int rows)
{
    if (tr->alias) {
        psw_data_batch(d, idx, rows, tr->mlp.act[0], tr->h_lab);
        return 0;
    }
    psw_data_batch(d, idx, rows, tr->h_in, tr->h_lab);
    return psk_upload(tr->be, tr->mlp.act[0], tr->h_in, (size_t)rows * d->pixels * 4);
}

/* ---- steps ------------------------------------------------------------------ */

static double evaluate(struct trainer *tr)
{
    if (sync_weights(tr) != 0)
        return -1;
    uint32_t idx[EVAL_BATCH];
    int correct = 0;
    for (uint32_t i = 0; i < tr->test.n; i += EVAL_BATCH) {
        int rows = (int)(tr->test.n - i < EVAL_BATCH ? tr->test.n - i : EVAL_BATCH);
        for (int r = 0; r < rows; r++)
            idx[r] = i + (uint32_t)r;
        int up = load_batch(tr, &tr->test, idx, rows);
        if (tr->c != NULL)
            psc_heartbeat(tr->c); /* evaluation can outlast a heartbeat interval */
        ps_notify_watchdog();
        double loss;
        int ok;
        if (up || psw_mlp_forward(&tr->mlp, rows) ||
            psw_mlp_loss(&tr->mlp, rows, tr->h_lab, &loss, &ok))
            return -1;
        correct += ok;
    }
    return (double)correct / tr->test.n;
}

/* Forward and loss of one micro-batch (index j of this worker's step).
 * overlap: the weights are still arriving; forward waits for them piece
 * by piece (weights_ready), then for whatever else is in flight. */
static int micro_batch(struct trainer *tr, uint64_t step_in_epoch, uint64_t j, int overlap,
                       double *loss, int *correct)
{
    int b = (int)tr->cfg.batch;
    uint64_t slot = (step_in_epoch * tr->cfg.accum_steps + j) * tr->cfg.workers + tr->cfg.rank;
    if (load_batch(tr, &tr->train, tr->perm + slot * (uint64_t)b, b))
        return PS_EDEVICE;
    int rc = overlap ? psw_mlp_forward_ready(&tr->mlp, b, weights_ready, tr)
                     : psw_mlp_forward(&tr->mlp, b);
    if (overlap) { /* whatever forward did not need: waited for all the same */
        int rest = sync_weights(tr);
        rc = rc != 0 ? rc : rest;
    }
    if (rc != 0)
        return rc;
    if (psw_mlp_loss(&tr->mlp, b, tr->h_lab, loss, correct))
        return PS_EDEVICE;
    return 0;
}

#define STEP_REJOINED 1 /* train_step: the clock moved; no step was taken */

/* The servers dropped this worker from their rounds (it was silent, or
 * late): say hello again and go on from the clock they name, with its
 * weights. */
static int rejoin(struct trainer *tr)
{
    uint64_t was = tr->clock;
    int rc = psc_rejoin(tr->c, (int)tr->cfg.timeout_ms);
    if (rc != 0) {
        PS_LOG(&tr->log, PS_LOG_ERROR, "W0304", "rejoin: %s", psc_last_error(tr->c));
        return rc;
    }
    tr->clock = psc_start_clock(tr->c);
    PS_LOG(&tr->log, PS_LOG_WARN, "W0012",
           "the servers took this worker out of their rounds at clock %llu (it was silent or "
           "late): rejoining at clock %llu",
           (unsigned long long)was, (unsigned long long)tr->clock);
    rc = pull_all(tr, tr->clock);
    tr->fresh = 0;
    return rc != 0 ? rc : STEP_REJOINED;
}

/* One clock: N micro-batches (N = --accum-steps); gradients of the first
 * N-1 are summed on the device, the last one's backward sends as it goes.
 * Global batch s of W x B x N samples: worker r's micro-batch j takes rows
 * ((s N + j) W + r) B onwards, so all workers and micro-batches together
 * see the same samples as one worker with batch W B N. */
static int train_step(struct trainer *tr, uint64_t step_in_epoch, double *loss, int *correct)
{
    /* distributed: the first forward pass starts while the weights arrive */
    int overlap = !tr->cfg.standalone && !tr->fresh;
    int rc = overlap ? 0 : sync_weights(tr);
    if (rc != 0)
        return rc;
    if (!overlap && !tr->cfg.standalone && psc_outside_round(tr->c))
        return rejoin(tr);
    int b = (int)tr->cfg.batch;
    uint64_t n_acc = tr->cfg.accum_steps;
    *loss = 0;
    *correct = 0;
    for (uint64_t j = 0; j < n_acc && rc == 0; j++) {
        double l = 0;
        int ok = 0;
        if ((rc = micro_batch(tr, step_in_epoch, j, overlap && j == 0, &l, &ok)) != 0)
            break;
        if (!isfinite(l)) { /* its gradients would poison the model: nothing is pushed */
            PS_LOG(&tr->log, PS_LOG_ERROR, "W0305",
                   "the loss became %g at step %llu of the epoch: stopping before its gradients "
                   "are pushed (a learning rate too high for this model?)",
                   l, (unsigned long long)step_in_epoch);
            return PS_EINVAL;
        }
        if (overlap && j == 0 && psc_outside_round(tr->c))
            return rejoin(tr); /* every pull was waited for: none in flight */
        *loss += l;
        *correct += ok;
        if (j + 1 == n_acc) {
            cork(tr, 1); /* the step's pushes go out as one message per shard */
            rc = psw_mlp_backward(&tr->mlp, b, on_chunk, tr);
            cork(tr, 0);
            break;
        }
        rc = psw_mlp_backward(&tr->mlp, b, NULL, NULL);
        for (int k = 0; k < tr->ntables && rc == 0; k++) {
            size_t n = (size_t)psw_mlp_table_size(&tr->mlp, k);
            const float *g = psw_mlp_grad(&tr->mlp, k);
            rc = j == 0 ? psk_copy(tr->be, tr->acc[k], g, n * 4) /* starts the sum */
                        : psk_axpy(tr->be, n, 1.0f, g, tr->acc[k]);
        }
    }
    if (rc != 0)
        return rc;
    for (int k = tr->ntables - 1; k >= 0 && tr->cfg.topk > 0 && rc == 0; k--)
        rc = send_topk(tr, k);
    if (rc != 0)
        return rc;
    for (int k = 0; k < tr->ntables && tr->cfg.standalone && tr->cfg.topk == 0; k++)
        psk_optim_apply(&tr->opt, tr->clock + 1, tr->hw[k], tr->s1[k], tr->s2[k], tr->hg[k],
                        (size_t)psw_mlp_table_size(&tr->mlp, k));
    tr->fresh = 0;
    if (!tr->cfg.standalone)
        next_weights(tr);
    tr->clock++;
    tr->done++;
    ps_notify_watchdog();
    if (tr->cfg.test_delay_ms) {
        struct timespec ts = {(time_t)(tr->cfg.test_delay_ms / 1000),
                              (long)(tr->cfg.test_delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    return rc;
}

/* Step `step` of an epoch that ends at step `steps` (its last, or where
 * --max-steps stops the run), timed from t0 when the epoch began at step
 * `first` (a rejoining worker starts inside one) of `epochs` in the run. */
static void progress(struct trainer *tr, uint64_t epoch, uint64_t epochs, uint64_t first,
                     uint64_t step, uint64_t steps, double loss, double t0, int done)
{
    double el = ps_mono_s() - t0;
    uint64_t did = step > first ? step - first : 0;
    double sps = el > 0 ? (double)(did * tr->cfg.batch * tr->cfg.accum_steps) / el : 0;
    double eta = did > 0 ? el / (double)did * (double)(steps - step) : 0;
    if (isatty(STDERR_FILENO)) {
        int bar = (int)(30.0 * step / steps), i;
        char b[31];
        for (i = 0; i < 30; i++)
            b[i] = i < bar ? '=' : (i == bar ? '>' : ' ');
        b[30] = '\0';
        fprintf(stderr, "\repoch %llu/%llu [%s] %llu/%llu loss %.4f %.0f samples/s ETA %.0fs ",
                (unsigned long long)epoch + 1, (unsigned long long)epochs, b,
                (unsigned long long)step, (unsigned long long)steps, loss, sps, eta);
        if (done)
            fputc('\n', stderr);
    } else if (done ? step % tr->cfg.log_every != 0 : step % tr->cfg.log_every == 0) {
        /* (an epoch's end on a multiple of --log-every was logged already) */
        PS_LOG(&tr->log, PS_LOG_INFO, "W0200",
               "epoch %llu/%llu step %llu/%llu loss %.4f %.0f samples/s ETA %.0fs",
               (unsigned long long)epoch + 1, (unsigned long long)epochs, (unsigned long long)step,
               (unsigned long long)steps, loss, sps, eta);
    }
}

/* Publishes this worker's metrics: at most every 250 ms unless forced. */
static void worker_metrics(struct trainer *tr, int force)
{
    double now = ps_mono_s();
    if (tr->metrics == NULL || (!force && now - tr->m_at < 0.25))
        return;
    double per_step = (double)(tr->cfg.batch * tr->cfg.accum_steps);
    if (now > tr->m_at && tr->done >= tr->m_done)
        tr->m_sps = (double)(tr->done - tr->m_done) * per_step / (now - tr->m_at);
    tr->m_at = now;
    tr->m_done = tr->done;
    struct ps_buf *b = &tr->mtext;
    char lab[256] = "", v[32];
    snprintf(v, sizeof v, "%llu", (unsigned long long)tr->cfg.rank);
    ps_prom_label(lab, sizeof lab, "rank", v);
    snprintf(v, sizeof v, "%llu", (unsigned long long)tr->cfg.workers);
    ps_prom_label(lab, sizeof lab, "workers", v);
    ps_prom_label(lab, sizeof lab, "device", tr->be != NULL ? psk_describe(tr->be) : "?");
    ps_prom_label(lab, sizeof lab, "mode", tr->cfg.standalone ? "standalone" : "servers");
    ps_prom_family(b, "psworker_info", "gauge", "This worker: rank, workers, device.");
    ps_prom_sample(b, "psworker_info", lab, 1);
    ps_prom_metric(b, "psworker_clock", "gauge", "The run's clock this worker is at (its step).",
                   (double)tr->clock);
    ps_prom_metric(b, "psworker_steps_total", "counter", "Steps this process has taken.",
                   (double)tr->done);
    ps_prom_metric(b, "psworker_samples_total", "counter", "Training samples this process used.",
                   (double)tr->done * per_step);
    ps_prom_metric(b, "psworker_samples_per_second", "gauge",
                   "Training samples per second since the previous publish.", tr->m_sps);
    ps_prom_metric(b, "psworker_loss", "gauge", "Mean training loss of the last step.", tr->m_loss);
    if (tr->m_accuracy >= 0)
        ps_prom_metric(b, "psworker_test_accuracy_ratio", "gauge",
                       "Test accuracy at the last evaluation.", tr->m_accuracy);
    uint64_t sent = 0, received = 0;
    if (tr->c != NULL) {
        psc_bytes(tr->c, &sent, &received);
        ps_prom_metric(b, "psworker_stale_pushes_total", "counter",
                       "Pushes the servers refused as outside the rounds.",
                       (double)psc_stale_pushes(tr->c));
        ps_prom_metric(b, "psworker_resent_requests_total", "counter",
                       "Requests sent again: unanswered after --retry-ms, or refused as not yet.",
                       (double)psc_resends(tr->c));
    }
    ps_prom_metric(b, "psworker_sent_bytes_total", "counter", "Bytes sent to the servers.",
                   (double)sent);
    ps_prom_metric(b, "psworker_received_bytes_total", "counter",
                   "Bytes received from the servers.", (double)received);
    ps_metrics_publish(tr->metrics, b);
}

static int train(struct trainer *tr, double *accuracy)
{
    uint64_t gb = tr->cfg.batch * tr->cfg.workers * tr->cfg.accum_steps;
    uint64_t steps = tr->train.n / gb, total = steps * tr->cfg.epochs;
    if (tr->cfg.max_steps && tr->cfg.max_steps < total)
        total = tr->cfg.max_steps;
    *accuracy = -1;
    int rc = 0;
    /* by the clock, not by counting: a worker rejoining a run starts (and
     * may move on) where the run is */
    uint64_t epochs = (total + steps - 1) / steps; /* --max-steps may end the run early */
    while (rc == 0 && tr->clock < total) {
        uint64_t e = tr->clock / steps, s = tr->clock % steps, first = s;
        uint64_t end = total - e * steps < steps ? total - e * steps : steps;
        psw_data_permute(tr->perm, tr->train.n, tr->cfg.seed, e);
        double t0 = ps_mono_s(), loss_sum = 0;
        uint64_t seen = 0;
        while (tr->clock / steps == e && tr->clock < total) {
            s = tr->clock % steps;
            double loss = 0;
            int ok = 0;
            rc = train_step(tr, s, &loss, &ok);
            if (rc == STEP_REJOINED) {
                rc = 0;
                continue;
            }
            if (rc != 0)
                break;
            loss_sum += loss;
            seen += tr->cfg.batch * tr->cfg.accum_steps;
            progress(tr, e, epochs, first, s + 1, end, loss_sum / seen, t0, 0);
            tr->m_loss = loss / (double)(tr->cfg.batch * tr->cfg.accum_steps);
            worker_metrics(tr, 0);
        }
        tr->train_seconds += ps_mono_s() - t0;
        if (rc != 0)
            break;
        progress(tr, e, epochs, first, tr->clock / steps == e ? tr->clock % steps : end, end,
                 seen ? loss_sum / seen : 0, t0, 1);
        if (tr->cfg.rank == 0) {
            *accuracy = evaluate(tr);
            PS_LOG(&tr->log, PS_LOG_INFO, "W0210", "epoch %llu: test accuracy %.4f",
                   (unsigned long long)e + 1, *accuracy);
            tr->m_accuracy = *accuracy;
            worker_metrics(tr, 1);
        }
    }
    if (rc == 0 && (rc = sync_weights(tr)) == 0 && tr->cfg.rank != 0)
        *accuracy = evaluate(tr); /* the final weights, so every summary has it */
    tr->m_accuracy = *accuracy;
    worker_metrics(tr, 1);
    return rc;
}

/* ---- outputs ----------------------------------------------------------------- */

/* --save: the weights as safetensors, named and shaped as PyTorch's
 * state_dict of the same model. */
static int save_safetensors(struct trainer *tr, const char *path)
{
    struct ps_st_tensor ts[TABLES_MAX];
    for (int k = 0; k < tr->ntables; k++) {
        char name[64];
        psw_mlp_table_name(k, name, sizeof name);
        int l = k / 2;
        ps_st_tensor(&ts[k], name, "F32", tr->hw[k], 4, (uint64_t)tr->mlp.dims[l + 1],
                     k % 2 ? 0 : (uint64_t)tr->mlp.dims[l]);
    }
    char err[512];
    const char *meta[] = {"format", "pt"};
    int rc = ps_st_write(path, ts, (size_t)tr->ntables, meta, 2, err, sizeof err);
    if (rc != 0)
        PS_LOG(&tr->log, PS_LOG_ERROR, "W0003", "--save: %s", err);
    return rc;
}

static int write_summary(struct trainer *tr, const char *path, double acc, double wall)
{
    uint64_t sent = 0, recvd = 0, ssent = 0, srecvd = 0;
    if (tr->c != NULL) {
        psc_bytes(tr->c, &sent, &recvd);
        psc_shm_bytes(tr->c, &ssent, &srecvd);
    }
    uint64_t done = tr->done;
    uint64_t samples = done * tr->cfg.batch * tr->cfg.accum_steps;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        return PS_EIO;
    char accs[32];
    if (acc >= 0)
        snprintf(accs, sizeof accs, "%.6f", acc);
    else
        snprintf(accs, sizeof accs, "null");
    int ok =
        fprintf(f,
                "{\"test_accuracy\": %s, \"samples_per_sec\": %.2f, \"steps\": %llu, "
                "\"epochs\": %llu, \"wall_seconds\": %.3f, \"bytes_pushed\": %llu, "
                "\"bytes_pulled\": %llu, \"bytes_pushed_per_step\": %.0f, "
                "\"bytes_pulled_per_step\": %.0f, \"rank\": %llu, \"workers\": %llu, "
                "\"device\": \"%s\", \"start_clock\": %llu, \"stale_pushes\": %llu, "
                "\"resends\": %llu, \"request_batches\": %llu, \"bytes_pushed_shared\": %llu, "
                "\"bytes_pulled_shared\": %llu}\n",
                accs, tr->train_seconds > 0 ? samples / tr->train_seconds : 0.0,
                (unsigned long long)done, (unsigned long long)tr->cfg.epochs, wall,
                (unsigned long long)sent, (unsigned long long)recvd,
                done ? (double)sent / (double)done : 0.0, done ? (double)recvd / (double)done : 0.0,
                (unsigned long long)tr->cfg.rank, (unsigned long long)tr->cfg.workers,
                psk_kind_of(tr->be) == PSK_CUDA ? "cuda" : "cpu", (unsigned long long)tr->clock0,
                (unsigned long long)(tr->c ? psc_stale_pushes(tr->c) : 0),
                (unsigned long long)(tr->c ? psc_resends(tr->c) : 0),
                (unsigned long long)(tr->c ? psc_batches_sent(tr->c) : 0),
                (unsigned long long)ssent, (unsigned long long)srecvd) > 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return PS_EIO;
    }
    return 0;
}

/* ---- setup -------------------------------------------------------------------- */

static int wire_dtype_of(const char *s)
{
    return strcmp(s, "f32") == 0    ? PSC_F32
           : strcmp(s, "f16") == 0  ? PSC_F16
           : strcmp(s, "bf16") == 0 ? PSC_BF16
                                    : -1;
}

static int check_config(const struct config *c, char *err, size_t errlen)
{
    int sparse = strcmp(c->model, "sparse-lr") == 0;
    if (strcmp(c->model, "mlp") != 0 && !sparse) {
        snprintf(err, errlen, "--model: '%s' is not a known model (mlp, sparse-lr)", c->model);
        return PS_EINVAL;
    }
    if (sparse && (c->standalone || c->topk > 0 || c->accum_steps > 1 || c->metrics_listen)) {
        snprintf(err, errlen,
                 "--model sparse-lr trains through servers, without --topk, --accum-steps or "
                 "--metrics-listen (not there yet)");
        return PS_EINVAL;
    }
    if (c->rank >= c->workers) {
        snprintf(err, errlen, "--rank %llu must be less than --workers %llu",
                 (unsigned long long)c->rank, (unsigned long long)c->workers);
        return PS_EINVAL;
    }
    if (strcmp(c->lr_schedule, "cosine") != 0 && strcmp(c->lr_schedule, "constant") != 0) {
        snprintf(err, errlen, "--lr-schedule: '%s' is not constant or cosine", c->lr_schedule);
        return PS_EINVAL;
    }
    if (wire_dtype_of(c->wire_dtype) < 0) {
        snprintf(err, errlen, "--wire-dtype: '%s' is not f32, f16 or bf16", c->wire_dtype);
        return PS_EINVAL;
    }
    int opt = psk_optim_parse(c->optimizer);
    if (opt < 0) {
        snprintf(err, errlen, "--optimizer: '%s' is not sgd, momentum, adagrad, adam or ftrl",
                 c->optimizer);
        return PS_EINVAL;
    }
    if (opt == PSK_OPT_FTRL && !sparse) { /* its weights collapse on the MLP's dense layers */
        snprintf(err, errlen,
                 "--optimizer ftrl: FTRL-proximal is for sparse models (--model sparse-lr); the "
                 "mlp takes sgd, momentum, adagrad or adam");
        return PS_EINVAL;
    }
    if (!c->standalone && c->servers == NULL) {
        snprintf(err, errlen, "--servers is required (or --standalone)");
        return PS_EINVAL;
    }
    if (c->standalone && c->workers != 1) {
        snprintf(err, errlen, "--standalone trains alone: --workers must be 1");
        return PS_EINVAL;
    }
    return ps_log_level_parse(c->log_level) < 0
               ? (snprintf(err, errlen, "--log-level: '%s' is not error, warn, info or debug",
                           c->log_level),
                  PS_EINVAL)
               : 0;
}

/* Buffers of a table's size in the shared region: its gradient and two
 * sets of its weights (setup_shm). */
#define SHM_BUFFERS 3

/* The region to share with shards on this host (CPU backend; 0: none):
 * those buffers, and with --topk each table's keys and values. */
static size_t shm_bytes(const struct trainer *tr)
{
    /* the region carries f32 values: with 16-bit ones on the wire every
     * request would take the socket anyway (setup_shm says so) */
    if (!tr->alias || tr->cfg.no_shm || wire_dtype_of(tr->cfg.wire_dtype) != PSC_F32)
        return 0;
    size_t b = 4096;
    for (int k = 0; k < psw_mlp_tables(&tr->mlp); k++) {
        size_t n = (size_t)psw_mlp_table_size(&tr->mlp, k);
        b += SHM_BUFFERS * (n * 4 + 64);
        if (tr->cfg.topk > 0)
            b += topk_count(tr, n) * (sizeof(uint64_t) + sizeof(float)) + 128;
    }
    return b;
}

/* Puts the gradients and two sets of weights in the shared region when
 * shards took it: their values then move without sockets, and pulled
 * weights are used where they land. */
static void setup_shm(struct trainer *tr)
{
    uint32_t local = 0;
    for (uint32_t s = 0; s < psc_shards(tr->c); s++)
        local += strncmp(psc_endpoint(tr->c, s), "ipc://", 6) == 0;
    if (local > 0 && tr->alias && !tr->cfg.no_shm && wire_dtype_of(tr->cfg.wire_dtype) != PSC_F32)
        PS_LOG(&tr->log, PS_LOG_INFO, "W0016",
               "%u of %u shards are on this host, but --wire-dtype %s values go through their "
               "sockets: shared memory carries f32 only (--wire-dtype f32 moves them without "
               "sockets there)",
               local, psc_shards(tr->c), tr->cfg.wire_dtype);
    uint32_t on = psc_shm_shards(tr->c);
    if (on == 0)
        return;
    int n = psw_mlp_tables(&tr->mlp);
    float *g[TABLES_MAX];
    for (int k = 0; k < n; k++) {
        size_t b = (size_t)psw_mlp_table_size(&tr->mlp, k) * 4;
        if ((g[k] = psc_shm_alloc(tr->c, b)) == NULL ||
            (tr->wset[0][k] = psc_shm_alloc(tr->c, b)) == NULL ||
            (tr->wset[1][k] = psc_shm_alloc(tr->c, b)) == NULL)
            return;
    }
    psw_mlp_place_grads(&tr->mlp, g);
    psw_mlp_point_params(&tr->mlp, tr->wset[0]);
    if (on == psc_shards(tr->c)) /* nothing of a step on a socket */
        psw_mlp_set_chunk_bytes(&tr->mlp, PSW_CHUNK_BYTES_SHM);
    tr->wsets = 1;
    PS_LOG(&tr->log, PS_LOG_INFO, "W0008",
           "%u of %u shards share memory with this worker: gradients and weights move without "
           "sockets there",
           on, psc_shards(tr->c));
}

/* psc_config's hello_waiting: which shards have not answered yet. */
static void log_hello_waiting(void *arg, const uint32_t *shards, uint32_t n, int waited_ms,
                              const char *why)
{
    struct trainer *tr = arg;
    char list[1024];
    size_t used = 0;
    for (uint32_t i = 0; i < n && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%u (%s)", i ? ", " : "",
                                 shards[i], tr->eps[shards[i]]);
    PS_LOG(&tr->log, PS_LOG_WARN, "W0014",
           "waited %d ms for %u of %u shard(s) to answer: %s (giving up after --timeout-ms "
           "%llu)%s%s",
           waited_ms, n, tr->neps, list, (unsigned long long)tr->cfg.timeout_ms, why ? ": " : "",
           why ? why : "");
}

/* Connects the client to --servers (hello to every shard). */
static int connect_client(struct trainer *tr, int nonzero_pulls, char *err, size_t errlen)
{
    const struct config *c = &tr->cfg;
    char buf[8192];
    const char *eps[PS_SHARDS_MAX];
    size_t n = 0;
    int rc = ps_split_servers(c->servers, buf, sizeof buf, eps, &n, err, errlen);
    if (rc != 0)
        return rc;
    struct psc_config pc = {.servers = eps,
                            .nservers = n,
                            .worker_id = (uint32_t)c->rank,
                            .connect_timeout_ms = (int)c->timeout_ms,
                            .wire_dtype = wire_dtype_of(c->wire_dtype),
                            .nonzero_pulls = nonzero_pulls,
                            .retry_ms = (int)c->retry_ms,
                            .heartbeat_ms = c->heartbeat_ms ? (int)c->heartbeat_ms : -1,
                            .local_ipc = !c->no_local_ipc,
                            .shm_bytes = shm_bytes(tr),
                            .io_cpus = tr->io_cpus.cpu,
                            .nio_cpus = tr->io_cpus.n,
                            .hello_waiting = log_hello_waiting,
                            .hello_waiting_arg = tr};
    tr->eps = eps;
    tr->neps = (uint32_t)n;
    struct ps_curve_keys mine, server;
    if ((rc = ps_curve_client(c->curve_secret, c->curve_server_key, &mine, &server, err, errlen)) !=
        0)
        return rc;
    if (mine.pub[0] != '\0') {
        pc.curve_server_key = server.pub;
        pc.curve_public = mine.pub;
        pc.curve_secret = mine.sec;
    }
    rc = psc_create(&pc, &tr->c, err, errlen);
    tr->eps = NULL; /* eps is this function's */
    if (rc != 0)
        return rc;
    for (uint32_t s = 0; s < n; s++)
        if (strcmp(psc_endpoint(tr->c, s), eps[s]) != 0)
            PS_LOG(&tr->log, PS_LOG_INFO, "W0006", "shard %u (%s) is on this host: using %s", s,
                   eps[s], psc_endpoint(tr->c, s));
    return 0;
}

static int setup(struct trainer *tr, char *err, size_t errlen)
{
    struct config *c = &tr->cfg;
    int rc = psk_open(c->device, &tr->be, err, errlen);
    if (rc != 0)
        return rc;
    if (err[0] != '\0') /* --device auto fell back to the CPU: say why */
        PS_LOG(&tr->log, PS_LOG_INFO, "W0015", "--device %s: %s; training on the CPU", c->device,
               err);
    tr->alias = psk_kind_of(tr->be) == PSK_CPU;
    if (c->compute_threads == 0)
        c->compute_threads = ps_cpus_allowed() >= 2 ? 2 : 1;
    if (tr->alias && c->compute_threads > 1) {
        if (ps_pool_start(&tr->pool, PS_POOL_SPIN_NS, "psworker-help") != 0) {
            snprintf(err, errlen, "--compute-threads: cannot start the helper thread");
            return PS_ENOMEM;
        }
        psk_set_blas_threads(tr->be, 1);
    }
    PS_LOG(&tr->log, PS_LOG_INFO, "W0001", "rank %llu of %llu on %s%s%s",
           (unsigned long long)c->rank, (unsigned long long)c->workers, psk_describe(tr->be),
           tr->pool ? " and a helper thread" : "", c->standalone ? " (standalone)" : "");
    int dims[PSW_LAYERS_MAX + 1];
    int nl = psw_mlp_parse_layers(c->layers, dims, err, errlen);
    if (nl < 0)
        return nl;
    if ((rc = psw_data_load(c->data, "train", dims[nl], &tr->train, err, errlen)) != 0 ||
        (rc = psw_data_load(c->data, "t10k", dims[nl], &tr->test, err, errlen)) != 0)
        return rc;
    if ((uint32_t)dims[0] != tr->train.pixels || tr->test.pixels != tr->train.pixels) {
        snprintf(err, errlen, "--layers: input width %d, but the images have %u pixels", dims[0],
                 tr->train.pixels);
        return PS_EINVAL;
    }
    if (c->batch * c->workers * c->accum_steps > tr->train.n) {
        snprintf(err, errlen,
                 "--batch %llu x --workers %llu x --accum-steps %llu exceeds the %u training "
                 "examples",
                 (unsigned long long)c->batch, (unsigned long long)c->workers,
                 (unsigned long long)c->accum_steps, tr->train.n);
        return PS_EINVAL;
    }
    int bmax = (int)c->batch > EVAL_BATCH ? (int)c->batch : EVAL_BATCH;
    if ((rc = psw_mlp_init(&tr->mlp, tr->be, dims, nl, bmax, err, errlen)) != 0)
        return rc;
    psw_mlp_set_pool(&tr->mlp, tr->pool);
    tr->perm = malloc((size_t)tr->train.n * sizeof *tr->perm);
    tr->h_lab = malloc((size_t)bmax * sizeof *tr->h_lab);
    if (tr->perm == NULL || tr->h_lab == NULL ||
        (!tr->alias && /* the CPU backend builds batches in place (load_batch) */
         psk_host_alloc(tr->be, (size_t)bmax * tr->train.pixels * 4, (void **)&tr->h_in))) {
        snprintf(err, errlen, "out of memory for batches");
        return PS_ENOMEM;
    }
    /* nonzero pulls cost nothing for unpruned tables: the servers only use
     * them where they save bytes */
    if (!c->standalone && (rc = connect_client(tr, 1, err, errlen)) != 0)
        return rc;
    if (!c->standalone)
        setup_shm(tr);
    /* The schedule spans the run's clocks (the server converts its own
     * application count in asp/ssp). Every worker computes the same value,
     * so the table specs agree. */
    uint64_t steps = (uint64_t)(tr->train.n / (c->batch * c->workers * c->accum_steps)) * c->epochs;
    if (c->max_steps && c->max_steps < steps)
        steps = c->max_steps;
    tr->decay_steps = steps;
    if ((rc = setup_tables(tr, err, errlen)) != 0)
        return rc;
    if (!c->standalone)
        tr->clock = tr->clock0 = psc_start_clock(tr->c);
    if (tr->clock > 0 && tr->clock >= steps) {
        /* the servers are past this run: nothing to train, the final weights to read */
        PS_LOG(&tr->log, PS_LOG_WARN, "W0013",
               "the run is over: the servers are at clock %llu and this run has %llu steps; "
               "reading the final weights only",
               (unsigned long long)tr->clock, (unsigned long long)steps);
        tr->clock = tr->clock0 = steps;
    } else if (tr->clock > 0) {
        uint64_t per_epoch = tr->train.n / (c->batch * c->workers * c->accum_steps);
        PS_LOG(&tr->log, PS_LOG_INFO, "W0011",
               "rejoining a run in progress at clock %llu (epoch %llu, step %llu of %llu)",
               (unsigned long long)tr->clock, (unsigned long long)(tr->clock / per_epoch + 1),
               (unsigned long long)(tr->clock % per_epoch), (unsigned long long)per_epoch);
    }
    return c->standalone ? 0 : pull_all(tr, tr->clock);
}

static void teardown(struct trainer *tr)
{
    for (int k = 0; k < tr->ntables; k++) {
        if (!tr->alias) {
            psk_host_free(tr->be, tr->hw[k]);
            psk_host_free(tr->be, tr->hg[k]);
        }
        free(tr->s1[k]);
        free(tr->s2[k]);
        psk_free(tr->be, tr->acc[k]);
        psk_free(tr->be, tr->resid[k]);
        psk_free(tr->be, tr->vel[k]);
        if (!tr->sel_shm[k]) {
            free(tr->sel_idx[k]);
            free(tr->sel_val[k]);
        }
    }
    ps_metrics_stop(tr->metrics);
    ps_buf_free(&tr->mtext);
    psc_destroy(tr->c);
    ps_pool_stop(tr->pool);
    if (tr->be != NULL) {
        psk_host_free(tr->be, tr->h_in);
        psw_mlp_fini(&tr->mlp);
        psk_close(tr->be);
    }
    free(tr->perm);
    free(tr->h_lab);
    psw_data_free(&tr->train);
    psw_data_free(&tr->test);
}

/* --model sparse-lr: its own loop (sparse_lr.c) over the same client. */
static int run_sparse_lr(struct trainer *tr)
{
    const struct config *c = &tr->cfg;
    char err[512];
    double t0 = ps_mono_s();
    int rc = connect_client(tr, 0, err, sizeof err);
    struct psw_slr_config sc = {
        .data = c->data,
        .rank = (uint32_t)c->rank,
        .workers = (uint32_t)c->workers,
        .batch = c->batch,
        .epochs = c->epochs,
        .max_steps = c->max_steps,
        .seed = c->seed,
        .log_every = c->log_every,
        .optimizer = psk_optim_parse(c->optimizer),
        .lr = (float)c->lr,
        .l1 = (float)c->l1,
        .l2 = (float)c->l2,
        .rows_max = c->rows_max,
        .timeout_ms = (int)c->timeout_ms,
        .embed_dim = (uint32_t)c->embed_dim,
        .hidden = (uint32_t)c->embed_hidden,
        .device = c->device,
    };
    struct psw_slr_result res = {0};
    if (rc == 0)
        rc = psw_slr_train(&sc, tr->c, &tr->log, &res, err, sizeof err);
    if (rc != 0)
        PS_LOG(&tr->log, PS_LOG_ERROR, "W0002", "%s", err);
    uint64_t sent = 0, recvd = 0;
    if (tr->c != NULL)
        psc_bytes(tr->c, &sent, &recvd);
    FILE *f = c->summary_json && rc == 0 ? fopen(c->summary_json, "w") : NULL;
    if (f != NULL) {
        fprintf(f,
                "{\"test_accuracy\": %.6f, \"test_logloss\": %.6f, \"samples_per_sec\": %.2f, "
                "\"steps\": %llu, \"epochs\": %llu, \"wall_seconds\": %.3f, "
                "\"bytes_pushed\": %llu, \"bytes_pulled\": %llu, \"rows_pulled_per_step\": %.1f, "
                "\"rank\": %llu}\n",
                res.test_accuracy, res.test_logloss,
                res.train_seconds > 0 ? res.samples / res.train_seconds : 0.0,
                (unsigned long long)res.steps, (unsigned long long)c->epochs, ps_mono_s() - t0,
                (unsigned long long)sent, (unsigned long long)recvd,
                res.steps ? (double)res.rows_pulled / (double)res.steps : 0.0,
                (unsigned long long)c->rank);
        fclose(f);
    }
    psc_destroy(tr->c);
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    ps_malloc_tune();
    static struct trainer tr; /* large; zeroed */
    char err[512];
    if (ps_opts_parse(opts, NOPTS, &tr.cfg, argc, argv, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "psworker: %s\n", err);
        return 2;
    }
    if (tr.cfg.help) {
        ps_opts_usage(stdout, "psworker [OPTIONS]",
                      "psworker trains a model on its shard of the data through psd servers.", opts,
                      NOPTS);
        return 0;
    }
    if (check_config(&tr.cfg, err, sizeof err) != 0) {
        fprintf(stderr, "psworker: %s\n", err);
        return 2;
    }
    /* both checked against the CPUs allowed before either is pinned */
    if ((tr.cfg.cpus != NULL && ps_cpus_parse("--cpus", tr.cfg.cpus, &tr.cpus, err, sizeof err)) ||
        (tr.cfg.io_cpus != NULL &&
         ps_cpus_parse("--io-cpus", tr.cfg.io_cpus, &tr.io_cpus, err, sizeof err)) ||
        (tr.cpus.n > 0 && ps_cpus_pin_process(&tr.cpus, err, sizeof err))) {
        fprintf(stderr, "psworker: %s\n", err);
        return 2;
    }
    char prog[32];
    snprintf(prog, sizeof prog, "psworker.%llu", (unsigned long long)tr.cfg.rank);
    ps_log_init(&tr.log, prog, ps_log_level_parse(tr.cfg.log_level));
    if (tr.cpus.n > 0 || tr.io_cpus.n > 0) {
        char on[256] = "any", io[256] = "as the rest";
        if (tr.cpus.n > 0)
            ps_cpus_format(&tr.cpus, on, sizeof on);
        if (tr.io_cpus.n > 0)
            ps_cpus_format(&tr.io_cpus, io, sizeof io);
        PS_LOG(&tr.log, PS_LOG_INFO, "W0007", "threads on CPUs %s, ZeroMQ's I/O thread on %s", on,
               io);
    }
    if (strcmp(tr.cfg.model, "sparse-lr") == 0)
        return run_sparse_lr(&tr);
    double t0 = ps_mono_s(), acc = -1;
    tr.m_accuracy = -1;
    tr.m_at = t0;
    if (tr.cfg.metrics_listen != NULL) {
        if (ps_metrics_start(&tr.metrics, tr.cfg.metrics_listen, err, sizeof err) != 0) {
            PS_LOG(&tr.log, PS_LOG_ERROR, "W0005", "%s", err);
            return 2;
        }
        PS_LOG(&tr.log, PS_LOG_INFO, "W0013", "metrics on %s (port %d): GET /metrics, /healthz",
               tr.cfg.metrics_listen, ps_metrics_port(tr.metrics));
    }
    int rc = setup(&tr, err, sizeof err);
    if (rc != 0) {
        PS_LOG(&tr.log, PS_LOG_ERROR, "W0002", "%s", err);
    } else {
        snprintf(err, sizeof err, "rank %llu of %llu training from clock %llu",
                 (unsigned long long)tr.cfg.rank, (unsigned long long)tr.cfg.workers,
                 (unsigned long long)tr.clock);
        ps_notify_ready(err);
        worker_metrics(&tr, 1);
        rc = train(&tr, &acc);
    }
    ps_notify_stopping();
    if (rc == 0 && tr.cfg.save != NULL && tr.cfg.rank == 0)
        rc = save_safetensors(&tr, tr.cfg.save); /* it logs why it failed */
    if (rc == 0) {
        PS_LOG(&tr.log, PS_LOG_INFO, "W0100",
               "done: %llu steps, test accuracy %.4f, %.0f samples/s", (unsigned long long)tr.done,
               acc,
               tr.train_seconds > 0 ? tr.done * tr.cfg.batch * tr.cfg.accum_steps / tr.train_seconds
                                    : 0.0);
    }
    if (tr.cfg.summary_json != NULL && tr.be != NULL &&
        write_summary(&tr, tr.cfg.summary_json, acc, ps_mono_s() - t0) != 0)
        PS_LOG(&tr.log, PS_LOG_ERROR, "W0004", "--summary-json: cannot write '%s'",
               tr.cfg.summary_json);
    teardown(&tr);
    return rc == 0 ? 0 : 1;
}
