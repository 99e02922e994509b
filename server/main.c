/* psd: one parameter-server shard. Parses flags, owns the loop, handles
 * signals, and wires the core (psd.c) to the transport (net.c). */
#include "catalog.h"
#include "checkpoint.h"
#include "counters.h"
#include "live.h"
#include "snapshot.h"
#include "ps_clock.h"
#include "ps_fs.h"
#include "exposition.h"
#include "net.h"
#include "psd.h"
#include "repl.h"
#include "repl_metrics.h"

#include "ps_auto.h"
#include "ps_cpus.h"
#include "ps_zmsg.h"
#include "ps_err.h"
#include "ps_limits.h"
#include "ps_local.h"
#include "ps_log.h"
#include "ps_notify.h"
#include "ps_opts.h"
#include "ps_pool.h"
#include "ps_zsock.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

/* psd_tick's period: dropping silent workers, expiring waits and
 * regions, interval checkpoints, publishing /metrics, the watchdog. */
#define PSD_TICK_MS 250

struct psd_config {
    const char *listen;
    uint64_t shard;
    uint64_t shards;
    uint64_t max_message_bytes;
    uint64_t io_threads;
    uint64_t apply_threads;
    int no_local_ipc;
    const char *cpus;
    const char *consistency;
    uint64_t workers;
    uint64_t wait_timeout_ms;
    double worker_timeout;
    const char *prune;
    const char *curve_secret, *curve_allow, *keygen;
    const char *checkpoint_dir;
    uint64_t checkpoint_every;
    uint64_t stop_timeout_ms;
    uint64_t max_table_bytes;
    uint64_t max_unread_bytes, max_unread_bytes_total;
    int allow_nonfinite;
    int start_empty;
    const char *log_level;
    const char *config;
    const char *endpoint_file;
    const char *metrics_listen;
    const char *etcd, *etcd_prefix, *advertise, *replica_of, *replica_name;
    uint64_t lease_ttl, replica_timeout_ms, replica_transfer_mib, replica_backlog_mib;
    int help;
    int version;
};

#define OPT(...)  PS_OPT(struct psd_config, __VA_ARGS__)
#define FOPT(...) PS_FOPT(struct psd_config, __VA_ARGS__)

