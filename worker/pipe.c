/* Pipelines (pipe.h): the plan of the stages, the link between them, the
 * schedules, a step of micro-batches, evaluation through the stages. */
#include "pipe.h"

#include "exchange.h"
#include "model.h"
#include "report.h"

#include "ps_clock.h"
#include "ps_curve.h"
#include "ps_err.h"
#include "ps_limits.h"
#include "ps_notify.h"
#include "ps_opts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A wait for a neighbour looks up this often: the servers hear a
 * heartbeat, the service watchdog is petted, /metrics stays fresh. */
#define WAIT_SLICE_MS 500

/* The plan a stage sends the next one before the first step (an eval
 * tensor of this micro-batch number): what both must agree on. */
#define PLAN_MICRO  UINT32_MAX
#define PLAN_VALUES 4

struct psw_pipe {
    struct psc_link *link;
    uint32_t s, p, m; /* stage, stages, micro-batches */
    uint32_t slots;   /* activation slots of training micro-batches (slot 0: evaluation's) */
    int rows;         /* rows of a micro-batch */
    int in_w, out_w;  /* widths of what comes in from stage s - 1 and goes out to s + 1 */
    int gpipe;
    float *h_out; /* a device backend: a tensor downloaded to be sent */
    size_t h_out_floats;
};

/* ---- the plan ------------------------------------------------------------ */

/* Multiply-adds per sample of a step of head layers [a, b), with the
 * convolutions' when the stage starts at the first: each layer's
 * forward, its weight gradient, and its input gradient (all but the
 * model's first layer: a stage after the first computes it for the
 * stage before). */
static double stage_cost(const struct trainer *tr, const int *dims, int a, int b)
{
    int cnn = strcmp(tr->cfg.model, "cnn") == 0;
    double c = 0;
    for (int l = a; l < b; l++)
        c += (l > 0 || cnn ? 3.0 : 2.0) * dims[l] * dims[l + 1];
    if (a == 0 && cnn)
        for (int l = 0; l < tr->cnn.n; l++) {
            const struct psw_conv_layer *L = &tr->cnn.L[l];
            c += (l > 0 ? 3.0 : 2.0) * L->g.c_out * L->g.c_in * L->g.k * L->g.k * L->ho * L->wo;
        }
    return c;
}

/* cuts[1..p-1] where the largest stage's cost is least (cuts[0] = 0,
 * cuts[p] = nl): a partition of nl layers into p runs of at least one. */
static void balance(const struct trainer *tr, const int *dims, int nl, int p, int *cuts)
{
    double best[PSW_LAYERS_MAX + 1][PSW_LAYERS_MAX + 1];
    int from[PSW_LAYERS_MAX + 1][PSW_LAYERS_MAX + 1];
    for (int i = 0; i <= nl; i++)
        for (int k = 0; k <= p; k++)
            best[i][k] = INFINITY;
    best[0][0] = 0;
    for (int k = 1; k <= p; k++)
        for (int i = k; i <= nl; i++)
            for (int j = k - 1; j < i; j++) {
                double c = fmax(best[j][k - 1], stage_cost(tr, dims, j, i));
                if (c < best[i][k]) {
                    best[i][k] = c;
                    from[i][k] = j;
                }
            }
    cuts[p] = nl;
    for (int k = p; k > 0; k--)
        cuts[k - 1] = from[cuts[k]][k];
}

