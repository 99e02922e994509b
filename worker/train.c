/* The steps: a training step (with micro-batches and overlap), rejoining
 * after a drop, evaluation, progress, the epochs, and the sparse logistic
 * regression run. */
#include "train.h"

#include "connect.h"
#include "exchange.h"
#include "local.h"
#include "model.h"
#include "report.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_notify.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double evaluate(struct trainer *tr)
{
    if (psw_sync_weights(tr) != 0)
        return -1;
    uint32_t idx[EVAL_BATCH];
    int correct = 0;
    for (uint32_t i = 0; i < tr->test.n; i += EVAL_BATCH) {
        int rows = (int)(tr->test.n - i < EVAL_BATCH ? tr->test.n - i : EVAL_BATCH);
        for (int r = 0; r < rows; r++)
            idx[r] = i + (uint32_t)r;
        int up = psw_load_batch(tr, &tr->test, idx, rows);
        if (tr->c != NULL)
            psc_heartbeat(tr->c); /* evaluation can outlast a heartbeat interval */
        ps_notify_watchdog();
        double loss;
        int ok;
        if (up || psw_model_forward(tr, rows) ||
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
    if (psw_load_batch(tr, &tr->train, tr->perm + slot * (uint64_t)b, b))
        return PS_EDEVICE;
    int rc = overlap ? psw_forward_ready(tr, b) : psw_model_forward(tr, b);
    if (overlap) { /* whatever forward did not need: waited for all the same */
        int rest = psw_sync_weights(tr);
        rc = rc != 0 ? rc : rest;
    }
    if (rc != 0)
        return rc;
    if (psw_mlp_loss(&tr->mlp, b, tr->h_lab, loss, correct))
        return PS_EDEVICE;
    return 0;
}

#define STEP_REJOINED 1 /* train_step: the clock moved; no step was taken */
#define STEP_SKIPPED  2 /* train_step: gradients overflowed; the clock stays */

/* Below this the loss scale cannot rescue anything: every step overflowed
 * since the first scale, 2^40 and more times smaller. */
#define LOSS_SCALE_MIN (1.0 / (1u << 24))

/* --precision f16, after the step's backward passes (none sent yet):
 * GradScaler's rules. Counts the non-finite gradients, learns through
 * the vote whether any worker had one, and then either skips the step on
 * every worker (the scale halves; the same batch is taken again at the
 * next attempt, so an epoch still sees each sample in a step taken) or
 * unscales the gradients in f32 and sends them (after --growth-interval
 * such steps in a row the scale doubles). */
static int scaled_step(struct trainer *tr)
{
    if (tr->cfg.test_overflow_at != 0 && tr->clock == tr->cfg.test_overflow_at &&
        !tr->overflow_injected) {
        float inf = INFINITY;
        tr->overflow_injected = 1;
        if (psk_upload(tr->be, psw_grad(tr, 0), &inf, sizeof inf))
            return PS_EDEVICE;
    }
    uint64_t bad = 0;
    for (int k = 0; k < tr->ntables; k++) {
        size_t n = (size_t)psw_table_size(tr, k);
        uint64_t c = 0, a = 0;
        if (psk_count_nonfinite(tr->be, n, psw_grad(tr, k), &c) ||
            (tr->acc[k] != NULL && psk_count_nonfinite(tr->be, n, tr->acc[k], &a)))
            return PS_EDEVICE;
        bad += c + a;
    }
    int any = bad > 0, rc = 0;
    if (!tr->cfg.standalone &&
        (rc = psc_vote(tr->c, &tr->vote, bad > 0, (int)tr->cfg.timeout_ms, &any)) != 0) {
        PS_LOG(&tr->log, PS_LOG_ERROR, W0308, "the overflow vote failed: %s",
               psc_last_error(tr->c));
        return rc;
    }
    if (any) {
        double was = tr->scale;
        tr->scale /= 2;
        tr->clean = 0;
        tr->skipped++;
        tr->fresh = 1; /* nothing was sent: the weights stay those of this clock */
        char where[64];
        if (bad > 0)
            snprintf(where, sizeof where, "here: %llu non-finite", (unsigned long long)bad);
        else
            snprintf(where, sizeof where, "on another worker");
        PS_LOG(&tr->log, PS_LOG_WARN, W0306,
               "step at clock %llu skipped: gradients overflowed at loss scale %g (%s); the "
               "scale is now %g",
               (unsigned long long)tr->clock, was, where, tr->scale);
        if (tr->scale < LOSS_SCALE_MIN) {
            PS_LOG(&tr->log, PS_LOG_ERROR, W0307,
                   "the loss scale fell below %g: the gradients are not finite at any scale "
                   "(the model diverged?)",
                   LOSS_SCALE_MIN);
            return PS_EINVAL;
        }
        tr->mlp.loss_scale = (float)tr->scale;
        return STEP_SKIPPED;
    }
    float inv = (float)(1.0 / tr->scale);
    for (int k = 0; k < tr->ntables; k++) {
        size_t n = (size_t)psw_table_size(tr, k);
        if (psk_scale(tr->be, n, inv, psw_grad(tr, k)) ||
            (tr->acc[k] != NULL && psk_scale(tr->be, n, inv, tr->acc[k])))
            return PS_EDEVICE;
    }
    if (++tr->clean == tr->cfg.growth_interval) {
        tr->scale *= 2;
        tr->clean = 0;
        tr->mlp.loss_scale = (float)tr->scale;
        PS_LOG(&tr->log, PS_LOG_INFO, W0230, "loss scale %g after %llu steps without an overflow",
               tr->scale, (unsigned long long)tr->cfg.growth_interval);
    }
    psw_cork(tr, 1);
    rc = psw_send_all_grads(tr);
    psw_cork(tr, 0);
    return rc;
}

/* The servers dropped this worker from their rounds (it was silent, or
 * late): say hello again and go on from the clock they name, with its
 * weights. */
static int rejoin(struct trainer *tr)
{
    uint64_t was = tr->clock;
    int rc = psc_rejoin(tr->c, (int)tr->cfg.timeout_ms);
    if (rc != 0) {
        PS_LOG(&tr->log, PS_LOG_ERROR, W0304, "rejoin: %s", psc_last_error(tr->c));
        return rc;
    }
    tr->clock = psc_start_clock(tr->c);
    PS_LOG(&tr->log, PS_LOG_WARN, W0012,
           "the servers took this worker out of their rounds at clock %llu (it was silent or "
           "late): rejoining at clock %llu",
           (unsigned long long)was, (unsigned long long)tr->clock);
    rc = psw_pull_all(tr, tr->clock);
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
    int rc = overlap ? 0 : psw_sync_weights(tr);
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
            PS_LOG(&tr->log, PS_LOG_ERROR, W0305,
                   "the loss became %g at step %llu of the epoch: stopping before its gradients "
                   "are pushed (a learning rate too high for this model?)",
                   l, (unsigned long long)step_in_epoch);
            return PS_EINVAL;
        }
        if (overlap && j == 0 && psc_outside_round(tr->c))
            return rejoin(tr); /* every pull was waited for: none in flight */
        *loss += l;
        *correct += ok;
        if (j + 1 == n_acc && tr->prec == PSK_PREC_F16) { /* checked before anything goes */
            rc = psw_model_backward(tr, b);
            if (rc == 0)
                rc = scaled_step(tr);
            break;
        }
        if (j + 1 == n_acc) {
            psw_cork(tr, 1); /* the step's pushes go out as one message per shard */
            rc = psw_backward_sending(tr, b);
            psw_cork(tr, 0);
            break;
        }
        rc = psw_model_backward(tr, b);
        for (int k = 0; k < tr->ntables && rc == 0; k++) {
            size_t n = (size_t)psw_table_size(tr, k);
            const float *g = psw_grad(tr, k);
            rc = j == 0 ? psk_copy(tr->be, tr->acc[k], g, n * 4) /* starts the sum */
                        : psk_axpy(tr->be, n, 1.0f, g, tr->acc[k]);
        }
    }
    if (rc != 0)
        return rc;
    if (tr->cfg.topk > 0) /* the pushes and pulls of every table as one message per shard */
        psw_cork(tr, 1);
    for (int k = tr->ntables - 1; k >= 0 && tr->cfg.topk > 0 && rc == 0; k--)
        rc = psw_send_topk(tr, k);
    if (tr->cfg.topk > 0)
        psw_cork(tr, 0);
    if (rc != 0)
        return rc;
    for (int k = 0; k < tr->ntables && tr->cfg.standalone && tr->cfg.topk == 0; k++)
        psw_local_apply(tr, k);
    tr->fresh = 0;
    if (!tr->cfg.standalone)
        psw_next_weights(tr);
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
    psw_report_failovers(tr);
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
        PS_LOG(&tr->log, PS_LOG_INFO, W0200,
               "epoch %llu/%llu step %llu/%llu loss %.4f %.0f samples/s ETA %.0fs",
               (unsigned long long)epoch + 1, (unsigned long long)epochs, (unsigned long long)step,
               (unsigned long long)steps, loss, sps, eta);
    }
}

