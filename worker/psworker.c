/* psworker: trains a model on its shard of the data through psd (or alone
 * with --standalone). Each step pulls the weights for clock t, runs forward
 * and backward on its backend, and pushes each layer's gradient the moment
 * backward produces it, asking for that layer's clock t+1 weights right
 * behind it, so communication overlaps the rest of the backward pass. */
#include "trainer.h"

#include "connect.h"
#include "exchange.h"
#include "local.h"
#include "model.h"
#include "pipe.h"
#include "report.h"
#include "topk.h"
#include "train.h"

#include "ps_auto.h"
#include "ps_clock.h"
#include "ps_cpus.h"
#include "ps_curve.h"
#include "ps_err.h"
#include "ps_limits.h"
#include "ps_notify.h"
#include "ps_opts.h"
#include "ps_safetensors.h"
#include "ps_shard.h"
#include "ps_zmsg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define OPT(...)  PS_OPT(struct config, __VA_ARGS__)
#define FOPT(...) PS_FOPT(struct config, __VA_ARGS__)

static const struct ps_opt opts[] = {
    OPT("servers", PS_OPT_STR, servers, NULL, 0, 0, "EP[,EP...]",
        "psd endpoints, shard 0 first (required unless --standalone)"),
    OPT("rank", PS_OPT_U64A, rank, "0", 0, PS_WORKERS_MAX - 1, "R",
        "this worker's rank; auto: JOB_COMPLETION_INDEX, RANK, SLURM_PROCID or "
        "OMPI_COMM_WORLD_RANK, the first that is set"),
    OPT("workers", PS_OPT_U64A, workers, "1", 1, PS_WORKERS_MAX, "W",
        "number of workers; auto: WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE or PSD_WORKERS, "
        "the first that is set"),
    OPT("model", PS_OPT_STR, model, "mlp", 0, 0, "NAME",
        "mlp or cnn (IDX images), or sparse-lr (libsvm DIR/train.svm and DIR/test.svm)"),
    FOPT("l1", l1, "0", 0.0, 1e6, "L1", "sparse-lr with ftrl: L1 strength"),
    FOPT("l2", l2, "0", 0.0, 1e6, "L2", "sparse-lr with ftrl: L2 strength"),
    OPT("embed-dim", PS_OPT_U64, embed_dim, "0", 0, 1024, "D",
        "sparse-lr: embed each feature in D floats and classify with an MLP (0: linear)"),
    OPT("embed-hidden", PS_OPT_U64, embed_hidden, "64", 1, 65536, "H",
        "sparse-lr with --embed-dim: hidden width of the MLP"),
    OPT("rows-max", PS_OPT_U64, rows_max, "10000000", 1, UINT64_C(1) << 31, "N",
        "sparse-lr: rows one shard may hold"),
    OPT("admit-after", PS_OPT_U64, admit_after, "0", 0, 255, "N",
        "sparse-lr: a feature gets a row at its Nth push (0: its first); until then its pushes "
        "are counted and its weights are the initial ones"),
    OPT("evict-after", PS_OPT_U64, evict_after, "0", 0, UINT64_MAX, "K",
        "sparse-lr: evict rows not pushed in their table's last K pushes on a shard (0: never)"),
    OPT("evict-at-budget", PS_OPT_FLAG, evict_at_budget, NULL, 0, 0, NULL,
        "sparse-lr: at --rows-max, evict the least recently pushed row for a new one instead of "
        "stopping with an error"),
    OPT("evict-half-life", PS_OPT_U64, evict_half_life, "0", 0, UINT64_C(1) << 31, "H",
        "sparse-lr with --evict-at-budget: evict the row of least push count, halved every H "
        "pushes of its table on a shard, instead of the least recently pushed (0)"),
    OPT("layers", PS_OPT_STR, layers, "784,256,128,10", 0, 0, "N,N,...", "MLP widths"),
    OPT("arch", PS_OPT_STR, arch,
        "conv3x3:32,relu,maxpool2,conv3x3:64,relu,maxpool2,fc:128,relu,fc:10", 0, 0, "LAYERS",
        "--model cnn: convKxK:C[:padP] (stride 1), relu, maxpoolS or avgpoolS, then fc:N layers "
        "with relu between them; the tables are named as PyTorch names them (conv1.weight, ..., "
        "fc1.weight, ...)"),
    OPT("data", PS_OPT_STR, data, "/usr/share/datasets/fashion-mnist", 0, 0, "DIR",
        "IDX files (gzip or plain)"),
    OPT("batch", PS_OPT_U64, batch, "64", 1, 65536, "B", "examples per step on this worker"),
    OPT("accum-steps", PS_OPT_U64, accum_steps, "1", 1, 1024, "N",
        "sum N mini-batch gradients locally, push once (one clock per push)"),
    OPT("stages", PS_OPT_U64, stages, "1", 1, PSW_LAYERS_MAX, "P",
        "split the model into P pipeline stages, one process each: rank r runs stage r % P of "
        "pipeline r / P, and the --workers / P pipelines train one model through psd"),
    OPT("cuts", PS_OPT_STR, cuts, NULL, 0, 0, "N[,N...]",
        "--stages: the P-1 fc layers after which a stage ends (2: fc1 and fc2 on stage 0, the "
        "rest after; a CNN's convolutions go with stage 0); default: where the stages' "
        "multiply-adds balance best"),
    OPT("microbatches", PS_OPT_U64, microbatches, "0", 0, PSW_SLOTS_MAX - 1, "M",
        "--stages: micro-batches of a step (--batch is their sum; it must divide by M); 0: the "
        "most, up to 2 x P, that divide --batch"),
    OPT("schedule", PS_OPT_STR, schedule, "1f1b", 0, 0, "NAME",
        "--stages: gpipe (every forward, then every backward: M micro-batches' activations held) "
        "or 1f1b (one forward, one backward: stage s holds min(P - s, M)); the same bits either "
        "way"),
    OPT("stage-endpoints", PS_OPT_STR, stage_endpoints, NULL, 0, 0, "EP[,EP...]",
        "--stages: where each rank's stage listens, rank 0 first (patterns as --servers); stage "
        "s connects to rank + 1's"),
    OPT("stage-listen", PS_OPT_STR, stage_listen, NULL, 0, 0, "EP",
        "--stages: bind here instead of tcp://*:PORT, PORT from this rank's --stage-endpoints"),
    OPT("stage-timeout-ms", PS_OPT_U64, stage_timeout_ms, "2000", 100, 3600000, "MS",
        "--stages: a neighbouring stage silent this long (no ZeroMQ heartbeat) is gone: the "
        "run stops with an error naming it"),
    OPT("compute-threads", PS_OPT_U64, compute_threads, "0", 0, 2, "N",
        "CPU backend: 2 has a helper thread share the pieces of each big matrix product with the "
        "training thread (OpenBLAS then runs 1 thread per call), 1 leaves threading to OpenBLAS, "
        "0 picks 2 where this process may run on 2 or more CPUs; 2 and 1 give the same bits when "
        "OpenBLAS runs 1 thread (OPENBLAS_NUM_THREADS=1): its own threads split a product their "
        "own way, and the last bits may differ"),
    OPT("epochs", PS_OPT_U64, epochs, "5", 1, 100000, "E", "passes over the training set"),
    FOPT("lr", lr, "0.02", 0.0, 100.0, "LR", "learning rate"),
    OPT("optimizer", PS_OPT_STR, optimizer, "momentum", 0, 0, "NAME",
        "sgd, momentum, adagrad, adam, or (--model sparse-lr only) ftrl (FTRL-proximal) or "
        "rowwise_adagrad (one accumulator per embedding row; the dense head takes adagrad)"),
    OPT("lr-schedule", PS_OPT_STR, lr_schedule, "cosine", 0, 0, "NAME",
        "constant, or cosine decay to 0 over the whole run"),
    FOPT("momentum", momentum, "0.9", 0.0, 0.999999, "M", "momentum coefficient"),
    FOPT("topk", topk, "0", 0.0, 1.0, "FRACTION",
         "send only this fraction of each gradient (largest first; the rest is kept and "
         "added next step; with momentum, momentum moves to the worker as in DGC); 0: off"),
    OPT("whole-pulls", PS_OPT_FLAG, whole_pulls, NULL, 0, 0, NULL,
        "with --topk, pull every table whole each step (by default a worker asks each shard "
        "for the weights written since its last pull, about what the round's top-k pushes "
        "touched; shards sharing memory with the worker always send them whole)"),
    FOPT("weight-decay", weight_decay, "0", 0.0, 1.0, "WD", "L2 weight decay"),
    OPT("wire-dtype", PS_OPT_STR, wire_dtype, "f32", 0, 0, "DTYPE",
        "values on the wire: f32, f16 or bf16 (servers keep f32; shards sharing memory with "
        "the worker take f32 through it)"),
    OPT("precision", PS_OPT_STR, precision, "f32", 0, 0, "P",
        "compute in f32, bf16 or f16 as torch.autocast does: the servers keep f32 weights, the "
        "worker rounds a copy of them, every activation and every gradient to P, and matrix "
        "products accumulate in f32 (tensor cores on CUDA; on the CPU, f32 products of the "
        "rounded values, the same numbers); f16 scales the loss as GradScaler does"),
    FOPT("loss-scale", loss_scale, "65536", 1.0, 16777216.0, "S",
         "--precision f16: the first loss scale; it halves, and the step is skipped on every "
         "worker, when a gradient overflows, and doubles after --growth-interval clean steps"),
    OPT("growth-interval", PS_OPT_U64, growth_interval, "2000", 1, 100000000, "N",
        "--precision f16: steps without an overflow before the loss scale doubles"),
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
    OPT("test-stop-at", PS_OPT_U64, test_stop_at, "0", 0, UINT64_MAX, "CLOCK",
        "testing only: stop once the step at this clock is done, as if the run ended there "
        "(the tables and their schedule are the whole run's, unlike --max-steps); 0: never"),
    OPT("test-overflow-at", PS_OPT_U64, test_overflow_at, "0", 0, UINT64_MAX, "CLOCK",
        "testing only, --precision f16: make one gradient of this worker infinite in the step "
        "at this clock (once); 0: never"),
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

/* --save: the weights as safetensors, named and shaped as PyTorch's
 * state_dict of the same model. */
static int save_safetensors(struct trainer *tr, const char *path)
{
    struct ps_st_tensor ts[TABLES_MAX];
    for (int k = 0; k < tr->ntables; k++) {
        char name[64];
        uint64_t shape[4];
        psw_table_name(tr, k, name, sizeof name);
        ps_st_tensor(&ts[k], name, "F32", tr->hw[k], 4, psw_table_size(tr, k), 0);
        (void)ps_st_tensor_shape(&ts[k], shape, (uint32_t)psw_table_shape(tr, k, shape));
    }
    char err[512];
    const char *meta[] = {"format", "pt"};
    int rc = ps_st_write(path, ts, (size_t)tr->ntables, meta, 2, err, sizeof err);
    if (rc != 0)
        PS_LOG(&tr->log, PS_LOG_ERROR, W0003, "--save: %s", err);
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
    char tmp[PS_PATH_MAX];
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
                "\"bytes_pulled_shared\": %llu, \"precision\": \"%s\", \"loss_scale\": %.9g, "
                "\"skipped_steps\": %llu, \"failovers\": %llu",
                accs, tr->train_seconds > 0 ? samples / tr->train_seconds : 0.0,
                (unsigned long long)done, (unsigned long long)tr->cfg.epochs, wall,
                (unsigned long long)sent, (unsigned long long)recvd,
                done ? (double)sent / (double)done : 0.0, done ? (double)recvd / (double)done : 0.0,
                (unsigned long long)tr->cfg.rank, (unsigned long long)tr->cfg.workers,
                psk_kind_of(tr->be) == PSK_CUDA ? "cuda" : "cpu", (unsigned long long)tr->clock0,
                (unsigned long long)(tr->c ? psc_stale_pushes(tr->c) : 0),
                (unsigned long long)(tr->c ? psc_resends(tr->c) : 0),
                (unsigned long long)(tr->c ? psc_batches_sent(tr->c) : 0),
                (unsigned long long)ssent, (unsigned long long)srecvd, psk_precision_name(tr->prec),
                tr->scale, (unsigned long long)tr->skipped,
                (unsigned long long)(tr->c ? psc_failovers(tr->c) : 0)) > 0;
    const struct psw_stage_stats *st = &tr->stage;
    const struct config *c = &tr->cfg;
    if (c->stages > 1) /* the bubble: waiting for a neighbour, of the training time */
        ok =
            fprintf(f,
                    ", \"stage\": %llu, \"stages\": %llu, \"pipeline\": %llu, "
                    "\"pipelines\": %llu, \"schedule\": \"%s\", \"microbatches\": %llu, "
                    "\"forward_seconds\": %.6f, \"backward_seconds\": %.6f, "
                    "\"idle_seconds\": %.6f, \"bubble_fraction\": %.6f, "
                    "\"activations_held_max\": %llu, \"stage_bytes_sent\": %llu, "
                    "\"stage_bytes_received\": %llu",
                    (unsigned long long)psw_stage(c), (unsigned long long)c->stages,
                    (unsigned long long)psw_pipeline(c), (unsigned long long)psw_pipelines(c),
                    c->schedule, (unsigned long long)c->microbatches, st->forward_s, st->backward_s,
                    st->idle_s, tr->train_seconds > 0 ? st->idle_s / tr->train_seconds : 0.0,
                    (unsigned long long)st->held_max, (unsigned long long)st->link_sent,
                    (unsigned long long)st->link_received) > 0 &&
            ok;
    ok = fputs("}\n", f) >= 0 && ok;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return PS_EIO;
    }
    return 0;
}