int psw_pipe_plan(struct trainer *tr, const int *dims, int nl, int *first, int *end, char *err,
                  size_t errlen)
{
    const struct config *c = &tr->cfg;
    int p = (int)c->stages, s = (int)psw_stage(c), cuts[PSW_LAYERS_MAX + 1];
    if (p > nl)
        return ps_errf(PS_EINVAL, err, errlen,
                       "--stages %d: the model's fc layers (fc1..fc%d) are what is split, one "
                       "stage at least one of them: at most %d stages",
                       p, nl, nl);
    if (c->cuts == NULL) {
        balance(tr, dims, nl, p, cuts);
    } else {
        const char *q = c->cuts;
        int n = 0;
        cuts[0] = 0;
        while (*q != '\0') {
            char tok[16];
            size_t len = strcspn(q, ",");
            uint64_t v = 0;
            if (len == 0 || len >= sizeof tok)
                return ps_errf(PS_EINVAL, err, errlen, "--cuts '%s': comma-separated layer numbers",
                               c->cuts);
            memcpy(tok, q, len);
            tok[len] = '\0';
            if (ps_parse_u64(tok, 1, (uint64_t)nl - 1, &v) != 0)
                return ps_errf(PS_EINVAL, err, errlen,
                               "--cuts: '%s' is not a cut between 1 and %d (a cut N ends a stage "
                               "after fcN; this model has fc1..fc%d)",
                               tok, nl - 1, nl);
            if (++n >= p)
                return ps_errf(PS_EINVAL, err, errlen,
                               "--cuts '%s': more than the %d cut(s) --stages %d takes", c->cuts,
                               p - 1, p);
            if ((int)v <= cuts[n - 1])
                return ps_errf(PS_EINVAL, err, errlen,
                               "--cuts '%s': the cuts must increase, each stage one fc layer at "
                               "least",
                               c->cuts);
            cuts[n] = (int)v;
            q += len + (q[len] == ',');
        }
        if (n != p - 1)
            return ps_errf(PS_EINVAL, err, errlen, "--cuts '%s': %d cut(s); --stages %d takes %d",
                           c->cuts, n, p, p - 1);
        cuts[p] = nl;
    }
    *first = cuts[s];
    *end = cuts[s + 1];
    double total = stage_cost(tr, dims, 0, nl), mine = stage_cost(tr, dims, *first, *end);
    double most = 0;
    for (int k = 0; k < p; k++)
        most = fmax(most, stage_cost(tr, dims, cuts[k], cuts[k + 1]));
    PS_LOG(&tr->log, PS_LOG_INFO, W0020,
           "stage %d of %d (pipeline %llu of %llu): %sfc%d..fc%d, %.1f%% of the model's "
           "multiply-adds (the largest stage has %.1f%%)%s",
           s, p, (unsigned long long)psw_pipeline(c), (unsigned long long)psw_pipelines(c),
           s == 0 && tr->cnn.n > 0 ? "the convolutions and " : "", *first + 1, *end,
           100.0 * mine / total, 100.0 * most / total,
           c->cuts == NULL ? "; cut where the stages balance best (--cuts sets the cuts)" : "");
    return 0;
}

/* ---- the schedules ------------------------------------------------------- */

void psw_pipe_order(int gpipe, uint32_t s, uint32_t p, uint32_t m, int *o)
{
    int n = 0;
    if (gpipe) { /* every forward, then every backward */
        for (uint32_t j = 0; j < m; j++)
            o[n++] = (int)j + 1;
        for (uint32_t j = 0; j < m; j++)
            o[n++] = -(int)j - 1;
        return;
    }
    /* 1F1B: the forwards that fill the pipeline below this stage, then
     * one forward and one backward in turn, then the backwards left */
    uint32_t warm = p - s - 1 < m ? p - s - 1 : m, f = 0, b = 0;
    for (; f < warm; f++)
        o[n++] = (int)f + 1;
    while (b < m) {
        if (f < m)
            o[n++] = (int)++f;
        o[n++] = -(int)++b;
    }
}

/* ---- tensors to and from the neighbours --------------------------------- */

static int link_failed(struct trainer *tr, int rc)
{
    struct psw_pipe *pp = tr->pipe;
    PS_LOG(&tr->log, PS_LOG_ERROR, W0320, "stage %u of %u: %s", pp->s, pp->p,
           psc_link_error(pp->link));
    return rc;
}

/* The next tensor of direction dir, waiting up to --timeout-ms for it
 * while the neighbour is there (psc_link names one that is gone). */