static const struct ps_opt psd_opts[] = {
    OPT("listen", PS_OPT_STR, listen, "tcp://127.0.0.1:5570", 0, 0, "ENDPOINT",
        "ZeroMQ endpoint to bind; port 0 picks a free port"),
    OPT("shard", PS_OPT_U64A, shard, "0", 0, PS_SHARDS_MAX - 1, "I",
        "this server's shard index; auto: PSD_SHARD, else the host name's -N suffix (a "
        "StatefulSet pod's ordinal; with --etcd, that mod --shards: pod o is shard o mod S, "
        "replica o div S)"),
    OPT("shards", PS_OPT_U64, shards, "1", 1, PS_SHARDS_MAX, "S",
        "number of shards in the cluster"),
    OPT("max-message-bytes", PS_OPT_U64, max_message_bytes, "268435456", PS_MESSAGE_BYTES_MIN,
        PS_MESSAGE_BYTES_MAX, "BYTES",
        "largest frame accepted; a peer sending more is disconnected"),
    OPT("io-threads", PS_OPT_U64, io_threads, "1", 1, 16, "N", "ZeroMQ I/O threads"),
    OPT("apply-threads", PS_OPT_U64, apply_threads, "0", 0, 2, "N",
        "2: a helper thread takes pieces of each large apply (a dense push of 1 Mi "
        "elements or more, a keyed one of 16 Ki keys or more) while a core is free; 1: "
        "none; 0 (default): 2 where psd may run on 2 or more CPUs"),
    OPT("no-local-ipc", PS_OPT_FLAG, no_local_ipc, NULL, 0, 0, NULL,
        "do not also bind the tcp endpoint's same-host Unix socket (ipc://@psd/HOST:PORT), "
        "which workers on this host switch to"),
    OPT("cpus", PS_OPT_STR, cpus, NULL, 0, 0, "LIST",
        "run every psd thread on these CPUs (as taskset -c writes them: 0,2-3); default: "
        "wherever the scheduler puts them"),
    OPT("consistency", PS_OPT_STR, consistency, "asp", 0, 0, "MODE",
        "bsp, ssp:K (no worker more than K clocks ahead) or asp"),
    OPT("workers", PS_OPT_U64, workers, "1", 1, PS_WORKERS_MAX, "W",
        "workers expected (bsp/ssp wait for worker ids 0..W-1)"),
    OPT("wait-timeout-ms", PS_OPT_U64, wait_timeout_ms, "120000", 100, 86400000, "MS",
        "longest a pull waits for its clock before an error reply naming who is missing"),
    FOPT("worker-timeout", worker_timeout, "10", 0, 86400, "SECONDS",
         "drop a worker silent this long from the live set, so bsp/ssp go on without it until "
         "it rejoins (0: never)"),
    OPT("max-table-bytes", PS_OPT_U64, max_table_bytes, "17179869184", 4096, UINT64_C(1) << 40,
        "BYTES", "largest table (weights + optimizer state) a peer may create on this shard"),
    OPT("max-unread-bytes", PS_OPT_U64, max_unread_bytes, "268435456", PS_UNREAD_BYTES_MIN,
        UINT64_C(1) << 40, "BYTES",
        "reply bytes one connection may leave unread in psd's queue; a pull past it is refused "
        "(one reply of any size fits while nothing is unread)"),
    OPT("max-unread-bytes-total", PS_OPT_U64, max_unread_bytes_total, "4294967296",
        PS_UNREAD_BYTES_MIN, UINT64_C(1) << 40, "BYTES",
        "reply bytes all connections together may leave unread; a pull past it is refused"),
    OPT("allow-nonfinite", PS_OPT_FLAG, allow_nonfinite, NULL, 0, 0, NULL,
        "apply pushes whose gradients hold NaN or infinities (by default they are refused, "
        "since one would poison the weights for good)"),
    OPT("prune", PS_OPT_STR, prune, NULL, 0, 0, "SPEC[,SPEC]",
        "gradual magnitude pruning, SPEC = TABLE:TARGET[:START:END:EVERY] (steps; "
        "defaults " PSD_PRUNE_DEFAULTS ")"),
    OPT("checkpoint-dir", PS_OPT_STR, checkpoint_dir, NULL, 0, 0, "DIR",
        "write checkpoints here, and restore the newest valid one at start"),
    OPT("start-empty", PS_OPT_FLAG, start_empty, NULL, 0, 0, NULL,
        "start with empty tables even when --checkpoint-dir holds checkpoints that do not "
        "restore here (another --shard or --shards, or damaged); without it psd refuses to start"),
    OPT("checkpoint-every", PS_OPT_U64, checkpoint_every, "60", 0, 86400 * 365, "SECONDS",
        "interval between checkpoints, written only when the state changed (0: only on "
        "SIGTERM)"),
    OPT("stop-timeout-ms", PS_OPT_U64, stop_timeout_ms, "10000", 0, 600000, "MS",
        "on SIGTERM mid-round (bsp, with --checkpoint-dir): serve on until the round ends, "
        "then write the checkpoint and stop; past this long, stop without one (0: at once)"),
    OPT("curve-secret", PS_OPT_STR, curve_secret, NULL, 0, 0, "FILE",
        "encrypt with CURVE using this key file (psd --keygen); needs --curve-allow"),
    OPT("curve-allow", PS_OPT_STR, curve_allow, NULL, 0, 0, "DIR",
        "public key files of the clients admitted (one per file)"),
    OPT("keygen", PS_OPT_STR, keygen, NULL, 0, 0, "PATH",
        "write a new CURVE key pair to PATH (secret, 0600) and PATH.pub, then exit"),
    OPT("log-level", PS_OPT_STR, log_level, "info", 0, 0, "LEVEL", "error, warn, info or debug"),
    OPT("config", PS_OPT_STR, config, NULL, 0, 0, "FILE",
        "read options from an INI file (NAME = VALUE, names as the long flags); flags on the "
        "command line win; SIGHUP reads it again"),
    OPT("endpoint-file", PS_OPT_STR, endpoint_file, NULL, 0, 0, "PATH",
        "write the bound endpoint here once listening (for scripts and tests)"),
    OPT("metrics-listen", PS_OPT_STR, metrics_listen, NULL, 0, 0, "ADDR:PORT",
        "serve Prometheus /metrics and /healthz over HTTP here (port 0 picks a free port)"),
    OPT("etcd", PS_OPT_STR, etcd, NULL, 0, 0, "URL",
        "run as one replica of the shard (http://HOST:PORT of etcd, whose leases decide which "
        "replica is primary); every replica of a shard takes the same --etcd"),
    OPT("replica-of", PS_OPT_STR, replica_of, NULL, 0, 0, "ENDPOINT",
        "start as a backup of the shard's primary at ENDPOINT (etcd's word wins when it names "
        "another); a backup never becomes a new shard's first primary; needs --etcd"),
    OPT("advertise", PS_OPT_STR, advertise, NULL, 0, 0, "ENDPOINT",
        "how other replicas and clients reach this process (default: the bound --listen "
        "endpoint; needed when --listen binds every address)"),
    OPT("replica-name", PS_OPT_STR, replica_name, NULL, 0, 0, "NAME",
        "a stable identity for this replica (a Kubernetes pod's name): the same replica in "
        "every run, and held in etcd while it runs, so a second process claiming it is refused; "
        "default: a new identity each run"),
    OPT("etcd-prefix", PS_OPT_STR, etcd_prefix, "/psd", 0, 0, "PREFIX",
        "etcd keys of this cluster's shards go under PREFIX/shard-I-of-S/"),
    OPT("lease-ttl", PS_OPT_U64, lease_ttl, "1", 1, 60, "SECONDS",
        "the primary's etcd lease: a primary that stops renewing it is replaced after this "
        "(etcd may grant more: its minimum is 1.5 x its --election-timeout)"),
    OPT("replica-timeout-ms", PS_OPT_U64, replica_timeout_ms, "500", 50, 60000, "MS",
        "a backup silent this long is dropped by its primary (replies stop waiting for it once "
        "etcd no longer lists it); a primary silent this long is replaced by a backup of its "
        "in-sync set; keep it above the primary's longest pause (a checkpoint write)"),
    OPT("replica-transfer-mib", PS_OPT_U64, replica_transfer_mib, "256", 1, 1048576, "MIB",
        "a primary keeps the records it makes while a joining backup's state is written and "
        "sent, up to this many MiB; past it the backup is dropped and asks again (raise it for a "
        "shard whose pushes during one transfer pass it)"),
    OPT("replica-backlog-mib", PS_OPT_U64, replica_backlog_mib, "64", 0, 1048576, "MIB",
        "a primary keeps its newest records, up to this many MiB, so that a replica restarted "
        "from its own checkpoint (or a backup of the last primary) gets only the records after "
        "it instead of the whole state; 0: none kept"),
    OPT("help", PS_OPT_FLAG, help, NULL, 0, 0, NULL, "show this help and exit"),
    OPT("version", PS_OPT_FLAG, version, NULL, 0, 0, NULL, "show the version and exit"),
};