/* --stages and the flags that go with it. */
static int check_stages(struct config *c, int sparse, int prec, char *err, size_t errlen)
{
    if (c->stages == 1) {
        if (c->cuts || c->stage_endpoints || c->stage_listen || c->microbatches)
            return ps_errf(PS_EINVAL, err, errlen,
                           "--cuts, --microbatches, --stage-endpoints and --stage-listen need "
                           "--stages 2 or more");
        return 0;
    }
    if (c->workers % c->stages != 0)
        return ps_errf(PS_EINVAL, err, errlen,
                       "--workers %llu is not a multiple of --stages %llu: each pipeline has one "
                       "process per stage",
                       (unsigned long long)c->workers, (unsigned long long)c->stages);
    const char *with = sparse                 ? "--model sparse-lr"
                       : c->standalone        ? "--standalone"
                       : c->topk > 0          ? "--topk"
                       : c->accum_steps > 1   ? "--accum-steps (micro-batches sum a step)"
                       : prec != PSK_PREC_F32 ? "--precision bf16 or f16"
                       : c->save != NULL      ? "--save (psctl export writes the whole model)"
                                              : NULL;
    if (with != NULL)
        return ps_errf(PS_EINVAL, err, errlen, "--stages does not combine with %s yet", with);
    if (strcmp(c->schedule, "gpipe") != 0 && strcmp(c->schedule, "1f1b") != 0)
        return ps_errf(PS_EINVAL, err, errlen, "--schedule: '%s' is not gpipe or 1f1b",
                       c->schedule);
    for (uint64_t m = 2 * c->stages; c->microbatches == 0; m--)
        if (c->batch % m == 0) /* m = 1 ends it */
            c->microbatches = m;
    if (c->batch % c->microbatches != 0)
        return ps_errf(PS_EINVAL, err, errlen,
                       "--batch %llu is not a multiple of --microbatches %llu (each micro-batch "
                       "takes --batch / M rows)",
                       (unsigned long long)c->batch, (unsigned long long)c->microbatches);
    if (c->stage_endpoints == NULL)
        return ps_errf(PS_EINVAL, err, errlen,
                       "--stages needs --stage-endpoints: where each rank's stage listens");
    return 0;
}

