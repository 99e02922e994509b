/* Moving weights and gradients: the tables a model needs, pulls for a
 * clock, pushes (whole, in chunks as backward produces them, or top-k),
 * and loading a batch. */
#include "exchange.h"

#include "connect.h"
#include "local.h"
#include "model.h"
#include "report.h"
#include "topk.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_init.h"
#include "ps_limits.h"
#include "ps_notify.h"
#include "ps_shard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The gradient a step sends for table k: backward's own, or the sum of
 * the accumulated micro-batches. */
static float *grad_src(struct trainer *tr, int k)
{
    return tr->acc[k] ? tr->acc[k] : psw_grad(tr, k);
}

#define TICKETS_MAX 1024 /* push-pulls of one step: one per weight chunk and bias */

/* The distributed exchange's state: the tables' ids on the shards, the
 * pulls (and push-pulls) in flight this step, and the two sets of
 * weights in the shared region. */
struct psw_exchange {
    uint32_t th[TABLES_MAX];
    uint64_t pull_tk[TICKETS_MAX]; /* pulls, or push-pulls, in flight */
    struct pull_range {            /* what each brings: table k's [first, first+n) */
        int k;                     /* -1: no weights (a top-k push) */
        uint64_t first, n;
        int done; /* waited for */
    } pull_at[TICKETS_MAX];
    int pulls_pending;
    /* with shared memory: two sets of weights in the region; the model
     * reads set wcur while the pulls of the next clock land in the other */
    float *wset[2][TABLES_MAX];
    int wcur, wsets;
    /* --topk over sockets: each table's weights as a mirror (psclient.h),
     * so that a pull brings what changed since the last; NULL: whole */
    struct psc_mirror *mirror[TABLES_MAX];
};

struct psw_exchange *psw_exchange_create(void)
{
    return calloc(1, sizeof(struct psw_exchange));
}

void psw_exchange_destroy(struct psw_exchange *x)
{
    free(x);
}

/* The optimizer that applies the pushes (psd's, or --standalone's): with
 * --topk and momentum the worker keeps the momentum, and it is SGD. */
static int server_optimizer(const struct config *c)
{
    return psw_topk_momentum(c) ? PSK_OPT_SGD : psk_optim_parse(c->optimizer);
}

/* shape: room for the table's dimensions, which a CNN's tables carry
 * (psctl export then writes conv1.weight as [32, 1, 3, 3]). */
static void table_spec(const struct trainer *tr, int k, struct psc_table_spec *s, char *name,
                       size_t len, uint64_t *shape, uint32_t *pushers)
{
    psw_table_name(tr, k, name, len);
    psc_table_spec_init(s, name, psw_table_size(tr, k));
    s->optimizer = server_optimizer(&tr->cfg);
    s->lr = (float)tr->cfg.lr;
    s->momentum = (float)tr->cfg.momentum;
    s->weight_decay = (float)tr->cfg.weight_decay;
    /* the whole model's table index: a stage's tables start where the
     * unsplit model's do, so they start from the same weights */
    s->seed = ps_mix64(tr->cfg.seed * 1000003u + (uint64_t)(tr->kbase + k));
    s->lr_schedule = strcmp(tr->cfg.lr_schedule, "cosine") == 0 ? 1 : 0;
    s->lr_decay_steps = tr->decay_steps;
    if (k % 2 == 0) { /* He init for ReLU layers: N(0, 2 / fan_in) */
        s->init = PSC_INIT_NORMAL;
        s->init_scale = sqrtf(2.0f / (float)psw_fan_in(tr, k));
    }
    if (tr->shaped) {
        s->ndims = (uint32_t)psw_table_shape(tr, k, shape);
        s->shape = shape;
    }
    if (tr->cfg.stages > 1) { /* its rounds: this stage's processes, one per pipeline */
        for (uint64_t p = 0; p < psw_pipelines(&tr->cfg); p++)
            pushers[p] = (uint32_t)(p * tr->cfg.stages + psw_stage(&tr->cfg));
        s->pushers = pushers;
        s->npushers = (uint32_t)psw_pipelines(&tr->cfg);
    }
}