#define NOPTS (sizeof psd_opts / sizeof psd_opts[0])

struct app {
    struct ps_log log;
    struct psd srv;
    struct psd_net net;
    struct psd_security sec;
    uv_loop_t loop;
    uv_signal_t sigint, sigterm, sighup;
    uv_timer_t stop_timer; /* a stop waiting for the round's end or the primary's (stopping) */
    int stopping;
    int down;         /* shut_down ran */
    int exit_code;    /* what main returns once the loop ends */
    int checkpointed; /* a checkpoint at shutdown holds the state */
    int argc;
    char **argv;
    struct psd_config cfg;
    uv_timer_t tick;
    struct ps_metrics *metrics;
    struct ps_buf metrics_text;
    struct psd_repl repl;
    int replicated;
};

/* Renders the metrics and hands them to the HTTP thread. */
static void publish_metrics(struct app *a)
{
    if (a->metrics == NULL)
        return;
    psd_expose(&a->srv, &a->metrics_text);
    if (a->net.sock != NULL) /* started */
        psd_expose_net(&a->net, a->cfg.curve_secret != NULL ? &a->sec : NULL, &a->metrics_text);
    if (a->replicated) {
        psd_repl_metrics(&a->repl, &a->metrics_text);
        char why[PS_METRICS_WHY_MAX];
        int ready = psd_repl_ready(&a->repl, why, sizeof why);
        ps_metrics_set_ready(a->metrics, ready, why);
    }
    ps_metrics_publish(a->metrics, &a->metrics_text);
}

static void on_round_end(void *ctx);

static void on_tick(uv_timer_t *h)
{
    struct app *a = h->data;
    psd_tick(&a->srv);
    if (a->stopping && a->net.on_quiescent != NULL && psd_quiescent(&a->srv)) {
        on_round_end(a); /* a round the tick ended (a worker dropped) */
        return;
    }
    publish_metrics(a);
    ps_notify_watchdog(); /* from the loop: a stuck loop stops petting it */
}

static void finish_shut_down(void *ctx);

/* The shutdown: a checkpoint of the state when it changed and every
 * table is between rounds; a replicated primary's held replies go
 * (psd_repl_drain); then the loop's handles closed. */
static void shut_down(struct app *a)
{
    if (a->down)
        return;
    a->down = 1;
    psd_checkpoint_reap(&a->srv, 1); /* an interval checkpoint being written: it ends first */
    const char *current = psd_checkpoints_on(&a->srv) ? psd_checkpoint_current(&a->srv) : NULL;
    int rc = current == NULL && psd_checkpoints_on(&a->srv)
                 ? psd_checkpoint_now(&a->srv, "shutdown")
                 : PSD_CKPT_WRITTEN;
    if (current != NULL)
        PS_LOG(&a->log, PS_LOG_INFO, S0604,
               "no checkpoint at shutdown: nothing changed since %s was written", current);
    else if (rc == PSD_CKPT_HELD)
        PS_LOG(&a->log, PS_LOG_INFO, S0608,
               "no checkpoint at shutdown: this backup has not loaded its primary's state, and "
               "one of what it holds would hide the newest in --checkpoint-dir");
    else if (rc == PSD_CKPT_SKIPPED)
        PS_LOG(&a->log, PS_LOG_WARN, S0603,
               "no checkpoint at shutdown: a bsp round is in progress; the newest is from %llu "
               "ms ago",
               (unsigned long long)((uint64_t)ps_mono_ms() - psd_checkpoint_last_ms(&a->srv)));
    a->net.on_quiescent = NULL;
    if (a->stopping)
        uv_close((uv_handle_t *)&a->stop_timer, NULL);
    a->checkpointed = psd_checkpoints_on(&a->srv) && psd_checkpoint_current(&a->srv) != NULL;
    if (a->replicated && psd_repl_drain(&a->repl, finish_shut_down, a))
        return;
    finish_shut_down(a);
}