static int recv_tensor(struct trainer *tr, int dir, struct psc_tensor *t)
{
    struct psw_pipe *pp = tr->pipe;
    double t0 = ps_mono_s(), until = t0 + (double)tr->cfg.timeout_ms / 1e3;
    int rc;
    while ((rc = psc_link_recv(pp->link, dir, WAIT_SLICE_MS, t)) == PS_ETIMEDOUT &&
           ps_mono_s() < until) {
        if (tr->c != NULL)
            psc_heartbeat(tr->c);
        ps_notify_watchdog();
        psw_worker_metrics(tr, 0);
    }
    tr->stage.idle_s += ps_mono_s() - t0;
    if (rc == PS_ETIMEDOUT) {
        /* the link's error then names who never connected, and why */
        int never = psc_link_wait_connected(pp->link, 0) != 0;
        PS_LOG(&tr->log, PS_LOG_ERROR, W0320,
               "stage %u of %u: stage %u sent nothing for %llu ms (--timeout-ms)%s%s", pp->s, pp->p,
               dir == PSC_LINK_FORWARD ? pp->s - 1 : pp->s + 1,
               (unsigned long long)tr->cfg.timeout_ms,
               never ? ": is it running, at its --stage-endpoints entry? "
                     : ", though it is connected: is it stuck?",
               never ? psc_link_error(pp->link) : "");
        return rc;
    }
    return rc != 0 ? link_failed(tr, rc) : 0;
}

/* Whether t is what this stage expects: its step, micro-batch, kind and
 * shape. A neighbour that sends something else was started with other
 * flags, or is broken: an error that says which. */
static int expect(struct trainer *tr, const struct psc_tensor *t, int dir, int eval, uint32_t micro,
                  int rows, int width)
{
    struct psw_pipe *pp = tr->pipe;
    int ok = t->eval == eval && t->step == tr->clock && t->micro == micro && t->ndims == 2 &&
             t->dtype == PSC_F32 && t->shape[0] == (uint64_t)rows && t->shape[1] == (uint64_t)width;
    if (ok)
        return 0;
    const char *what = dir == PSC_LINK_FORWARD ? "activations" : "gradient";
    char shape[64] = "";
    for (uint32_t i = 0, used = 0; i < t->ndims && i < PSC_SHAPE_DIMS_MAX; i++)
        used += (uint32_t)snprintf(shape + used, sizeof shape - used, "%s%llu", i ? ", " : "",
                                   (unsigned long long)t->shape[i]);
    PS_LOG(&tr->log, PS_LOG_ERROR, W0320,
           "stage %u of %u: stage %u sent %s%s of step %llu, micro-batch %u, shaped [%s]; this "
           "stage expected %s%s of step %llu, micro-batch %u, shaped [%d, %d] (are the stages "
           "started with the same --layers or --arch, --cuts, --batch, --microbatches and "
           "--schedule?)",
           pp->s, pp->p, dir == PSC_LINK_FORWARD ? pp->s - 1 : pp->s + 1,
           t->eval ? "evaluation " : "", what, (unsigned long long)t->step, t->micro, shape,
           eval ? "evaluation " : "", what, (unsigned long long)tr->clock, micro, rows, width);
    return PS_EPROTO;
}

/* Sends rows x width values (on the device when dev is set). */
static int send_tensor(struct trainer *tr, int dir, const float *src, int dev, int rows, int width,
                       uint32_t micro, int eval)
{
    struct psw_pipe *pp = tr->pipe;
    size_t n = (size_t)rows * width;
    if (dev && !tr->alias) {
        if (n > pp->h_out_floats || psk_download(tr->be, pp->h_out, src, n * sizeof(float)))
            return PS_EDEVICE;
        src = pp->h_out;
    }
    struct psc_tensor t = {.struct_size = sizeof t,
                           .step = tr->clock,
                           .micro = micro,
                           .dtype = PSC_F32,
                           .ndims = 2,
                           .data = src,
                           .eval = eval};
    t.shape[0] = (uint64_t)rows;
    t.shape[1] = (uint64_t)width;
    int rc = psc_link_send(pp->link, dir, &t);
    return rc != 0 ? link_failed(tr, rc) : 0;
}

/* ---- setting up ---------------------------------------------------------- */

/* Before the first step: stage s tells s + 1 what it runs, and s + 1
 * compares it with its own. */