int psw_setup_tables(struct trainer *tr, char *err, size_t errlen)
{
    tr->ntables = psw_ntables(tr);
    if (tr->cfg.standalone && (tr->local = psw_local_create(&tr->cfg, server_optimizer(&tr->cfg),
                                                            tr->decay_steps)) == NULL)
        return PS_ENOMEM;
    if (tr->cfg.topk > 0 && (tr->topk = psw_topk_create()) == NULL)
        return PS_ENOMEM;
    for (int k = 0; k < tr->ntables; k++) {
        size_t n = (size_t)psw_table_size(tr, k);
        if (tr->cfg.accum_steps > 1 && psk_alloc(tr->be, n * 4, (void **)&tr->acc[k])) {
            snprintf(err, errlen, "cannot allocate accumulation buffers");
            return PS_ENOMEM;
        }
        if (tr->cfg.topk > 0 && psw_topk_table(tr, k, n) != 0) {
            snprintf(err, errlen, "cannot allocate top-k buffers");
            return PS_ENOMEM;
        }
        if (tr->alias) {
            tr->hw[k] = psw_param(tr, k);
            tr->hg[k] = grad_src(tr, k);
        } else if (psk_host_alloc(tr->be, n * 4, (void **)&tr->hw[k]) ||
                   psk_host_alloc(tr->be, n * 4, (void **)&tr->hg[k])) {
            snprintf(err, errlen, "cannot allocate host buffers");
            return PS_ENOMEM;
        }
        struct psc_table_spec s;
        char name[64];
        uint64_t shape[4];
        static uint32_t pushers[PS_WORKERS_MAX];
        table_spec(tr, k, &s, name, sizeof name, shape, pushers);
        if (tr->cfg.standalone) {
            /* the same initialiser the servers run, element by element */
            ps_init_fill(tr->hw[k], n, (enum ps_init_kind)s.init, s.init_scale, s.seed, 0);
            if (psw_local_table(tr->local, k, n) != 0)
                return PS_ENOMEM;
            continue;
        }
        int rc = psc_table_create(tr->c, &s, (int)tr->cfg.timeout_ms, &tr->ex->th[k]);
        if (rc != 0) {
            snprintf(err, errlen, "create table '%s': %s", name, psc_last_error(tr->c));
            return rc;
        }
        /* top-k changes the elements it sends; through the region (two
         * sets of weights) a whole pull is a copy in memory */
        if (tr->cfg.topk > 0 && !tr->cfg.whole_pulls && !tr->ex->wsets &&
            (rc = psc_mirror_open(tr->c, tr->ex->th[k], 0, n, tr->hw[k], &tr->ex->mirror[k])) !=
                0) {
            snprintf(err, errlen, "table '%s': %s", name, psc_last_error(tr->c));
            return rc;
        }
    }
    int rc = 0;
    tr->vote.struct_size = sizeof tr->vote;
    if (tr->prec == PSK_PREC_F16 && !tr->cfg.standalone &&
        (rc = psc_vote_open(tr->c, "found_inf", (int)tr->cfg.timeout_ms, &tr->vote)) != 0)
        snprintf(err, errlen, "the overflow vote: %s", psc_last_error(tr->c));
    char how[192] = "";
    if (tr->prec == PSK_PREC_F16)
        snprintf(how, sizeof how, " (loss scale %g%s)", tr->scale,
                 tr->cfg.standalone ? ""
                 : tr->vote.bsp     ? "; when one worker's gradients overflow, all skip the step, "
                                      "by a vote through psd"
                                    : "; the servers hold no bsp rounds, so each worker skips "
                                      "its own overflowing steps");
    if (rc == 0 && tr->prec != PSK_PREC_F32)
        PS_LOG(&tr->log, PS_LOG_INFO, W0019, "computing in %s with f32 accumulation%s",
               psk_precision_name(tr->prec), how);
    return rc;
}

/* Where pulls of table k land: with two sets of weights, the one the
 * model is not reading (a shard writes it when it answers, and backward
 * may still be reading the weights then); otherwise hw, which a pull
 * writes inside psc_wait only. */
static float *pull_dst(struct trainer *tr, int k)
{
    struct psw_exchange *x = tr->ex;
    return x->wsets ? x->wset[1 - x->wcur][k] : tr->hw[k];
}

/* The pulls of the next clock are all on their way into the other set:
 * the model reads that one from now on (forward waits for each piece of
 * it as before), and the next pulls land in this one. */
void psw_next_weights(struct trainer *tr)
{
    struct psw_exchange *x = tr->ex;
    if (x == NULL || !x->wsets)
        return;
    x->wcur = 1 - x->wcur;
    memcpy(tr->hw, x->wset[x->wcur], (size_t)tr->ntables * sizeof *tr->hw);
    psw_point_params(tr, tr->hw);
}

/* Notes what pull i (a ticket in pull_tk) brings. */
static void note_pull(struct trainer *tr, int i, int k, uint64_t first, uint64_t n)
{
    tr->ex->pull_at[i] = (struct pull_range){k, first, n, 0};
}