/* The shutdown's end: a primary records a clean stop when a checkpoint
 * holds its state; the loop's handles closed. */
static void finish_shut_down(void *ctx)
{
    struct app *a = ctx;
    if (a->replicated)
        psd_repl_stop(&a->repl, a->checkpointed);
    psd_net_stop(&a->net);
    uv_close((uv_handle_t *)&a->tick, NULL);
    uv_close((uv_handle_t *)&a->sigint, NULL);
    uv_close((uv_handle_t *)&a->sigterm, NULL);
    uv_close((uv_handle_t *)&a->sighup, NULL);
}

/* The request that ended the round was answered, and no other has been
 * read: the state is the round's, whole. */
static void on_round_end(void *ctx)
{
    struct app *a = ctx;
    PS_LOG(&a->log, PS_LOG_INFO, S0606, "the round ended: stopping");
    shut_down(a);
}

/* A backup stopping: its primary sent its last record, or is gone. */
static void on_primary_stopped(void *ctx)
{
    shut_down(ctx);
}

static void on_stop_timeout(uv_timer_t *h)
{
    struct app *a = h->data;
    if (a->repl.stopping)
        PS_LOG(&a->log, PS_LOG_WARN, S0607,
               "the primary did not stop within --stop-timeout-ms %llu: this backup stops without "
               "its last records",
               (unsigned long long)a->cfg.stop_timeout_ms);
    else
        PS_LOG(&a->log, PS_LOG_WARN, S0607,
               "the bsp round did not end within --stop-timeout-ms %llu (a worker gone?): "
               "stopping without it",
               (unsigned long long)a->cfg.stop_timeout_ms);
    shut_down(a);
}

static void start_stop_timer(struct app *a)
{
    a->stopping = 1;
    uv_timer_init(&a->loop, &a->stop_timer);
    a->stop_timer.data = a;
    uv_timer_start(&a->stop_timer, on_stop_timeout, a->cfg.stop_timeout_ms, 0);
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct app *a = h->data;
    if (a->stopping) { /* a second signal: now */
        PS_LOG(&a->log, PS_LOG_INFO, S0020, "signal %d: shutting down now", signum);
        shut_down(a);
        return;
    }
    PS_LOG(&a->log, PS_LOG_INFO, S0020, "signal %d: shutting down", signum);
    ps_notify_stopping();
    /* A backup holding its primary's state follows it to its last record,
     * so that both stop at one state and either may take over at the
     * restart (lead.h). */
    if (a->replicated && a->cfg.stop_timeout_ms > 0 &&
        psd_repl_stop_after_primary(&a->repl, on_primary_stopped, a)) {
        PS_LOG(&a->log, PS_LOG_INFO, S0722,
               "a backup stopping: following the primary until its last record (at most %llu ms)",
               (unsigned long long)a->cfg.stop_timeout_ms);
        start_stop_timer(a);
        return;
    }
    /* Mid-round with a state to keep: serve on until the round ends (the
     * workers' pushes complete it), so the checkpoint holds every push
     * acknowledged and the restarted shard goes on from there; a primary
     * then records the clean stop in etcd. */
    if ((!a->replicated || a->repl.role == PSD_ROLE_PRIMARY) && a->cfg.stop_timeout_ms > 0 &&
        psd_checkpoints_on(&a->srv) && psd_checkpoint_current(&a->srv) == NULL &&
        !psd_quiescent(&a->srv)) {
        PS_LOG(&a->log, PS_LOG_INFO, S0605,
               "a bsp round is in progress: serving until it ends (at most %llu ms), then "
               "writing the checkpoint",
               (unsigned long long)a->cfg.stop_timeout_ms);
        start_stop_timer(a);
        a->net.on_quiescent = on_round_end;
        a->net.quiescent_ctx = a;
        return;
    }
    shut_down(a);
}

/* Options a SIGHUP applies while running; every other one needs a restart. */
static int reloadable(const char *name)
{
    static const char *const live[] = {"log-level", "wait-timeout-ms", "worker-timeout",
                                       "checkpoint-every"};
    for (size_t i = 0; i < sizeof live / sizeof live[0]; i++)
        if (strcmp(name, live[i]) == 0)
            return 1;
    return 0;
}

/* SIGHUP: reads the config (file and flags) again and applies what can
 * change while running; a restart-only option whose value changed is
 * named, and kept as it was. */