static int agree(struct trainer *tr)
{
    struct psw_pipe *pp = tr->pipe;
    float mine[PLAN_VALUES] = {(float)pp->m, (float)pp->rows, (float)pp->gpipe, 0};
    if (pp->s > 0) {
        struct psc_tensor t = {.struct_size = sizeof t};
        int rc = recv_tensor(tr, PSC_LINK_FORWARD, &t);
        if (rc == 0)
            rc = expect(tr, &t, PSC_LINK_FORWARD, 1, PLAN_MICRO, 1, PLAN_VALUES);
        if (rc != 0)
            return rc;
        float theirs[PLAN_VALUES];
        memcpy(theirs, t.data, sizeof theirs);
        if (theirs[0] != mine[0] || theirs[1] != mine[1] || theirs[2] != mine[2] ||
            (int)theirs[3] != pp->in_w) {
            PS_LOG(&tr->log, PS_LOG_ERROR, W0320,
                   "stage %u of %u: stage %u runs %.0f micro-batches of %.0f rows with %s and "
                   "sends %.0f activations a row; this stage runs %u of %d with %s and takes %d "
                   "(start every stage with the same --batch, --microbatches, --schedule, "
                   "--layers or --arch, and --cuts)",
                   pp->s, pp->p, pp->s - 1, theirs[0], theirs[1], theirs[2] ? "gpipe" : "1f1b",
                   theirs[3], pp->m, pp->rows, pp->gpipe ? "gpipe" : "1f1b", pp->in_w);
            return PS_EINVAL;
        }
    }
    if (pp->s + 1 == pp->p)
        return 0;
    int rc;
    double until = ps_mono_s() + (double)tr->cfg.timeout_ms / 1e3;
    while ((rc = psc_link_wait_connected(pp->link, WAIT_SLICE_MS)) == PS_ETIMEDOUT &&
           ps_mono_s() < until) {
        if (tr->c != NULL)
            psc_heartbeat(tr->c);
        ps_notify_watchdog();
    }
    if (rc != 0)
        return link_failed(tr, rc);
    mine[3] = (float)pp->out_w;
    return send_tensor(tr, PSC_LINK_FORWARD, mine, 0, 1, PLAN_VALUES, PLAN_MICRO, 1);
}

/* Where this stage listens: --stage-listen, or any address at the port of
 * its own entry in --stage-endpoints. */
static int listen_at(const struct config *c, const char *own, char *buf, size_t len, char *err,
                     size_t errlen)
{
    if (c->stage_listen != NULL) {
        snprintf(buf, len, "%s", c->stage_listen);
        return 0;
    }
    const char *port = strrchr(own, ':');
    if (port == NULL || port[1] == '\0')
        return ps_errf(PS_EINVAL, err, errlen, "--stage-endpoints: '%s' has no port", own);
    snprintf(buf, len, "tcp://*:%s", port + 1);
    return 0;
}