int psw_train(struct trainer *tr, double *accuracy)
{
    uint64_t gb = tr->cfg.batch * tr->cfg.workers * tr->cfg.accum_steps;
    uint64_t steps = tr->train.n / gb, total = steps * tr->cfg.epochs;
    if (tr->cfg.max_steps && tr->cfg.max_steps < total)
        total = tr->cfg.max_steps;
    if (tr->cfg.test_stop_at && tr->cfg.test_stop_at < total)
        total = tr->cfg.test_stop_at;
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
            if (rc == STEP_REJOINED || rc == STEP_SKIPPED) {
                rc = 0;
                continue;
            }
            if (rc != 0)
                break;
            loss_sum += loss;
            seen += tr->cfg.batch * tr->cfg.accum_steps;
            progress(tr, e, epochs, first, s + 1, end, loss_sum / seen, t0, 0);
            psw_report_loss(tr, loss / (double)(tr->cfg.batch * tr->cfg.accum_steps));
            psw_worker_metrics(tr, 0);
        }
        tr->train_seconds += ps_mono_s() - t0;
        if (rc != 0)
            break;
        progress(tr, e, epochs, first, tr->clock / steps == e ? tr->clock % steps : end, end,
                 seen ? loss_sum / seen : 0, t0, 1);
        if (tr->cfg.rank == 0) {
            *accuracy = evaluate(tr);
            PS_LOG(&tr->log, PS_LOG_INFO, W0210, "epoch %llu: test accuracy %.4f",
                   (unsigned long long)e + 1, *accuracy);
            psw_report_accuracy(tr, *accuracy);
            psw_worker_metrics(tr, 1);
        }
    }
    if (rc == 0 && (rc = psw_sync_weights(tr)) == 0 && tr->cfg.rank != 0)
        *accuracy = evaluate(tr); /* the final weights, so every summary has it */
    psw_report_accuracy(tr, *accuracy);
    psw_worker_metrics(tr, 1);
    return rc;
}

/* --model sparse-lr: its own loop (sparse_lr.c) over the same client. */
int psw_run_sparse_lr(struct trainer *tr)
{
    const struct config *c = &tr->cfg;
    char err[512] = "";
    double t0 = ps_mono_s();
    int rc = psw_connect_client(tr, 0, err, sizeof err);
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
        .admit_after = (uint32_t)c->admit_after,
        .evict_after = c->evict_after,
        .evict_at_budget = c->evict_at_budget,
        .evict_half_life = c->evict_half_life,
        .test_delay_ms = c->test_delay_ms,
        .timeout_ms = (int)c->timeout_ms,
        .embed_dim = (uint32_t)c->embed_dim,
        .hidden = (uint32_t)c->embed_hidden,
        .device = c->device,
    };
    struct psw_slr_result res = {0};
    if (rc == 0)
        rc = psw_slr_train(&sc, tr->c, &tr->log, &res, err, sizeof err);
    if (rc != 0) /* a request that failed logged why (W0310): the text is its own */
        PS_LOG(&tr->log, PS_LOG_ERROR, W0002, "%s",
               err[0] ? err : "training stopped: a request failed (above)");
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