static void on_hup(uv_signal_t *h, int signum)
{
    (void)signum;
    struct app *a = h->data;
    struct psd_config n;
    char err[512] = "";
    memset(&n, 0, sizeof n);
    int level = -1;
    if (ps_opts_parse(psd_opts, NOPTS, &n, a->argc, a->argv, NULL, err, sizeof err) != 0 ||
        (level = ps_log_level_parse(n.log_level)) < 0) {
        PS_LOG(&a->log, PS_LOG_ERROR, S0031, "SIGHUP: config not reloaded, nothing changed: %s",
               level < 0 && err[0] == '\0' ? "bad --log-level" : err);
        return;
    }
    struct psd_config *o = &a->cfg;
    if (n.shard == PS_OPT_AUTO) /* worked out at the start; the host name stays */
        n.shard = o->shard;
    char kept[512] = "";
    size_t used = 0;
    unsigned changed = 0;
    for (size_t i = 0; i < NOPTS; i++) {
        const struct ps_opt *opt = &psd_opts[i];
        if (ps_opt_same(opt, &n, o))
            continue;
        if (reloadable(opt->name)) {
            changed++;
            continue;
        }
        if (used < sizeof kept)
            used += (size_t)snprintf(kept + used, sizeof kept - used, "%s%s", used ? ", " : "",
                                     opt->name);
        ps_opt_copy(opt, &n, o);
    }
    if (kept[0] != '\0')
        PS_LOG(&a->log, PS_LOG_WARN, S0032,
               "SIGHUP: %s changed, which takes a restart; kept as it was", kept);
    if (strcmp(n.log_level, o->log_level) != 0)
        PS_LOG(&a->log, PS_LOG_INFO, S0030, "SIGHUP: log-level %s -> %s", o->log_level,
               n.log_level);
    a->log.level = level;
    if (n.wait_timeout_ms != o->wait_timeout_ms)
        PS_LOG(&a->log, PS_LOG_INFO, S0030, "SIGHUP: wait-timeout-ms %llu -> %llu",
               (unsigned long long)o->wait_timeout_ms, (unsigned long long)n.wait_timeout_ms);
    psd_set_wait_timeout(&a->srv, n.wait_timeout_ms);
    if (n.worker_timeout != o->worker_timeout)
        PS_LOG(&a->log, PS_LOG_INFO, S0030, "SIGHUP: worker-timeout %g -> %g", o->worker_timeout,
               n.worker_timeout);
    psd_set_worker_timeout(&a->srv, (uint64_t)(n.worker_timeout * 1000.0 + 0.5));
    if (n.checkpoint_every != o->checkpoint_every)
        PS_LOG(&a->log, PS_LOG_INFO, S0030, "SIGHUP: checkpoint-every %llu -> %llu",
               (unsigned long long)o->checkpoint_every, (unsigned long long)n.checkpoint_every);
    psd_set_checkpoint_every(&a->srv, n.checkpoint_every * 1000u);
    PS_LOG(&a->log, PS_LOG_INFO, S0033, "SIGHUP: config read again: %u option(s) applied%s",
           changed, kept[0] ? ", restart-only ones kept" : "");
    *o = n;
}

/* temp file + rename, so a reader never sees a half-written endpoint */
static int write_endpoint_file(const char *path, const char *endpoint)
{
    char tmp[PS_PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return PS_EINVAL;
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        return PS_EIO;
    int ok = fprintf(f, "%s\n", endpoint) > 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return PS_EIO;
    }
    return 0;
}

static int parse_prunes(const char *list, struct psd_prune_spec *out, size_t *n)
{
    char buf[4096], err[256];
    *n = 0;
    if (list == NULL)
        return 0;
    if (strlen(list) >= sizeof buf) {
        fprintf(stderr, "psd: --prune: longer than %zu bytes\n", sizeof buf - 1);
        return 2;
    }
    strcpy(buf, list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        if (*n >= PSD_PRUNE_SPECS_MAX) {
            fprintf(stderr, "psd: --prune: more than %d tables\n", PSD_PRUNE_SPECS_MAX);
            return 2;
        }
        if (psd_prune_parse(tok, &out[*n], err, sizeof err) != 0) {
            fprintf(stderr, "psd: %s\n", err);
            return 2;
        }
        (*n)++;
    }
    return 0;
}