/* Waits for the pulls not yet waited for that bring elements [a, b) of
 * table k (k < 0: every pull), uploading each range to the device when
 * upload is set. Returns the first error; waits for the others anyway. */
static int wait_pulls(struct trainer *tr, int k, uint64_t a, uint64_t b, int upload)
{
    struct psw_exchange *x = tr->ex;
    int first = 0;
    for (int i = 0; i < x->pulls_pending; i++) {
        struct pull_range *p = &x->pull_at[i];
        if (p->done || (k >= 0 && (p->k != k || p->first >= b || p->first + p->n <= a)))
            continue;
        p->done = 1;
        /* in slices of WAIT_SLICE_MS, petting the service watchdog while a
         * round waits */
        enum { WAIT_SLICE_MS = 1000 };
        int rc = PS_ETIMEDOUT;
        double until = ps_mono_s() + (double)tr->cfg.timeout_ms / 1e3;
        while (rc == PS_ETIMEDOUT && ps_mono_s() < until) {
            rc = psc_wait(tr->c, x->pull_tk[i], WAIT_SLICE_MS);
            ps_notify_watchdog();
            if (rc == PS_ETIMEDOUT)
                psw_worker_metrics(tr, 0); /* waiting, not stuck: /healthz stays ok */
        }
        if (rc == PS_ETIMEDOUT)
            psc_cancel(tr->c, x->pull_tk[i]);
        if (rc == 0 && upload && p->k >= 0 &&
            psk_upload(tr->be, psw_param(tr, p->k) + p->first, tr->hw[p->k] + p->first,
                       (size_t)p->n * 4))
            rc = PS_EDEVICE;
        if (rc != 0 && first == 0) {
            first = rc;
            PS_LOG(&tr->log, PS_LOG_ERROR, W0300, "pull %d of this step failed: %s%s", i,
                   rc == PS_EDEVICE ? "device upload" : psc_last_error(tr->c),
                   rc == PS_ETIMEDOUT ? " (the whole --timeout-ms passed)" : "");
        }
    }
    return first;
}

static int pull_table(struct trainer *tr, int k, uint64_t clock)
{
    uint64_t n = psw_table_size(tr, k);
    note_pull(tr, k, k, 0, n);
    struct psw_exchange *x = tr->ex;
    int rc = x->mirror[k] != NULL
                 ? psc_mirror_pull(tr->c, x->mirror[k], clock, &x->pull_tk[k])
                 : psc_pull(tr->c, x->th[k], 0, n, pull_dst(tr, k), clock, &x->pull_tk[k]);
    if (rc != 0)
        PS_LOG(&tr->log, PS_LOG_ERROR, W0301, "pull: %s", psc_last_error(tr->c));
    return rc;
}

/* Requests from here to psw_cork(tr, 0) go to each shard together where they
 * can (psc_cork), unless --no-batch. */
void psw_cork(struct trainer *tr, int on)
{
    if (tr->c != NULL && !tr->cfg.no_batch)
        (void)psc_cork(tr->c, on); /* PS_ENOMEM: they go one by one */
}

/* Pulls every table at `clock` (start, rejoin). */
int psw_pull_all(struct trainer *tr, uint64_t clock)
{
    int rc = 0;
    psw_cork(tr, 1);
    for (int k = 0; k < tr->ntables && rc == 0; k++)
        rc = pull_table(tr, k, clock);
    psw_cork(tr, 0);
    tr->ex->pulls_pending = tr->ntables;
    psw_next_weights(tr);
    return rc;
}

/* Makes the device hold the weights for the current clock: distributed,
 * every pull still in flight is waited for and its range uploaded (the
 * step's pulls cover every table); standalone, the host copies the
 * optimizer updated are uploaded. */
int psw_sync_weights(struct trainer *tr)
{
    if (tr->fresh)
        return 0;
    if (!tr->cfg.standalone) {
        int rc = wait_pulls(tr, -1, 0, UINT64_MAX, !tr->alias);
        tr->ex->pulls_pending = 0;
        if (rc != 0)
            return rc;
    }
    for (int k = 0; k < tr->ntables && !tr->alias && tr->cfg.standalone; k++)
        if (psk_upload(tr->be, psw_param(tr, k), tr->hw[k], (size_t)psw_table_size(tr, k) * 4))
            return PS_EDEVICE;
    tr->fresh = 1;
    return 0;
}

/* Forward's ready callback: the weights of layer l's rows [r0, r1) (its
 * bias when r0 == r1) have arrived, so the forward pass of the next step
 * starts on the first rows while the last are still on the wire. */
