/* What a run reports beside its progress lines (report.h). */
#include "report.h"

#include "ps_clock.h"
#include "ps_metrics.h"

#include <stdio.h>
#include <stdlib.h>

/* Publishes at most this often (seconds) unless forced: the loop calls
 * it from waits too, so /healthz stays ok while a step waits. */
#define PSW_METRICS_EVERY_S 0.25

struct psw_report {
    struct ps_metrics *metrics; /* NULL: no --metrics-listen */
    struct ps_buf text;
    double at, sps;     /* the last publish, and the rate since the one before */
    double loss;        /* the last step's mean loss */
    double accuracy;    /* the last evaluation's (-1: none yet) */
    uint64_t done;      /* steps at the last publish */
    uint64_t failovers; /* moves between replicas logged (W0240) */
};

struct psw_report *psw_report_create(void)
{
    struct psw_report *r = calloc(1, sizeof *r);
    if (r != NULL) {
        r->accuracy = -1;
        r->at = ps_mono_s();
    }
    return r;
}

void psw_report_destroy(struct psw_report *r)
{
    if (r == NULL)
        return;
    ps_metrics_stop(r->metrics);
    ps_buf_free(&r->text);
    free(r);
}

int psw_report_listen(struct trainer *tr, const char *listen, char *err, size_t errlen)
{
    int rc = ps_metrics_start(&tr->rep->metrics, listen, err, errlen);
    if (rc == 0)
        PS_LOG(&tr->log, PS_LOG_INFO, W0013, "metrics on %s (port %d): GET /metrics, /healthz",
               listen, ps_metrics_port(tr->rep->metrics));
    return rc;
}

void psw_report_loss(struct trainer *tr, double loss)
{
    tr->rep->loss = loss;
}

void psw_report_accuracy(struct trainer *tr, double accuracy)
{
    tr->rep->accuracy = accuracy;
}

void psw_report_failovers(struct trainer *tr)
{
    uint64_t moves = tr->c != NULL ? psc_failovers(tr->c) : 0;
    if (moves == tr->rep->failovers)
        return;
    tr->rep->failovers = moves; /* the run goes on; say where */
    char at[512];
    size_t used = 0;
    for (uint32_t s = 0; s < psc_shards(tr->c) && used < sizeof at; s++)
        used += (size_t)snprintf(at + used, sizeof at - used, "%s%s", s ? ", " : "",
                                 psc_endpoint(tr->c, s));
    PS_LOG(&tr->log, PS_LOG_WARN, W0240,
           "a shard's primary changed: %llu move(s) between replicas so far; shards now at %s",
           (unsigned long long)moves, at);
}

void psw_worker_metrics(struct trainer *tr, int force)
{
    struct psw_report *r = tr->rep;
    double now = ps_mono_s();
    if (r == NULL || r->metrics == NULL || (!force && now - r->at < PSW_METRICS_EVERY_S))
        return;
    double per_step = (double)(tr->cfg.batch * tr->cfg.accum_steps);
    if (now > r->at && tr->done >= r->done)
        r->sps = (double)(tr->done - r->done) * per_step / (now - r->at);
    r->at = now;
    r->done = tr->done;
    struct ps_buf *b = &r->text;
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
                   "Training samples per second since the previous publish.", r->sps);
    ps_prom_metric(b, "psworker_loss", "gauge", "Mean training loss of the last step.", r->loss);
    ps_prom_metric(b, "psworker_loss_scale", "gauge",
                   "The loss scale (--precision f16; 1 otherwise).", tr->scale);
    ps_prom_metric(b, "psworker_skipped_steps_total", "counter",
                   "Steps skipped because a worker's gradients overflowed (--precision f16).",
                   (double)tr->skipped);
    if (r->accuracy >= 0)
        ps_prom_metric(b, "psworker_test_accuracy_ratio", "gauge",
                       "Test accuracy at the last evaluation.", r->accuracy);
    uint64_t sent = 0, received = 0;
    if (tr->c != NULL) {
        psc_bytes(tr->c, &sent, &received);
        ps_prom_metric(b, "psworker_stale_pushes_total", "counter",
                       "Pushes the servers refused as outside the rounds.",
                       (double)psc_stale_pushes(tr->c));
        ps_prom_metric(b, "psworker_resent_requests_total", "counter",
                       "Requests sent again: unanswered after --retry-ms, or refused as not yet.",
                       (double)psc_resends(tr->c));
        ps_prom_metric(b, "psworker_failovers_total", "counter",
                       "Moves from one replica of a shard to another (a primary changed).",
                       (double)psc_failovers(tr->c));
    }
    const struct psw_stage_stats *st = &tr->stage;
    if (tr->cfg.stages > 1) {
        ps_prom_metric(b, "psworker_stage_forward_seconds_total", "counter",
                       "Seconds in this pipeline stage's forward passes.", st->forward_s);
        ps_prom_metric(b, "psworker_stage_backward_seconds_total", "counter",
                       "Seconds in this pipeline stage's backward passes.", st->backward_s);
        ps_prom_metric(b, "psworker_stage_idle_seconds_total", "counter",
                       "Seconds this stage waited for a neighbouring stage's tensor in training "
                       "(the bubble, and the stages' imbalance).",
                       st->idle_s);
        ps_prom_metric(b, "psworker_stage_activations_held", "gauge",
                       "Micro-batches between their forward and backward passes now.",
                       (double)st->held);
        ps_prom_metric(b, "psworker_stage_activations_held_max", "gauge",
                       "The most micro-batches held at once.", (double)st->held_max);
        ps_prom_metric(b, "psworker_stage_sent_bytes_total", "counter",
                       "Bytes of tensors sent to the neighbouring stages.", (double)st->link_sent);
        ps_prom_metric(b, "psworker_stage_received_bytes_total", "counter",
                       "Bytes of tensors received from the neighbouring stages.",
                       (double)st->link_received);
    }
    ps_prom_metric(b, "psworker_sent_bytes_total", "counter", "Bytes sent to the servers.",
                   (double)sent);
    ps_prom_metric(b, "psworker_received_bytes_total", "counter",
                   "Bytes received from the servers.", (double)received);
    ps_metrics_publish(r->metrics, b);
}