static int parse_config(struct psd_config *cfg, int argc, char **argv, int *level,
                        struct psd_cons *cons)
{
    char err[256];
    memset(cfg, 0, sizeof *cfg);
    if (ps_opts_parse(psd_opts, NOPTS, cfg, argc, argv, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "psd: %s\n", err);
        return 2;
    }
    if (cfg->help) {
        ps_opts_usage(stdout, "psd [OPTIONS]",
                      "psd holds one shard of a model's weights and applies updates to them.",
                      psd_opts, NOPTS);
        return 0;
    }
    if (cfg->keygen) {
        if (ps_curve_keygen(cfg->keygen, err, sizeof err) != 0) {
            fprintf(stderr, "psd: %s\n", err);
            return 1;
        }
        printf("wrote %s and %s.pub\n", cfg->keygen, cfg->keygen);
        return 0;
    }
    if (cfg->version) {
        printf("psd %s (protocol %u)\n", PSD_VERSION, PS_PROTOCOL_VERSION);
        return 0;
    }
    if (cfg->shard == PS_OPT_AUTO) {
        /* with --etcd, pods past the shard count are more replicas:
         * ordinal o is shard o mod S */
        uint64_t last = cfg->etcd != NULL ? cfg->shards * PS_REPLICAS_MAX - 1 : cfg->shards - 1;
        if (ps_auto_shard("--shard auto", 0, last, &cfg->shard, err, sizeof err) != 0) {
            fprintf(stderr, "psd: %s\n", err);
            return 2;
        }
        cfg->shard %= cfg->shards;
    }
    if (cfg->shard >= cfg->shards) {
        fprintf(stderr, "psd: --shard %llu must be less than --shards %llu\n",
                (unsigned long long)cfg->shard, (unsigned long long)cfg->shards);
        return 2;
    }
    *level = ps_log_level_parse(cfg->log_level);
    if (*level < 0) {
        fprintf(stderr, "psd: --log-level: '%s' is not one of error, warn, info, debug\n",
                cfg->log_level);
        return 2;
    }
    if (psd_cons_parse(cfg->consistency, cons) != 0) {
        fprintf(stderr, "psd: --consistency: '%s' is not bsp, asp or ssp:K (K in 0..1000000)\n",
                cfg->consistency);
        return 2;
    }
    cons->workers = (uint32_t)cfg->workers;
    char why[PS_ENDPOINT_MAX + 96];
    if (ps_endpoint_check(cfg->listen, 1, why, sizeof why) != 0) {
        fprintf(stderr, "psd: --listen: %s\n", why);
        return 2;
    }
    if ((cfg->replica_of != NULL || cfg->advertise != NULL || cfg->replica_name != NULL) &&
        cfg->etcd == NULL) {
        fprintf(stderr, "psd: --%s needs --etcd: replicas take their primary from etcd\n",
                cfg->replica_of     ? "replica-of"
                : cfg->replica_name ? "replica-name"
                                    : "advertise");
        return 2;
    }
    char nerr[160];
    if (cfg->replica_name != NULL && psd_lead_name_check(cfg->replica_name, nerr, sizeof nerr)) {
        fprintf(stderr, "psd: %s\n", nerr);
        return 2;
    }
    const char *eps[] = {cfg->replica_of, cfg->advertise};
    for (size_t i = 0; i < 2; i++)
        if (eps[i] != NULL && (strlen(eps[i]) >= PS_ENDPOINT_MAX ||
                               ps_endpoint_check(eps[i], 0, why, sizeof why) != 0)) {
            fprintf(stderr, "psd: --%s: %s\n", i ? "advertise" : "replica-of",
                    strlen(eps[i]) >= PS_ENDPOINT_MAX ? "too long" : why);
            return 2;
        }
    return -1;
}

/* --etcd: this process is one replica of its shard (repl.h). */
/* The replica cannot go on (another process took its name): psd stops,
 * exiting 2. */
static void on_replica_fatal(void *ctx, const char *why)
{
    struct app *a = ctx;
    (void)why; /* the replica logged it */
    a->exit_code = 2;
    shut_down(a);
}

static int start_replica(struct app *a, const struct psd_config *cfg)
{
    const char *adv = cfg->advertise != NULL ? cfg->advertise : a->net.endpoint;
    if (strstr(adv, "://0.0.0.0:") != NULL || strstr(adv, "://*:") != NULL ||
        strstr(adv, "://[::]:") != NULL) {
        PS_LOG(&a->log, PS_LOG_ERROR, S0008,
               "--listen %s binds every address: say with --advertise how the other replicas "
               "and the clients reach this one",
               a->net.endpoint);
        return PS_EINVAL;
    }
    struct psd_repl_config rc = {
        .etcd = cfg->etcd,
        .prefix = cfg->etcd_prefix,
        .advertise = adv,
        .replica_of = cfg->replica_of,
        .lease_ttl_s = (int64_t)cfg->lease_ttl,
        .timeout_ms = cfg->replica_timeout_ms,
        .transfer_kept_bytes = cfg->replica_transfer_mib << 20,
        .backlog_bytes = cfg->replica_backlog_mib << 20,
        .curve = cfg->curve_secret != NULL ? &a->sec.keys : NULL,
        .name = cfg->replica_name,
        .fatal = on_replica_fatal,
        .fatal_ctx = a,
    };
    char err[512];
    a->replicated = 1;
    a->sec.replicas = cfg->curve_secret != NULL;
    if (psd_repl_start(&a->repl, &a->net, &a->loop, &rc, err, sizeof err) != 0) {
        PS_LOG(&a->log, PS_LOG_ERROR, S0008, "%s", err);
        return PS_EINVAL;
    }
    PS_LOG(&a->log, PS_LOG_INFO, S0015,
           "a replica of shard %u as %s (etcd %s, keys under %s/shard-%u-of-%u/, lease %llu s)%s%s",
           a->srv.conf.shard, adv, cfg->etcd, cfg->etcd_prefix, a->srv.conf.shard,
           a->srv.conf.shards, (unsigned long long)cfg->lease_ttl,
           cfg->replica_of ? ", following " : "", cfg->replica_of ? cfg->replica_of : "");
    return 0;
}