int psw_weights_ready(void *arg, int l, int r0, int r1)
{
    struct trainer *tr = arg;
    int k = tr->k0 + 2 * l; /* the head's tables follow the convolutions' */
    if (r0 == r1)
        return wait_pulls(tr, k + 1, 0, UINT64_MAX, !tr->alias);
    uint64_t in = (uint64_t)tr->mlp.dims[l];
    return wait_pulls(tr, k, (uint64_t)r0 * in, (uint64_t)r1 * in, !tr->alias);
}

/* Waits for every pull in flight of table k. */
int psw_wait_table(struct trainer *tr, int k)
{
    return wait_pulls(tr, k, 0, UINT64_MAX, !tr->alias);
}

/* Sends [first, first+n) of table k's gradient as a push-pull: this
 * clock's gradient out, the next clock's weights for the same range back. */
static int send_range(struct trainer *tr, int k, uint64_t first, uint64_t n)
{
    if (tr->acc[k] != NULL) { /* last micro-batch: add it, then average */
        float *a = tr->acc[k] + first;
        if (psk_axpy(tr->be, n, 1.0f, psw_grad(tr, k) + first, a) ||
            psk_scale(tr->be, n, 1.0f / (float)tr->cfg.accum_steps, a))
            return PS_EDEVICE;
    }
    if (tr->cfg.topk > 0)
        return 0; /* selected and sent after backward (send_topk) */
    if (!tr->alias && psk_download(tr->be, tr->hg[k] + first, grad_src(tr, k) + first, n * 4))
        return PS_EDEVICE;
    if (tr->cfg.standalone)
        return 0; /* applied after backward, which still reads the weights */
    struct psw_exchange *x = tr->ex;
    if (x->pulls_pending >= TICKETS_MAX)
        return PS_ELIMIT;
    note_pull(tr, x->pulls_pending, k, first, n);
    int rc = psc_push_pull(tr->c, x->th[k], first, n, tr->hg[k] + first, pull_dst(tr, k) + first,
                           tr->clock, &x->pull_tk[x->pulls_pending]);
    if (rc != 0) {
        PS_LOG(&tr->log, PS_LOG_ERROR, W0302, "push: %s", psc_last_error(tr->c));
        return rc;
    }
    x->pulls_pending++;
    return 0;
}

/* --topk: adds this step's gradient to the residual (through the local
 * velocity when momentum is corrected), takes the largest entries out of
 * it and sends them as a sparse push, and asks for the next clock's
 * weights. Standalone applies them with the same optimizer code. */
int psw_send_topk(struct trainer *tr, int k)
{
    size_t n = (size_t)psw_table_size(tr, k), nsel = 0;
    const uint64_t *idx = NULL;
    const float *val = NULL;
    int rc = psw_topk_select(tr, k, grad_src(tr, k), &idx, &val, &nsel);
    if (rc != 0)
        return rc;
    if (tr->cfg.standalone) {
        psw_local_apply_sparse(tr, k, idx, val, nsel);
        return 0;
    }
    struct psw_exchange *x = tr->ex;
    if (x->pulls_pending + 2 > TICKETS_MAX)
        return PS_ELIMIT;
    note_pull(tr, x->pulls_pending, -1, 0, 0);
    note_pull(tr, x->pulls_pending + 1, k, 0, n);
    rc = psc_push_keys(tr->c, x->th[k], idx, val, nsel, tr->clock, &x->pull_tk[x->pulls_pending]);
    uint64_t *tk = &x->pull_tk[x->pulls_pending + 1];
    if (rc == 0)
        rc = x->mirror[k] != NULL
                 ? psc_mirror_pull(tr->c, x->mirror[k], tr->clock + 1, tk)
                 : psc_pull(tr->c, x->th[k], 0, n, pull_dst(tr, k), tr->clock + 1, tk);
    if (rc != 0) {
        PS_LOG(&tr->log, PS_LOG_ERROR, W0303, "top-k push: %s", psc_last_error(tr->c));
        return rc;
    }
    x->pulls_pending += 2;
    return 0;
}

/* Backward callback: rows [r0, r1) of layer l's weight gradient are ready
 * (and, with the last rows, its bias gradient). They go out at once while
 * backward goes on. Replies are read only inside psc_wait, i.e. after
 * backward, so weights still needed below are not overwritten under it. */