static int check_config(struct config *c, char *err, size_t errlen)
{
    int sparse = strcmp(c->model, "sparse-lr") == 0;
    if (strcmp(c->model, "mlp") != 0 && strcmp(c->model, "cnn") != 0 && !sparse) {
        snprintf(err, errlen, "--model: '%s' is not a known model (mlp, cnn, sparse-lr)", c->model);
        return PS_EINVAL;
    }
    if (sparse && (c->standalone || c->topk > 0 || c->accum_steps > 1 || c->metrics_listen)) {
        snprintf(err, errlen,
                 "--model sparse-lr trains through servers, without --topk, --accum-steps or "
                 "--metrics-listen (not there yet)");
        return PS_EINVAL;
    }
    if ((c->workers == PS_OPT_AUTO &&
         ps_auto_workers("--workers auto", 1, PS_WORKERS_MAX, &c->workers, err, errlen) != 0) ||
        (c->rank == PS_OPT_AUTO &&
         ps_auto_rank("--rank auto", 0, PS_WORKERS_MAX - 1, &c->rank, err, errlen) != 0))
        return PS_EINVAL;
    if (c->rank >= c->workers) {
        snprintf(err, errlen, "--rank %llu must be less than --workers %llu",
                 (unsigned long long)c->rank, (unsigned long long)c->workers);
        return PS_EINVAL;
    }
    if (strcmp(c->lr_schedule, "cosine") != 0 && strcmp(c->lr_schedule, "constant") != 0) {
        snprintf(err, errlen, "--lr-schedule: '%s' is not constant or cosine", c->lr_schedule);
        return PS_EINVAL;
    }
    if (psw_wire_dtype(c->wire_dtype) < 0) {
        snprintf(err, errlen, "--wire-dtype: '%s' is not f32, f16 or bf16", c->wire_dtype);
        return PS_EINVAL;
    }
    int prec = psk_precision_parse(c->precision);
    if (prec < 0 || (sparse && prec != PSK_PREC_F32)) {
        snprintf(err, errlen,
                 prec < 0 ? "--precision: '%s' is not f32, bf16 or f16"
                          : "--precision %s: --model sparse-lr computes in f32",
                 c->precision);
        return PS_EINVAL;
    }
    int opt = psk_optim_parse(c->optimizer);
    if (opt < 0) {
        snprintf(err, errlen,
                 "--optimizer: '%s' is not sgd, momentum, adagrad, adam, ftrl or rowwise_adagrad",
                 c->optimizer);
        return PS_EINVAL;
    }
    if ((opt == PSK_OPT_FTRL || opt == PSK_OPT_ROWWISE_ADAGRAD) && !sparse) {
        /* FTRL's weights collapse on the MLP's dense layers; row-wise
         * Adagrad needs rows */
        snprintf(err, errlen,
                 "--optimizer %s: for sparse models (--model sparse-lr); the mlp and the cnn "
                 "take sgd, momentum, adagrad or adam",
                 c->optimizer);
        return PS_EINVAL;
    }
    if (!sparse && (c->admit_after || c->evict_after || c->evict_at_budget || c->evict_half_life)) {
        snprintf(err, errlen,
                 "--admit-after, --evict-after, --evict-at-budget and --evict-half-life are for "
                 "--model sparse-lr (its rows by feature)");
        return PS_EINVAL;
    }
    if (c->evict_half_life && !c->evict_at_budget) {
        snprintf(err, errlen, "--evict-half-life chooses what --evict-at-budget evicts: give both");
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
    int rc = check_stages(c, sparse, prec, err, errlen);
    if (rc != 0)
        return rc;
    return ps_log_level_parse(c->log_level) < 0
               ? (snprintf(err, errlen, "--log-level: '%s' is not error, warn, info or debug",
                           c->log_level),
                  PS_EINVAL)
               : 0;
}

static int setup(struct trainer *tr, char *err, size_t errlen)
{
    struct config *c = &tr->cfg;
    int rc = psk_open(c->device, &tr->be, err, errlen);
    if (rc != 0)
        return rc;
    if (err[0] != '\0') /* --device auto fell back to the CPU: say why */
        PS_LOG(&tr->log, PS_LOG_INFO, W0015, "--device %s: %s; training on the CPU", c->device,
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
    PS_LOG(&tr->log, PS_LOG_INFO, W0001, "rank %llu of %llu on %s%s%s", (unsigned long long)c->rank,
           (unsigned long long)c->workers, psk_describe(tr->be),
           tr->pool ? " and a helper thread" : "", c->standalone ? " (standalone)" : "");
    int dims[PSW_LAYERS_MAX + 1];
    int cnn = strcmp(c->model, "cnn") == 0;
    int nl = cnn ? psw_cnn_parse(&tr->cnn, c->arch, 1, 28, 28, dims, err, errlen)
                 : psw_mlp_parse_layers(c->layers, dims, err, errlen);
    if (nl < 0)
        return nl;
    if ((rc = psw_data_load(c->data, "train", dims[nl], &tr->train, err, errlen)) != 0 ||
        (rc = psw_data_load(c->data, "t10k", dims[nl], &tr->test, err, errlen)) != 0)
        return rc;
    if (cnn && (tr->train.pixels != 28 * 28 || tr->test.pixels != tr->train.pixels)) {
        snprintf(err, errlen, "--model cnn: 28x28 images are needed, these have %u pixels",
                 tr->train.pixels);
        return PS_EINVAL;
    }
    if (!cnn && ((uint32_t)dims[0] != tr->train.pixels || tr->test.pixels != tr->train.pixels)) {
        snprintf(err, errlen, "--layers: input width %d, but the images have %u pixels", dims[0],
                 tr->train.pixels);
        return PS_EINVAL;
    }
    /* the data-parallel replicas: the workers, or the pipelines */
    uint64_t replicas = c->workers / c->stages;
    if (c->batch * replicas * c->accum_steps > tr->train.n) {
        snprintf(err, errlen,
                 "--batch %llu x %llu %s x --accum-steps %llu exceeds the %u training examples",
                 (unsigned long long)c->batch, (unsigned long long)replicas,
                 c->stages > 1 ? "pipelines" : "workers", (unsigned long long)c->accum_steps,
                 tr->train.n);
        return PS_EINVAL;
    }
    /* a pipeline stage runs head layers [first, end) */
    int first = 0, end = nl, stage = (int)psw_stage(c);
    if (c->stages > 1 && (rc = psw_pipe_plan(tr, dims, nl, &first, &end, err, errlen)) != 0)
        return rc;
    tr->fc0 = first;
    tr->shaped = cnn;
    int bmax = (int)c->batch > EVAL_BATCH ? (int)c->batch : EVAL_BATCH;
    if ((rc = psw_mlp_init(&tr->mlp, tr->be, dims + first, end - first, bmax, err, errlen)) != 0)
        return rc;
    if (stage > 0) { /* its input is the stage before's output, its gradient goes back there */
        tr->kbase = (cnn ? psw_cnn_tables(&tr->cnn) : 0) + 2 * first;
        psw_mlp_set_input_relu(&tr->mlp);
        if (psw_mlp_enable_input_grad(&tr->mlp) != 0) {
            snprintf(err, errlen, "out of memory for the stage's input gradient");
            return PS_ENOMEM;
        }
    }
    if (cnn && stage == 0) { /* the convolutions write the head's input and read its gradient */
        if (psw_mlp_enable_input_grad(&tr->mlp) != 0) {
            snprintf(err, errlen, "out of memory for the head's input gradient");
            return PS_ENOMEM;
        }
        rc = psw_cnn_init(&tr->cnn, tr->be, bmax, tr->mlp.act[0], tr->mlp.dx, err, errlen);
        if (rc != 0)
            return rc;
        tr->k0 = psw_cnn_tables(&tr->cnn);
    }
    psw_mlp_set_pool(&tr->mlp, tr->pool);
    tr->prec = psk_precision_parse(c->precision);
    tr->scale = tr->prec == PSK_PREC_F16 ? c->loss_scale : 1.0;
    tr->mlp.loss_scale = (float)tr->scale;
    if (psw_mlp_set_precision(&tr->mlp, tr->prec) != 0 ||
        (cnn && psw_cnn_set_precision(&tr->cnn, tr->prec) != 0)) {
        snprintf(err, errlen, "out of memory for the %s copies of the weights", c->precision);
        return PS_ENOMEM;
    }
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
    if (!c->standalone && (rc = psw_connect_client(tr, 1, err, errlen)) != 0)
        return rc;
    if (!c->standalone && (tr->ex = psw_exchange_create()) == NULL) {
        snprintf(err, errlen, "out of memory for the exchange's state");
        return PS_ENOMEM;
    }
    if (!c->standalone)
        psw_use_region(tr);
    /* The schedule spans the run's clocks (the server converts its own
     * application count in asp/ssp). Every worker computes the same value,
     * so the table specs agree. */
    uint64_t steps = (uint64_t)(tr->train.n / (c->batch * replicas * c->accum_steps)) * c->epochs;
    if (c->max_steps && c->max_steps < steps)
        steps = c->max_steps;
    tr->decay_steps = steps;
    if ((rc = psw_setup_tables(tr, err, errlen)) != 0)
        return rc;
    if (!c->standalone)
        tr->clock = tr->clock0 = psc_start_clock(tr->c);
    if (tr->clock > 0 && tr->clock >= steps) {
        /* the servers are past this run: nothing to train, the final weights to read */
        PS_LOG(&tr->log, PS_LOG_WARN, W0017,
               "the run is over: the servers are at clock %llu and this run has %llu steps; "
               "reading the final weights only",
               (unsigned long long)tr->clock, (unsigned long long)steps);
        tr->clock = tr->clock0 = steps;
    } else if (tr->clock > 0) {
        uint64_t per_epoch = tr->train.n / (c->batch * replicas * c->accum_steps);
        PS_LOG(&tr->log, PS_LOG_INFO, W0011,
               "rejoining a run in progress at clock %llu (epoch %llu, step %llu of %llu)",
               (unsigned long long)tr->clock, (unsigned long long)(tr->clock / per_epoch + 1),
               (unsigned long long)(tr->clock % per_epoch), (unsigned long long)per_epoch);
    }
    if (c->stages > 1 && (rc = psw_pipe_start(tr, err, errlen)) != 0)
        return rc;
    return c->standalone ? 0 : psw_pull_all(tr, tr->clock);
}

static void teardown(struct trainer *tr)
{
    for (int k = 0; k < tr->ntables; k++) {
        if (!tr->alias) {
            psk_host_free(tr->be, tr->hw[k]);
            psk_host_free(tr->be, tr->hg[k]);
        }
        psk_free(tr->be, tr->acc[k]);
    }
    psw_pipe_stop(tr);
    psw_local_destroy(tr->local);
    psw_topk_destroy(tr);
    psw_exchange_destroy(tr->ex);
    psw_report_destroy(tr->rep);
    psc_destroy(tr->c);
    ps_pool_stop(tr->pool);
    if (tr->be != NULL) {
        psk_host_free(tr->be, tr->h_in);
        psw_cnn_fini(&tr->cnn);
        psw_mlp_fini(&tr->mlp);
        psk_close(tr->be);
    }
    free(tr->perm);
    free(tr->h_lab);
    psw_data_free(&tr->train);
    psw_data_free(&tr->test);
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
        PS_LOG(&tr.log, PS_LOG_INFO, W0007, "threads on CPUs %s, ZeroMQ's I/O thread on %s", on,
               io);
    }
    if (strcmp(tr.cfg.model, "sparse-lr") == 0)
        return psw_run_sparse_lr(&tr);
    double t0 = ps_mono_s(), acc = -1;
    if ((tr.rep = psw_report_create()) == NULL) {
        PS_LOG(&tr.log, PS_LOG_ERROR, W0002, "out of memory at start");
        return 1;
    }
    if (tr.cfg.metrics_listen != NULL &&
        psw_report_listen(&tr, tr.cfg.metrics_listen, err, sizeof err) != 0) {
        PS_LOG(&tr.log, PS_LOG_ERROR, W0005, "%s", err);
        psw_report_destroy(tr.rep);
        return 2;
    }
    int rc = setup(&tr, err, sizeof err);
    if (rc != 0) {
        PS_LOG(&tr.log, PS_LOG_ERROR, W0002, "%s", err);
    } else {
        snprintf(err, sizeof err, "rank %llu of %llu training from clock %llu",
                 (unsigned long long)tr.cfg.rank, (unsigned long long)tr.cfg.workers,
                 (unsigned long long)tr.clock);
        ps_notify_ready(err);
        psw_worker_metrics(&tr, 1);
        rc = tr.cfg.stages > 1 ? psw_pipe_train(&tr, &acc) : psw_train(&tr, &acc);
    }
    ps_notify_stopping();
    if (rc == 0 && tr.cfg.save != NULL && tr.cfg.rank == 0)
        rc = save_safetensors(&tr, tr.cfg.save); /* it logs why it failed */
    if (rc == 0) {
        PS_LOG(&tr.log, PS_LOG_INFO, W0100, "done: %llu steps, test accuracy %.4f, %.0f samples/s",
               (unsigned long long)tr.done, acc,
               tr.train_seconds > 0 ? tr.done * tr.cfg.batch * tr.cfg.accum_steps / tr.train_seconds
                                    : 0.0);
    }
    if (tr.cfg.summary_json != NULL && tr.be != NULL &&
        write_summary(&tr, tr.cfg.summary_json, acc, ps_mono_s() - t0) != 0)
        PS_LOG(&tr.log, PS_LOG_ERROR, W0004, "--summary-json: cannot write '%s'",
               tr.cfg.summary_json);
    teardown(&tr);
    return rc == 0 ? 0 : 1;
}