int main(int argc, char **argv)
{
    ps_malloc_tune();
    struct psd_config cfg;
    int level = PS_LOG_INFO;
    struct psd_cons cons;
    int rc = parse_config(&cfg, argc, argv, &level, &cons);
    if (rc >= 0)
        return rc;
    static struct psd_prune_spec prunes[PSD_PRUNE_SPECS_MAX];
    size_t nprunes = 0;
    if (parse_prunes(cfg.prune, prunes, &nprunes) != 0)
        return 2;
    static struct ps_cpus cpus;
    char cpu_err[512];
    if (cfg.cpus != NULL && (ps_cpus_parse("--cpus", cfg.cpus, &cpus, cpu_err, sizeof cpu_err) ||
                             ps_cpus_pin_process(&cpus, cpu_err, sizeof cpu_err))) {
        fprintf(stderr, "psd: %s\n", cpu_err);
        return 2;
    }

    /* each connection takes a descriptor: as many as the hard limit allows
     * (shells often set 1,024 soft) */
    struct rlimit rl;
    unsigned long long nofile = 0;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur < rl.rlim_max) {
            rlim_t soft = rl.rlim_cur;
            rl.rlim_cur = rl.rlim_max;
            if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
                rl.rlim_cur = soft;
        }
        nofile = (unsigned long long)rl.rlim_cur;
    }

    static struct app a; /* large (the transport and replicas); static, not on the stack */
    ps_log_init(&a.log, "psd", level);
    struct psd_params params = {
        .shard = (uint32_t)cfg.shard,
        .shards = (uint32_t)cfg.shards,
        .value_bytes_max = cfg.max_message_bytes,
        .cons = cons,
        .wait_timeout_ms = cfg.wait_timeout_ms,
        .prunes = prunes,
        .nprunes = nprunes,
        .table_bytes_max = cfg.max_table_bytes,
        .worker_timeout_ms = (uint64_t)(cfg.worker_timeout * 1000.0 + 0.5),
        .unread_bytes_max = cfg.max_unread_bytes,
        .unread_bytes_total_max = cfg.max_unread_bytes_total,
        .allow_nonfinite = cfg.allow_nonfinite,
        .checkpoint_dir = cfg.checkpoint_dir,
        .checkpoint_every_ms = cfg.checkpoint_every * 1000u,
    };
    /* 0: chosen here (cfg keeps what was asked, which a reload compares) */
    uint64_t apply_threads = cfg.apply_threads ? cfg.apply_threads : ps_cpus_allowed() >= 2 ? 2 : 1;
    /* no spin after a run: on a small machine the helper's look would take
     * the core from ZeroMQ's I/O threads */
    if (apply_threads > 1 && ps_pool_start(&params.pool, 0, "psd-apply") != 0) {
        PS_LOG(&a.log, PS_LOG_ERROR, S0001, "--apply-threads: cannot start the helper thread: %s",
               strerror(errno));
        return 1;
    }
    if (psd_init(&a.srv, &a.log, &params) != 0) {
        PS_LOG(&a.log, PS_LOG_ERROR, S0007, "out of memory at start");
        return 1;
    }
    if (cfg.checkpoint_dir != NULL) {
        char path[PS_PATH_MAX];
        if (ps_mkdirs(cfg.checkpoint_dir, 0755) != 0) { /* and the folders above, as mkdir -p */
            PS_LOG(&a.log, PS_LOG_ERROR, S0005, "--checkpoint-dir: cannot create '%s': %s",
                   cfg.checkpoint_dir, strerror(errno));
            psd_fini(&a.srv);
            return 2;
        }
        char found[256];
        size_t nfound = 0;
        int64_t t0 = ps_mono_ms();
        if (psd_checkpoint_restore(&a.srv, cfg.checkpoint_dir, path, sizeof path) == PSD_RESTORED) {
            PS_LOG(&a.log, PS_LOG_INFO, S0610, "restored %s: %u tables (%lld ms)", path,
                   psd_ntables(&a.srv), (long long)(ps_mono_ms() - t0));
        } else if ((nfound = psd_snapshot_found(cfg.checkpoint_dir, found, sizeof found)) > 0 &&
                   !cfg.start_empty) {
            /* a trained model would be served empty: only when told to */
            PS_LOG(&a.log, PS_LOG_ERROR, S0612,
                   "--checkpoint-dir %s holds %zu checkpoint file(s) (%s) but none restores into "
                   "shard %llu of %llu: start with the --shard and --shards they were written "
                   "by, or pass --start-empty to serve empty tables (the files stay as they are)",
                   cfg.checkpoint_dir, nfound, found, (unsigned long long)cfg.shard,
                   (unsigned long long)cfg.shards);
            psd_fini(&a.srv);
            return 2;
        } else {
            PS_LOG(&a.log, nfound ? PS_LOG_WARN : PS_LOG_INFO, S0611,
                   "no valid checkpoint in %s for shard %llu of %llu: starting empty%s",
                   cfg.checkpoint_dir, (unsigned long long)cfg.shard,
                   (unsigned long long)cfg.shards,
                   nfound ? " (--start-empty; the checkpoints there are left as they are)" : "");
        }
        psd_checkpoint_mark_saved(&a.srv);
    }
    uv_loop_init(&a.loop);
    char err[512];
    struct psd_security *sec = NULL;
    if (cfg.curve_secret != NULL) {
        if (psd_security_load(&a.sec, &a.log, cfg.curve_secret, cfg.curve_allow, err, sizeof err) !=
            0) {
            PS_LOG(&a.log, PS_LOG_ERROR, S0004, "%s", err);
            psd_fini(&a.srv);
            return 2;
        }
        sec = &a.sec;
        PS_LOG(&a.log, PS_LOG_INFO, S0011, "CURVE on: %zu client key(s) admitted", a.sec.allow->n);
    }
    if (cfg.metrics_listen != NULL) {
        if (ps_metrics_start(&a.metrics, cfg.metrics_listen, err, sizeof err) != 0) {
            PS_LOG(&a.log, PS_LOG_ERROR, S0006, "%s", err);
            psd_fini(&a.srv);
            uv_loop_close(&a.loop);
            return 2;
        }
        publish_metrics(&a);
        if (cfg.etcd != NULL) /* until the replica says what it is */
            ps_metrics_set_ready(a.metrics, 0, "starting: a replica that has not found its part");
        PS_LOG(&a.log, PS_LOG_INFO, S0012,
               "metrics on %s (port %d): GET /metrics, /healthz, /readyz", cfg.metrics_listen,
               ps_metrics_port(a.metrics));
    }
    /* a backup could not read a client's shared region: replicas use tcp */
    int local_ipc = !cfg.no_local_ipc && cfg.etcd == NULL;
    if (psd_net_start(&a.net, &a.srv, &a.loop, cfg.listen, (int)cfg.io_threads, local_ipc, sec, err,
                      sizeof err) != 0) {
        PS_LOG(&a.log, PS_LOG_ERROR, S0002, "%s", err);
        ps_metrics_stop(a.metrics);
        psd_fini(&a.srv);
        uv_loop_close(&a.loop);
        return 1;
    }
    if (cfg.etcd != NULL && start_replica(&a, &cfg) != 0) {
        psd_net_stop(&a.net);
        uv_run(&a.loop, UV_RUN_NOWAIT);
        psd_repl_fini(&a.repl);
        psd_net_fini(&a.net);
        ps_metrics_stop(a.metrics);
        psd_fini(&a.srv);
        uv_loop_close(&a.loop);
        return 2;
    }
    uv_signal_init(&a.loop, &a.sigint);
    uv_signal_init(&a.loop, &a.sigterm);
    a.sigint.data = a.sigterm.data = &a;
    uv_signal_start(&a.sigint, on_signal, SIGINT);
    uv_signal_start(&a.sigterm, on_signal, SIGTERM);
    uv_signal_init(&a.loop, &a.sighup);
    a.sighup.data = &a;
    a.argc = argc;
    a.argv = argv;
    a.cfg = cfg;
    uv_signal_start(&a.sighup, on_hup, SIGHUP);
    uv_timer_init(&a.loop, &a.tick);
    a.tick.data = &a;
    uv_timer_start(&a.tick, on_tick, PSD_TICK_MS, PSD_TICK_MS);

    PS_LOG(&a.log, PS_LOG_INFO, S0010,
           "shard %llu of %llu listening on %s (psd %s, %s, %llu workers)",
           (unsigned long long)cfg.shard, (unsigned long long)cfg.shards, a.net.endpoint,
           PSD_VERSION, cfg.consistency, (unsigned long long)cfg.workers);
    if (psd_local_endpoint(&a.srv)[0] != '\0')
        PS_LOG(&a.log, PS_LOG_INFO, S0013, "clients on this host may use %s",
               psd_local_endpoint(&a.srv));
    if (cpus.n > 0) {
        char list[256];
        ps_cpus_format(&cpus, list, sizeof list);
        PS_LOG(&a.log, PS_LOG_INFO, S0014, "every thread runs on CPUs %s (--cpus)", list);
    }
    PS_LOG(&a.log, PS_LOG_INFO, S0016,
           "file descriptors: %llu (about that many connections; ulimit -n, LimitNOFILE=)",
           (unsigned long long)nofile);
    if (cfg.endpoint_file != NULL && write_endpoint_file(cfg.endpoint_file, a.net.endpoint) != 0)
        PS_LOG(&a.log, PS_LOG_ERROR, S0003, "--endpoint-file: cannot write '%s'",
               cfg.endpoint_file);
    char status[400];
    snprintf(status, sizeof status, "shard %llu of %llu listening on %s",
             (unsigned long long)cfg.shard, (unsigned long long)cfg.shards, a.net.endpoint);
    ps_notify_ready(status);

    uv_run(&a.loop, UV_RUN_DEFAULT);

    if (a.replicated)
        psd_repl_fini(&a.repl);
    psd_net_fini(&a.net);
    ps_metrics_stop(a.metrics);
    ps_buf_free(&a.metrics_text);
    PS_LOG(&a.log, PS_LOG_INFO, S0021, "stopped after %llu requests (%llu errors)",
           (unsigned long long)psd_counts(&a.srv)->requests,
           (unsigned long long)psd_counts(&a.srv)->errors);
    psd_fini(&a.srv);
    uv_loop_close(&a.loop);
    return a.exit_code;
}