int psw_on_chunk(void *arg, int l, int r0, int r1)
{
    struct trainer *tr = arg;
    uint64_t in = (uint64_t)tr->mlp.dims[l];
    int k = tr->k0 + 2 * l;
    int rc = send_range(tr, k, (uint64_t)r0 * in, (uint64_t)(r1 - r0) * in);
    if (rc == 0 && r1 == tr->mlp.dims[l + 1])
        rc = send_range(tr, k + 1, 0, (uint64_t)r1);
    return rc;
}

/* The CNN's backward callback: convolution table k's weight gradient and
 * its bias's (k + 1) are ready; both go out whole. */
int psw_on_conv_grads(void *arg, int k)
{
    struct trainer *tr = arg;
    int rc = send_range(tr, k, 0, psw_table_size(tr, k));
    return rc != 0 ? rc : send_range(tr, k + 1, 0, psw_table_size(tr, k + 1));
}

/* Rows idx[0..rows) of split d as the model's input, their labels into
 * h_lab. On the CPU backend the batch is built in the model's input
 * buffer itself; a device gets it uploaded from h_in. */
int psw_load_batch(struct trainer *tr, const struct psw_split *d, const uint32_t *idx, int rows)
{
    if (tr->alias) {
        psw_data_batch(d, idx, rows, psw_input(tr), tr->h_lab);
        return 0;
    }
    psw_data_batch(d, idx, rows, tr->h_in, tr->h_lab);
    return psk_upload(tr->be, psw_input(tr), tr->h_in, (size_t)rows * d->pixels * 4);
}

/* Forward while the weights arrive: the convolutions wait for theirs
 * whole, the head piece by piece. */
int psw_forward_ready(struct trainer *tr, int rows)
{
    int rc = 0;
    for (int k = 0; k < tr->k0 && rc == 0; k++)
        rc = psw_wait_table(tr, k);
    if (rc == 0 && tr->k0 > 0)
        rc = psw_cnn_forward(&tr->cnn, rows);
    return rc != 0 ? rc : psw_mlp_forward_ready(&tr->mlp, rows, psw_weights_ready, tr);
}

/* Backward, each table's gradient going out as soon as it is computed
 * (the head's in row chunks, each convolution's whole). */
int psw_backward_sending(struct trainer *tr, int rows)
{
    int rc = psw_mlp_backward(&tr->mlp, rows, psw_on_chunk, tr);
    if (rc == 0 && tr->k0 > 0)
        rc = psw_cnn_backward(&tr->cnn, rows, psw_on_conv_grads, tr);
    return rc;
}

/* Every gradient out, as backward's callbacks would have sent them: the
 * head's chunks from its last layer, then each convolution from the last
 * (a loss-scaled step checks them all before any goes). */
int psw_send_all_grads(struct trainer *tr)
{
    int rc = psw_mlp_each_chunk(&tr->mlp, psw_on_chunk, tr);
    for (int l = tr->cnn.n - 1; l >= 0 && tr->k0 > 0 && rc == 0; l--)
        rc = psw_on_conv_grads(tr, 2 * l);
    return rc;
}

/* Puts the gradients and two sets of weights in the shared region when
 * shards took it: their values then move without sockets, and pulled
 * weights are used where they land. */
void psw_use_region(struct trainer *tr)
{
    struct psw_exchange *x = tr->ex;
    uint32_t on = psc_shm_shards(tr->c);
    if (on == 0)
        return;
    if (psw_wire_dtype(tr->cfg.wire_dtype) != PSC_F32)
        PS_LOG(&tr->log, PS_LOG_INFO, W0022,
               "--wire-dtype %s: the %u shard(s) sharing memory with this worker take f32 through "
               "it; the other %u take %s on their sockets",
               tr->cfg.wire_dtype, on, psc_shards(tr->c) - on, tr->cfg.wire_dtype);
    int n = psw_ntables(tr);
    float *g[TABLES_MAX];
    for (int k = 0; k < n; k++) {
        size_t b = (size_t)psw_table_size(tr, k) * 4;
        if ((g[k] = psc_shm_alloc(tr->c, b)) == NULL ||
            (x->wset[0][k] = psc_shm_alloc(tr->c, b)) == NULL ||
            (x->wset[1][k] = psc_shm_alloc(tr->c, b)) == NULL)
            return;
    }
    psw_place_grads(tr, g);
    psw_point_params(tr, x->wset[0]);
    if (on == psc_shards(tr->c)) /* nothing of a step on a socket */
        psw_mlp_set_chunk_bytes(&tr->mlp, PSW_CHUNK_BYTES_SHM);
    x->wsets = 1;
    PS_LOG(&tr->log, PS_LOG_INFO, W0008,
           "%u of %u shards share memory with this worker: gradients and weights move without "
           "sockets there",
           on, psc_shards(tr->c));
}