int psw_pipe_start(struct trainer *tr, char *err, size_t errlen)
{
    const struct config *c = &tr->cfg;
    struct psw_pipe *pp = calloc(1, sizeof *pp);
    if (pp == NULL)
        return ps_errf(PS_ENOMEM, err, errlen, "out of memory for the pipeline");
    tr->pipe = pp;
    pp->s = (uint32_t)psw_stage(c);
    pp->p = (uint32_t)c->stages;
    pp->m = (uint32_t)c->microbatches;
    pp->rows = (int)(c->batch / c->microbatches);
    pp->gpipe = strcmp(c->schedule, "gpipe") == 0;
    pp->slots = pp->gpipe || pp->p - pp->s > pp->m ? pp->m : pp->p - pp->s;
    pp->in_w = tr->mlp.dims[0];
    pp->out_w = tr->mlp.dims[tr->mlp.nlayers];
    /* slot 0 is the model's own (evaluation's), the others one micro-batch each */
    int rc = psw_mlp_set_slots(&tr->mlp, (int)pp->slots + 1, pp->rows);
    if (rc == 0 && tr->k0 > 0) {
        float *feats[PSW_SLOTS_MAX];
        for (uint32_t i = 0; i <= pp->slots; i++)
            feats[i] = tr->mlp.slots[i][0];
        rc = psw_cnn_set_slots(&tr->cnn, (int)pp->slots + 1, pp->rows, feats);
    }
    if (rc != 0)
        return ps_errf(rc, err, errlen, "cannot allocate %u micro-batches' activations", pp->slots);
    /* each micro-batch's loss is its mean over its rows, scaled by 1/M:
     * the step's gradient is the whole batch's mean's */
    tr->mlp.loss_scale = 1.0f / (float)pp->m;
    int widest = pp->in_w > pp->out_w ? pp->in_w : pp->out_w;
    int most_rows = pp->rows > EVAL_BATCH ? pp->rows : EVAL_BATCH;
    pp->h_out_floats = (size_t)most_rows * widest;
    if (!tr->alias && psk_host_alloc(tr->be, pp->h_out_floats * sizeof(float), (void **)&pp->h_out))
        return ps_errf(PS_ENOMEM, err, errlen, "out of memory for the tensors between stages");
    /* the neighbours' endpoints: entry r is rank r's */
    static char buf[65536];
    const char *eps[PS_SHARDS_MAX];
    size_t n = 0;
    if (c->stage_endpoints == NULL)
        return ps_errf(PS_EINVAL, err, errlen,
                       "--stages needs --stage-endpoints: where each rank's stage listens");
    if ((rc = ps_split_servers(c->stage_endpoints, buf, sizeof buf, eps, &n, err, errlen)) != 0)
        return rc;
    if (n != c->workers)
        return ps_errf(PS_EINVAL, err, errlen,
                       "--stage-endpoints lists %zu endpoint(s); --workers %llu takes one per "
                       "rank",
                       n, (unsigned long long)c->workers);
    char listen[PS_ENDPOINT_MAX + 16];
    if ((rc = listen_at(c, eps[c->rank], listen, sizeof listen, err, errlen)) != 0)
        return rc;
    /* with --curve-secret, the stages encrypt with the workers' key pair
     * and admit only its public key: every stage holds the same pair, as
     * deploy/ gives every worker */
    struct ps_curve_keys mine, server;
    if ((rc = ps_curve_client(c->curve_secret, c->curve_server_key, &mine, &server, err, errlen)) !=
        0)
        return rc;
    const char *allow[1] = {mine.pub};
    int curve = mine.pub[0] != '\0';
    struct psc_link_config lc = {
        .struct_size = sizeof lc,
        .curve_public = curve ? mine.pub : NULL,
        .curve_secret = curve ? mine.sec : NULL,
        .curve_server_key = curve && pp->s + 1 < pp->p ? mine.pub : NULL,
        .curve_allow = curve && pp->s > 0 ? allow : NULL,
        .ncurve_allow = curve && pp->s > 0 ? 1 : 0,
        .stage = pp->s,
        .stages = pp->p,
        .listen = pp->s > 0 ? listen : NULL,
        .next = pp->s + 1 < pp->p ? eps[c->rank + 1] : NULL,
        .window = pp->slots,
        .bytes_max = (uint64_t)pp->h_out_floats * sizeof(float),
        .timeout_ms = (int)c->stage_timeout_ms,
    };
    if ((rc = psc_link_create(&lc, &pp->link, err, errlen)) != 0)
        return rc;
    char prev[PS_ENDPOINT_MAX + 64] = "", next[PS_ENDPOINT_MAX + 64] = "";
    if (pp->s > 0)
        snprintf(prev, sizeof prev, " listens at %s for stage %u", listen, pp->s - 1);
    if (lc.next != NULL)
        snprintf(next, sizeof next, "%s connects to stage %u at %s", pp->s > 0 ? "," : "",
                 pp->s + 1, lc.next);
    PS_LOG(&tr->log, PS_LOG_INFO, W0021,
           "stage %u of %u%s%s; %s, %u micro-batches of %d rows, at most %u held%s", pp->s, pp->p,
           prev, next, pp->gpipe ? "gpipe" : "1f1b", pp->m, pp->rows, pp->slots,
           curve ? "; CURVE with the workers' key pair" : "");
    rc = agree(tr);
    tr->stage.idle_s = 0; /* waiting for the neighbours to start is not the bubble */
    return rc != 0 ? ps_errf(PS_EINVAL, err, errlen, "the stages do not agree (above)") : 0;
}

void psw_pipe_stop(struct trainer *tr)
{
    struct psw_pipe *pp = tr->pipe;
    if (pp == NULL)
        return;
    psc_link_destroy(pp->link);
    if (pp->h_out != NULL)
        psk_host_free(tr->be, pp->h_out);
    free(pp);
    tr->pipe = NULL;
}

/* ---- a step -------------------------------------------------------------- */

static void use_slot(struct trainer *tr, int i)
{
    psw_mlp_use_slot(&tr->mlp, i);
    if (tr->k0 > 0)
        psw_cnn_use_slot(&tr->cnn, i);
}

/* Rows of micro-batch j of this pipeline's batch at step `step` of the
 * epoch: pipeline r of R takes the rows worker r of R workers would
 * without stages, and micro-batch j the j-th run of them. */
