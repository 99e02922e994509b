/* What a run reports beside its log: this worker's metrics in Prometheus
 * text, published to --metrics-listen's HTTP thread. */
#include "report.h"

#include "ps_clock.h"

#include <stdio.h>

/* Publishes at most this often (seconds) unless forced: the loop calls
 * it from waits too, so /healthz stays ok while a step waits. */
#define PSW_METRICS_EVERY_S 0.25

void psw_worker_metrics(struct trainer *tr, int force)
{
    double now = ps_mono_s();
    if (tr->metrics == NULL || (!force && now - tr->m_at < PSW_METRICS_EVERY_S))
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
    ps_prom_metric(b, "psworker_loss_scale", "gauge",
                   "The loss scale (--precision f16; 1 otherwise).", tr->scale);
    ps_prom_metric(b, "psworker_skipped_steps_total", "counter",
                   "Steps skipped because a worker's gradients overflowed (--precision f16).",
                   (double)tr->skipped);
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
        ps_prom_metric(b, "psworker_failovers_total", "counter",
                       "Moves from one replica of a shard to another (a primary changed).",
                       (double)psc_failovers(tr->c));
    }
    ps_prom_metric(b, "psworker_sent_bytes_total", "counter", "Bytes sent to the servers.",
                   (double)sent);
    ps_prom_metric(b, "psworker_received_bytes_total", "counter",
                   "Bytes received from the servers.", (double)received);
    ps_metrics_publish(tr->metrics, b);
}