static const uint32_t *micro_rows(const struct trainer *tr, uint64_t step, uint32_t j)
{
    const struct config *c = &tr->cfg;
    uint64_t slot = step * psw_pipelines(c) + psw_pipeline(c);
    return tr->perm + slot * c->batch + (uint64_t)j * (uint64_t)tr->pipe->rows;
}

static int forward(struct trainer *tr, uint64_t step, uint32_t j)
{
    struct psw_pipe *pp = tr->pipe;
    use_slot(tr, 1 + (int)(j % pp->slots));
    int rc = 0;
    if (pp->s == 0) {
        rc = psw_load_batch(tr, &tr->train, micro_rows(tr, step, j), pp->rows);
    } else {
        struct psc_tensor t = {.struct_size = sizeof t};
        rc = recv_tensor(tr, PSC_LINK_FORWARD, &t);
        if (rc == 0)
            rc = expect(tr, &t, PSC_LINK_FORWARD, 0, j, pp->rows, pp->in_w);
        if (rc == 0 &&
            psk_upload(tr->be, psw_input(tr), t.data, (size_t)pp->rows * pp->in_w * sizeof(float)))
            rc = PS_EDEVICE;
    }
    double t0 = ps_mono_s();
    if (rc == 0)
        rc = psw_model_forward(tr, pp->rows);
    tr->stage.forward_s += ps_mono_s() - t0;
    if (rc == 0 && pp->s + 1 < pp->p)
        rc = send_tensor(tr, PSC_LINK_FORWARD, tr->mlp.act[tr->mlp.nlayers], 1, pp->rows, pp->out_w,
                         j, 0);
    if (rc == 0 && ++tr->stage.held > tr->stage.held_max)
        tr->stage.held_max = tr->stage.held;
    return rc;
}

/* The micro-batches' weight gradients are summed where backward writes
 * them, in micro-batch order: the first overwrites, the others add (a
 * product's beta 1), and the last one's sum goes out as it is made. */
static int accumulate(struct trainer *tr, int on)
{
    psw_mlp_set_accumulate(&tr->mlp, on);
    return tr->k0 > 0 ? psw_cnn_set_accumulate(&tr->cnn, on) : 0;
}

static int backward(struct trainer *tr, uint64_t step, uint32_t j, double *loss, int *correct)
{
    struct psw_pipe *pp = tr->pipe;
    use_slot(tr, 1 + (int)(j % pp->slots));
    int rc = 0;
    double t0 = ps_mono_s();
    if (pp->s + 1 == pp->p) {
        double l = 0;
        int ok = 0;
        psw_data_labels(&tr->train, micro_rows(tr, step, j), pp->rows, tr->h_lab);
        if (psw_mlp_loss(&tr->mlp, pp->rows, tr->h_lab, &l, &ok))
            return PS_EDEVICE;
        if (!isfinite(l)) {
            PS_LOG(&tr->log, PS_LOG_ERROR, W0305,
                   "the loss became %g at step %llu of the epoch: stopping before its gradients "
                   "are pushed (a learning rate too high for this model?)",
                   l, (unsigned long long)step);
            return PS_EINVAL;
        }
        *loss += l;
        *correct += ok;
    } else {
        struct psc_tensor t = {.struct_size = sizeof t};
        rc = recv_tensor(tr, PSC_LINK_BACKWARD, &t);
        t0 = ps_mono_s();
        if (rc == 0)
            rc = expect(tr, &t, PSC_LINK_BACKWARD, 0, j, pp->rows, pp->out_w);
        if (rc == 0)
            rc = psw_mlp_set_output_grad(&tr->mlp, pp->rows, t.data);
        if (rc != 0)
            return rc;
    }
    rc = accumulate(tr, j > 0);
    if (rc == 0 && j + 1 == pp->m) { /* the step's gradients go out as they are made */
        psw_cork(tr, 1);
        rc = psw_backward_sending(tr, pp->rows);
        psw_cork(tr, 0);
    } else if (rc == 0) {
        rc = psw_model_backward(tr, pp->rows);
    }
    tr->stage.backward_s += ps_mono_s() - t0;
    if (rc == 0 && pp->s > 0)
        rc = send_tensor(tr, PSC_LINK_BACKWARD, tr->mlp.dx, 1, pp->rows, pp->in_w, j, 0);
    tr->stage.held--;
    return rc;
}

static int step(struct trainer *tr, uint64_t step_in_epoch, double *loss, int *correct)
{
    struct psw_pipe *pp = tr->pipe;
    int rc = psw_sync_weights(tr);
    if (rc != 0)
        return rc;
    if (psc_outside_round(tr->c)) {
        PS_LOG(&tr->log, PS_LOG_ERROR, W0304,
               "the servers took stage %u out of their rounds at clock %llu (it was silent or "
               "late); a pipeline's stages cannot rejoin a run yet: restart the run, which goes "
               "on from psd's weights",
               pp->s, (unsigned long long)tr->clock);
        return PS_ESTATE;
    }
    int order[2 * PSW_SLOTS_MAX];
    psw_pipe_order(pp->gpipe, pp->s, pp->p, pp->m, order);
    *loss = 0;
    *correct = 0;
    for (uint32_t i = 0; i < 2 * pp->m && rc == 0; i++)
        rc = order[i] > 0 ? forward(tr, step_in_epoch, (uint32_t)order[i] - 1)
                          : backward(tr, step_in_epoch, (uint32_t)-order[i] - 1, loss, correct);
    if (rc != 0)
        return rc;
    tr->fresh = 0;
    psw_next_weights(tr);
    tr->clock++;
    tr->done++;
    uint64_t sent, received;
    psc_link_bytes(pp->link, &sent, &received);
    tr->stage.link_sent = sent;
    tr->stage.link_received = received;
    ps_notify_watchdog();
    if (tr->cfg.test_delay_ms) {
        struct timespec ts = {(time_t)(tr->cfg.test_delay_ms / 1000),
                              (long)(tr->cfg.test_delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* ---- evaluation ---------------------------------------------------------- */

/* The test set forward through the stages (slot 0, EVAL_BATCH rows at a
 * time); the last stage counts what it got right and sends the count
 * back, so every stage learns the accuracy. -1 on an error. */
static double evaluate(struct trainer *tr)
{
    struct psw_pipe *pp = tr->pipe;
    if (psw_sync_weights(tr) != 0)
        return -1;
    use_slot(tr, 0);
    double idle = tr->stage.idle_s; /* the bubble is training's: not counted here */
    uint32_t idx[EVAL_BATCH], chunk = 0;
    float res[2] = {0, (float)tr->test.n};
    int last = pp->s + 1 == pp->p, rc = 0;
    for (uint32_t i = 0; i < tr->test.n && rc == 0; i += EVAL_BATCH, chunk++) {
        int rows = (int)(tr->test.n - i < EVAL_BATCH ? tr->test.n - i : EVAL_BATCH);
        for (int r = 0; r < rows; r++)
            idx[r] = i + (uint32_t)r;
        if (pp->s == 0) {
            rc = psw_load_batch(tr, &tr->test, idx, rows);
        } else {
            struct psc_tensor t = {.struct_size = sizeof t};
            rc = recv_tensor(tr, PSC_LINK_FORWARD, &t);
            if (rc == 0)
                rc = expect(tr, &t, PSC_LINK_FORWARD, 1, chunk, rows, pp->in_w);
            if (rc == 0 &&
                psk_upload(tr->be, psw_input(tr), t.data, (size_t)rows * pp->in_w * sizeof(float)))
                rc = PS_EDEVICE;
        }
        if (tr->c != NULL)
            psc_heartbeat(tr->c); /* evaluation can outlast a heartbeat interval */
        ps_notify_watchdog();
        if (rc == 0)
            rc = psw_model_forward(tr, rows);
        if (rc == 0 && !last)
            rc = send_tensor(tr, PSC_LINK_FORWARD, tr->mlp.act[tr->mlp.nlayers], 1, rows, pp->out_w,
                             chunk, 1);
        if (rc == 0 && last) {
            double loss;
            int ok;
            psw_data_labels(&tr->test, idx, rows, tr->h_lab);
            if (psw_mlp_loss(&tr->mlp, rows, tr->h_lab, &loss, &ok))
                rc = PS_EDEVICE;
            res[0] += (float)ok; /* exact: counts below 2^24 */
        }
    }
    if (rc == 0 && !last) {
        struct psc_tensor t = {.struct_size = sizeof t};
        rc = recv_tensor(tr, PSC_LINK_BACKWARD, &t);
        if (rc == 0)
            rc = expect(tr, &t, PSC_LINK_BACKWARD, 1, chunk, 1, 2);
        if (rc == 0)
            memcpy(res, t.data, sizeof res);
    }
    if (rc == 0 && pp->s > 0)
        rc = send_tensor(tr, PSC_LINK_BACKWARD, res, 0, 1, 2, chunk, 1);
    tr->stage.idle_s = idle;
    return rc == 0 && res[1] > 0 ? res[0] / res[1] : -1;
}

/* ---- the run ------------------------------------------------------------- */

static void progress(struct trainer *tr, uint64_t epoch, uint64_t epochs, uint64_t step,
                     uint64_t steps, double loss, double samples, double el)
{
    struct psw_pipe *pp = tr->pipe;
    const struct psw_stage_stats *st = &tr->stage;
    double busy = tr->train_seconds + el;
    char l[48] = "";
    if (pp->s + 1 == pp->p)
        snprintf(l, sizeof l, " loss %.4f", loss);
    PS_LOG(&tr->log, PS_LOG_INFO, W0250,
           "stage %u/%u epoch %llu/%llu step %llu/%llu%s %.0f samples/s; forward %.0f%%, "
           "backward %.0f%%, waiting for neighbours %.0f%% of the time; %llu micro-batches held "
           "at most",
           pp->s, pp->p, (unsigned long long)epoch + 1, (unsigned long long)epochs,
           (unsigned long long)step, (unsigned long long)steps, l, el > 0 ? samples / el : 0,
           busy > 0 ? 100 * st->forward_s / busy : 0, busy > 0 ? 100 * st->backward_s / busy : 0,
           busy > 0 ? 100 * st->idle_s / busy : 0, (unsigned long long)st->held_max);
}

int psw_pipe_train(struct trainer *tr, double *accuracy)
{
    const struct config *c = &tr->cfg;
    uint64_t steps = tr->train.n / (c->batch * psw_pipelines(c)), total = steps * c->epochs;
    if (c->max_steps && c->max_steps < total)
        total = c->max_steps;
    if (c->test_stop_at && c->test_stop_at < total)
        total = c->test_stop_at;
    uint64_t epochs = (total + steps - 1) / steps;
    *accuracy = -1;
    int rc = 0;
    while (rc == 0 && tr->clock < total) {
        uint64_t e = tr->clock / steps, first = tr->clock % steps;
        uint64_t end = total - e * steps < steps ? total - e * steps : steps;
        psw_data_permute(tr->perm, tr->train.n, c->seed, e);
        double t0 = ps_mono_s(), loss_sum = 0;
        uint64_t seen = 0;
        while (rc == 0 && tr->clock / steps == e && tr->clock < total) {
            uint64_t s = tr->clock % steps;
            double loss = 0;
            int ok = 0;
            if ((rc = step(tr, s, &loss, &ok)) != 0)
                break;
            loss_sum += loss;
            seen += c->batch;
            if ((s + 1) % c->log_every == 0 || s + 1 == end)
                progress(tr, e, epochs, s + 1, end, loss_sum / (double)seen,
                         (double)(s + 1 - first) * (double)c->batch, ps_mono_s() - t0);
            psw_report_loss(tr, loss / (double)c->batch);
            psw_worker_metrics(tr, 0);
        }
        tr->train_seconds += ps_mono_s() - t0;
        if (rc != 0)
            break;
        if (psw_pipeline(c) == 0) {
            *accuracy = evaluate(tr);
            if (*accuracy < 0)
                return PS_EIO;
            PS_LOG(&tr->log, PS_LOG_INFO, W0210, "epoch %llu: test accuracy %.4f",
                   (unsigned long long)e + 1, *accuracy);
            psw_report_accuracy(tr, *accuracy);
            psw_worker_metrics(tr, 1);
        }
    }
    if (rc == 0 && psw_pipeline(c) != 0 && (*accuracy = evaluate(tr)) < 0)
        rc = PS_EIO; /* the final weights, so every summary has it */
    psw_report_accuracy(tr, *accuracy);
    psw_worker_metrics(tr, 1);
    return rc;
}
