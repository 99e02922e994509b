/* Training through real psd and psworker processes on loopback:
 * BSP with 2 workers of batch B matches 1 worker of batch 2B; 1-worker BSP
 * is bit-identical to --standalone (same kernels, init and optimizer code);
 * runs are deterministic; ssp:2 bounds staleness at 2; asp never waits.
 * Uses Fashion-MNIST from Debian's dataset-fashion-mnist package. */
#include "harness.h"
#include "psclient.h"

#include <math.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define WORKER_TIMEOUT_MS 300000
#define STEPS             "12"

struct model {
    unsigned char *bytes;
    size_t len, hdr_end; /* data starts at hdr_end */
};

static const char *worker_bin(void)
{
    const char *b = getenv("PSWORKER_BIN");
    assert_non_null(b);
    return b;
}

static void load_model(const char *path, struct model *m)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("no model at %s", path);
    fseek(f, 0, SEEK_END);
    m->len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    m->bytes = malloc(m->len);
    assert_int_equal(fread(m->bytes, 1, m->len, f), m->len);
    fclose(f);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | m->bytes[i];
    assert_true(hl % 8 == 0 && 8 + hl < m->len);
    m->hdr_end = 8 + (size_t)hl;
    assert_true((m->len - m->hdr_end) % 4 == 0);
}

/* Starts `shards` psd processes; writes "ep0,ep1" into servers. */
static void start_cluster_with(struct psd_proc *p, int shards, const char *mode,
                               const char *workers, const char *prune, char *servers, size_t len)
{
    servers[0] = '\0';
    for (int i = 0; i < shards; i++) {
        char si[16], ss[16];
        snprintf(si, sizeof si, "%d", i);
        snprintf(ss, sizeof ss, "%d", shards);
        const char *args[11] = {"--shard",       si,   "--shards",  ss,
                                "--consistency", mode, "--workers", workers};
        if (prune != NULL) {
            args[8] = "--prune";
            args[9] = prune;
        }
        assert_int_equal(harness_psd_start(&p[i], args), 0);
        size_t used = strlen(servers);
        snprintf(servers + used, len - used, "%s%s", i ? "," : "", p[i].endpoint);
    }
}

static void start_cluster(struct psd_proc *p, int shards, const char *mode, const char *workers,
                          char *servers, size_t len)
{
    start_cluster_with(p, shards, mode, workers, NULL, servers, len);
}

static void stop_cluster(struct psd_proc *p, int shards)
{
    for (int i = 0; i < shards; i++)
        assert_int_equal(harness_psd_stop(&p[i]), 0);
}

/* Runs W workers with the common args plus per-rank flags; all must exit 0. */
/* flag, when not NULL: one more flag for every worker (--no-shm) */
static void run_workers_with(const char *servers, int W, const char *batch, const char *save,
                             const char *extra_rank1, const char *accum, const char *flag)
{
    pid_t pids[4];
    char logs[4][320];
    for (int r = 0; r < W; r++) {
        char rank[16], workers[16];
        snprintf(rank, sizeof rank, "%d", r);
        snprintf(workers, sizeof workers, "%d", W);
        harness_tmp(logs[r], sizeof logs[r], r ? "w1.log" : "w0.log");
        const char *argv[24] = {worker_bin(), "--servers", servers,   "--rank",   rank,
                                "--workers",  workers,     "--batch", batch,      "--max-steps",
                                STEPS,        "--epochs",  "1",       "--device", "cpu"};
        int n = 15;
        if (r == 0 && save) {
            argv[n++] = "--save";
            argv[n++] = save;
        }
        if (accum != NULL) {
            argv[n++] = "--accum-steps";
            argv[n++] = accum;
        }
        if (r == 1 && extra_rank1) {
            argv[n++] = "--test-delay-ms";
            argv[n++] = extra_rank1;
        }
        if (flag != NULL)
            argv[n++] = flag;
        argv[n] = NULL;
        pids[r] = harness_spawn(argv, logs[r]);
        assert_true(pids[r] > 0);
    }
    for (int r = 0; r < W; r++) {
        int rc = harness_wait(pids[r], WORKER_TIMEOUT_MS);
        if (rc != 0) {
            harness_dump_file(logs[r]);
            fail_msg("worker %d exited with %d", r, rc);
        }
    }
}

static void run_workers(const char *servers, int W, const char *batch, const char *save,
                        const char *extra_rank1, const char *accum)
{
    run_workers_with(servers, W, batch, save, extra_rank1, accum, NULL);
}

/* Runs one psworker to its end; its log is shown when it fails. */
static void run_one(const char *const *argv, const char *log)
{
    pid_t pid = harness_spawn(argv, log);
    int rc = harness_wait(pid, WORKER_TIMEOUT_MS);
    if (rc != 0) {
        harness_dump_file(log);
        fail_msg("%s exited with %d", argv[1], rc);
    }
}

static void run_standalone(const char *batch, const char *save, const char *accum)
{
    const char *argv[] = {worker_bin(),
                          "--standalone",
                          "--batch",
                          batch,
                          "--max-steps",
                          STEPS,
                          "--epochs",
                          "1",
                          "--device",
                          "cpu",
                          "--save",
                          save,
                          "--accum-steps",
                          accum ? accum : "1",
                          NULL};
    char log[320];
    harness_tmp(log, sizeof log, "standalone.log");
    run_one(argv, log);
}

/* W workers against a fresh cluster of `shards` in `mode`; flag as in
 * run_workers_with. */
static void cluster_run(const char *mode, int shards, int W, const char *batch, const char *save,
                        const char *accum, const char *flag)
{
    struct psd_proc p[2];
    char servers[600], ws[16];
    snprintf(ws, sizeof ws, "%d", W);
    start_cluster(p, shards, mode, ws, servers, sizeof servers);
    run_workers_with(servers, W, batch, save, NULL, accum, flag);
    stop_cluster(p, shards);
}

static void bsp_run(int shards, int W, const char *batch, const char *save, const char *accum)
{
    cluster_run("bsp", shards, W, batch, save, accum, NULL);
}

/* Equal up to float rounding, and trained: fc1.bias (after the 256x784
 * fc1.weight) starts at zero, so two models that never learned would be
 * equal too. */
static void assert_close(const char *what, const struct model *ma, const struct model *mb)
{
    assert_int_equal(ma->len, mb->len);
    assert_memory_equal(ma->bytes, mb->bytes, ma->hdr_end);
    size_t n = (ma->len - ma->hdr_end) / 4, off = 0;
    const float *fa = (const float *)(ma->bytes + ma->hdr_end);
    const float *fb = (const float *)(mb->bytes + mb->hdr_end);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)fa[i] - fb[i]) / (1e-3 + fabs((double)fb[i]));
        if (d > worst) {
            worst = d;
            off = i;
        }
    }
    printf("  %s: worst relative difference %.3g at %zu of %zu\n", what, worst, off, n);
    assert_true(worst < 1e-3);
    int moved = 0;
    for (size_t i = 256 * 784; i < 256 * 784 + 256 && i < n; i++)
        moved += fa[i] != 0.0f;
    assert_true(moved > 128);
}

static void test_bsp_two_workers_match_one_with_double_batch(void **state)
{
    (void)state;
    char a[320], b[320], c[320], a2[320];
    harness_tmp(a, sizeof a, "a.safetensors");
    harness_tmp(b, sizeof b, "b.safetensors");
    harness_tmp(c, sizeof c, "c.safetensors");
    harness_tmp(a2, sizeof a2, "a2.safetensors");
    bsp_run(2, 2, "16", a, NULL);
    bsp_run(2, 1, "32", b, NULL);
    run_standalone("32", c, NULL);
    bsp_run(2, 2, "16", a2, NULL);
    struct model ma, mb, mc, ma2;
    load_model(a, &ma);
    load_model(b, &mb);
    load_model(c, &mc);
    load_model(a2, &ma2);
    assert_int_equal(ma.len, mb.len);
    assert_memory_equal(ma.bytes, mb.bytes, ma.hdr_end); /* same tensors, same layout */
    /* 1-worker BSP and standalone run the same code: bit for bit. */
    assert_int_equal(mb.len, mc.len);
    assert_memory_equal(mb.bytes, mc.bytes, mb.len);
    /* BSP is deterministic: the same run twice gives the same bits. */
    assert_memory_equal(ma.bytes, ma2.bytes, ma.len);
    /* 2 x 16 vs 1 x 32: the same samples, equal up to float rounding. */
    assert_close("bsp 2x16 vs 1x32", &ma, &mb);
    free(ma.bytes);
    free(mb.bytes);
    free(mc.bytes);
    free(ma2.bytes);
}

/* The two saved models are the same bytes, and trained: fc1.bias starts
 * at 0, so it moved. */
static void assert_same_and_trained(const char *a, const char *b)
{
    struct model ma, mb;
    load_model(a, &ma);
    load_model(b, &mb);
    assert_int_equal(ma.len, mb.len);
    assert_memory_equal(ma.bytes, mb.bytes, ma.len);
    const float *w = (const float *)(ma.bytes + ma.hdr_end);
    int moved = 0;
    for (size_t i = 256 * 784; i < 256 * 784 + 256; i++)
        moved += w[i] != 0.0f;
    assert_true(moved > 0);
    free(ma.bytes);
    free(mb.bytes);
}

/* One shard and one worker in BSP apply the standalone run's updates with
 * the same optimizer code: the weights end the same to the bit. The worker
 * runs with its defaults on the shard's host: values through shared
 * memory, pulled weights used where they land (two sets), products in
 * pieces shared with a helper thread. */
static void test_one_worker_equals_standalone(void **state)
{
    (void)state;
    char a[320], b[320];
    harness_tmp(a, sizeof a, "one_bsp.safetensors");
    harness_tmp(b, sizeof b, "one_alone.safetensors");
    bsp_run(1, 1, "32", a, NULL);
    run_standalone("32", b, NULL);
    assert_same_and_trained(a, b);
}

/* asp counts the optimizer's steps (read by the cosine schedule, psworker's
 * default, and Adam's bias correction) by passes over a table, not by
 * requests: a worker sending 1 MiB chunks through shared memory ends with
 * the bits of one sending 256 KiB chunks in frames (--no-shm). */
static void test_asp_shared_memory_equals_frames(void **state)
{
    (void)state;
    char a[320], b[320];
    harness_tmp(a, sizeof a, "asp_shm.safetensors");
    harness_tmp(b, sizeof b, "asp_frames.safetensors");
    cluster_run("asp", 1, 1, "32", a, NULL, NULL);
    cluster_run("asp", 1, 1, "32", b, NULL, "--no-shm");
    assert_same_and_trained(a, b);
}

/* One worker on this host against a fresh 2-shard BSP cluster, values
 * through shared memory; flag (or NULL) added. Returns the batches of
 * requests it sent (its summary's request_batches). */
static double shm_run(const char *flag, const char *save)
{
    struct psd_proc p[2];
    char servers[600], summary[320], log[320];
    start_cluster(p, 2, "bsp", "1", servers, sizeof servers);
    harness_tmp(summary, sizeof summary, "batches.json");
    harness_tmp(log, sizeof log, "batches.log");
    const char *argv[] = {worker_bin(), "--servers",      servers, "--max-steps", STEPS, "--epochs",
                          "1",          "--device",       "cpu",   "--batch",     "32",  "--save",
                          save,         "--summary-json", summary, flag,          NULL};
    run_one(argv, log);
    stop_cluster(p, 2);
    double v = -1;
    assert_int_equal(harness_json_number(summary, "request_batches", &v), 0);
    return v;
}

/* A step's requests through shared memory carry no values: each shard
 * gets them as one message (OP_BATCH), and answers each as if it came
 * alone, so the weights end the same to the bit as with --no-batch. */
static void test_shared_memory_requests_go_in_batches(void **state)
{
    (void)state;
    char a[320], b[320];
    harness_tmp(a, sizeof a, "batched.safetensors");
    harness_tmp(b, sizeof b, "unbatched.safetensors");
    double on = shm_run(NULL, a), off = shm_run("--no-batch", b);
    printf("  batches sent: %.0f with batching, %.0f without\n", on, off);
    assert_true(on >= 2 * atof(STEPS)); /* a batch per shard and step at least */
    assert_true(off == 0);
    assert_same_and_trained(a, b);
}

static void test_accumulation_matches_bigger_batch(void **state)
{
    (void)state;
    char a[320], b[320], c[320];
    harness_tmp(a, sizeof a, "acc_a.safetensors");
    harness_tmp(b, sizeof b, "acc_b.safetensors");
    harness_tmp(c, sizeof c, "acc_c.safetensors");
    bsp_run(1, 2, "8", a, "2");   /* 2 workers x 8 x 2 micro-batches */
    bsp_run(1, 1, "32", b, NULL); /* 1 worker x 32 */
    run_standalone("16", c, "2"); /* 1 x 16 x 2, no server */
    struct model ma, mb, mc;
    load_model(a, &ma);
    load_model(b, &mb);
    load_model(c, &mc);
    assert_close("bsp 2x8x2 vs 1x32", &ma, &mb);
    assert_close("standalone 16x2 vs bsp 1x32", &mc, &mb);
    free(ma.bytes);
    free(mb.bytes);
    free(mc.bytes);
}

/* Runs one worker for 40 steps against a fresh 2-shard BSP cluster, pruned
 * and/or with --topk when given; reports the bytes it pushed and pulled.
 * The values go on the wire (--no-shm) unless shm: what is measured is
 * what pruning and top-k save there; *shared gets the bytes pushed through
 * shared memory. */
static void worker_run(const char *prune, const char *topk, const char *save, int shm,
                       unsigned long long *pushed, unsigned long long *pulled,
                       unsigned long long *shared)
{
    struct psd_proc p[2];
    char servers[600], summary[320], log[320];
    start_cluster_with(p, 2, "bsp", "1", prune, servers, sizeof servers);
    harness_tmp(summary, sizeof summary, "one.json");
    harness_tmp(log, sizeof log, "one.log");
    const char *no_shm = shm ? NULL : "--no-shm";
    const char *argv[] = {worker_bin(),  "--servers", servers,
                          "--max-steps", "40",        "--epochs",
                          "1",           "--device",  "cpu",
                          "--save",      save,        "--summary-json",
                          summary,       "--topk",    topk ? topk : "0",
                          no_shm,        NULL};
    run_one(argv, log);
    stop_cluster(p, 2);
    double v = 0;
    assert_int_equal(harness_json_number(summary, "bytes_pushed", &v), 0);
    *pushed = (unsigned long long)v;
    assert_int_equal(harness_json_number(summary, "bytes_pulled", &v), 0);
    *pulled = (unsigned long long)v;
    assert_int_equal(harness_json_number(summary, "bytes_pushed_shared", &v), 0);
    *shared = (unsigned long long)v;
}

static void one_worker_run(const char *prune, const char *topk, const char *save,
                           unsigned long long *pushed, unsigned long long *pulled)
{
    unsigned long long shared = 0;
    worker_run(prune, topk, save, 0, pushed, pulled, &shared);
    assert_true(shared == 0);
}

static unsigned long long pruned_run(const char *prune, const char *save)
{
    unsigned long long pushed, pulled;
    one_worker_run(prune, NULL, save, &pushed, &pulled);
    return pulled;
}

static void test_topk_sends_little_and_matches_standalone(void **state)
{
    (void)state;
    char a[320], b[320], c[320], log[320];
    harness_tmp(a, sizeof a, "topk.safetensors");
    harness_tmp(b, sizeof b, "dense40.safetensors");
    harness_tmp(c, sizeof c, "topk_alone.safetensors");
    unsigned long long tpush, tpull, dpush, dpull;
    one_worker_run(NULL, "0.01", a, &tpush, &tpull);
    one_worker_run(NULL, NULL, b, &dpush, &dpull);
    const char *argv[] = {worker_bin(), "--standalone", "--max-steps", "40",     "--epochs",
                          "1",          "--device",     "cpu",         "--save", c,
                          "--topk",     "0.01",         NULL};
    harness_tmp(log, sizeof log, "topk_alone.log");
    run_one(argv, log);
    printf("  topk 0.01: pushed %llu bytes vs %llu dense (%.1fx fewer), pulled %llu vs %llu "
           "(%.1fx fewer)\n",
           tpush, dpush, (double)dpush / (double)tpush, tpull, dpull,
           (double)dpull / (double)tpull);
    assert_true(tpush * 30 <= dpush);
    /* the pulls after the first bring what the pushes changed (mirrors) */
    assert_true(tpull * 5 <= dpull);
    assert_same_and_trained(a, c); /* the same selection and optimizer code */
    /* through shared memory: the keyed pushes' keys and values move there
     * (all but the headers, and the padding push of a shard that no key of
     * a table fell on), and the weights end the same */
    char d[320];
    harness_tmp(d, sizeof d, "topk_shm.safetensors");
    unsigned long long spush, spull, shared;
    worker_run(NULL, "0.01", d, 1, &spush, &spull, &shared);
    printf("  topk 0.01 through shared memory: %llu of %llu bytes pushed\n", shared, spush);
    assert_true(shared * 10 >= spush * 9);
    assert_same_and_trained(a, d);
}

static void test_prune_keeps_zeros_and_shrinks_pulls(void **state)
{
    (void)state;
    char a[320], b[320];
    harness_tmp(a, sizeof a, "pruned.safetensors");
    harness_tmp(b, sizeof b, "dense.safetensors");
    unsigned long long pulled = pruned_run("fc1.weight:0.9:0:20:5", a);
    unsigned long long dense = pruned_run(NULL, b);
    struct model m;
    load_model(a, &m);
    const float *w = (const float *)(m.bytes + m.hdr_end);
    size_t zeros = 0, n = 256 * 784;
    for (size_t i = 0; i < n; i++)
        zeros += w[i] == 0.0f;
    size_t other = 0; /* fc1.bias and the other layers are not pruned */
    for (size_t i = n; i < (m.len - m.hdr_end) / 4; i++)
        other += w[i] == 0.0f;
    printf("  fc1.weight zeros %.5f; pulled %llu bytes pruned vs %llu dense\n", (double)zeros / n,
           pulled, dense);
    assert_true(zeros >= (size_t)(0.9 * n));
    assert_true(other < 100);
    assert_true(pulled < dense * 7 / 10); /* fc1 is 83% of the bytes */
    free(m.bytes);
}

static void stats_after(const char *mode, const char *delay, struct psc_shard_stats *st)
{
    struct psd_proc p[1];
    char servers[300];
    start_cluster(p, 1, mode, "2", servers, sizeof servers);
    run_workers(servers, 2, "16", NULL, delay, NULL);
    const char *eps[1] = {p[0].endpoint};
    struct psc_config cfg = {.struct_size = sizeof cfg,
                             .servers = eps,
                             .nservers = 1,
                             .worker_id = 99,
                             .connect_timeout_ms = 10000};
    struct psc_client *c = NULL;
    char err[256];
    assert_int_equal(psc_create(&cfg, &c, err, sizeof err), 0);
    assert_int_equal(psc_stats(c, 0, 10000, st), 0);
    psc_destroy(c);
    stop_cluster(p, 1);
    printf("  %s: waited %llu times, max staleness %llu, timeouts %llu\n", st->consistency,
           (unsigned long long)st->deferred_total, (unsigned long long)st->max_staleness,
           (unsigned long long)st->wait_timeouts);
}

static void test_ssp_bounds_staleness(void **state)
{
    (void)state;
    struct psc_shard_stats st = {.struct_size = sizeof st};
    stats_after("ssp:2", "200",
                &st); /* rank 1 sleeps 200 ms a step: slower than rank 0 under any load */
    assert_string_equal(st.consistency, "ssp:2");
    assert_true(st.deferred_total > 0);    /* the fast worker had to wait */
    assert_int_equal(st.max_staleness, 2); /* ...exactly at the bound, never past it */
    assert_int_equal(st.wait_timeouts, 0);
}

static void test_asp_never_waits(void **state)
{
    (void)state;
    struct psc_shard_stats st = {.struct_size = sizeof st};
    stats_after("asp", "200", &st);
    assert_string_equal(st.consistency, "asp");
    assert_int_equal(st.deferred_total, 0);
    assert_int_equal(st.waiting, 0);
}

/* psworker lists every optimizer it takes, and refuses FTRL (its weights
 * collapsed there) and row-wise Adagrad (no rows) on the MLP with a
 * sentence saying where they work. */
static void test_optimizer_choices(void **state)
{
    (void)state;
    const char *bin = getenv("PSWORKER_BIN");
    char log[320];
    harness_tmp(log, sizeof log, "opt-help.log");
    const char *help[] = {bin, "--help", NULL};
    assert_int_equal(harness_wait(harness_spawn(help, log), 60000), 0);
    assert_true(harness_log_has(log, "--optimizer", "ftrl (FTRL-proximal) or rowwise_adagrad"));
    const char *sparse_only[] = {"ftrl", "rowwise_adagrad"};
    for (int i = 0; i < 2; i++) {
        harness_tmp(log, sizeof log, "opt-sparse-only.log");
        const char *argv[] = {bin, "--standalone", "--optimizer", sparse_only[i], NULL};
        assert_int_equal(harness_wait(harness_spawn(argv, log), 60000), 2);
        assert_true(harness_log_has(log, "for sparse models (--model sparse-lr)", sparse_only[i]));
    }
    harness_tmp(log, sizeof log, "opt-bad.log");
    const char *bad[] = {bin, "--standalone", "--optimizer", "lamb", NULL};
    assert_int_equal(harness_wait(harness_spawn(bad, log), 60000), 2);
    assert_true(harness_log_has(log,
                                "'lamb' is not sgd, momentum, adagrad, adam, ftrl or "
                                "rowwise_adagrad",
                                NULL));
}

/* psworker pointed at a server that never answers (a socket that
 * listens and says nothing) names the shard it waits for after a second
 * and again later, then gives up at --timeout-ms with the shard named. */
static void test_unanswered_servers_are_named(void **state)
{
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 4), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    char ep[64], log[320];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    harness_tmp(log, sizeof log, "unanswered.log");
    const char *argv[] = {
        getenv("PSWORKER_BIN"), "--servers", ep, "--timeout-ms", "7000", "--device", "cpu", NULL};
    int rc = harness_wait(harness_spawn(argv, log), 60000);
    close(fd);
    if (rc == 0 || harness_log_count(log, "W0014", ep) < 2)
        harness_dump_file(log);
    assert_int_not_equal(rc, 0);
    assert_true(harness_log_has(log, "W0014", "waited 1000 ms for 1 of 1 shard(s) to answer"));
    assert_true(harness_log_has(log, "W0014", "waited 6000 ms"));
    assert_true(harness_log_has(log, "no reply within 7000 ms from shard 0", ep));
}

/* --device: auto says why it trains on the CPU when it does; cuda on a
 * machine without a GPU says there is none (a GPU machine checks only
 * that auto chose it). */
static void test_device_choice_is_told(void **state)
{
    (void)state;
    const char *bin = getenv("PSWORKER_BIN");
    char log[320];
    harness_tmp(log, sizeof log, "device-auto.log");
    const char *autov[] = {bin, "--standalone", "--device", "auto", "--max-steps", "1", NULL};
    assert_int_equal(harness_wait(harness_spawn(autov, log), 120000), 0);
    if (harness_log_has(log, "W0001", "on cuda")) {
        assert_false(harness_log_has(log, "W0015", NULL));
        return;
    }
    assert_true(harness_log_has(log, "W0015", "--device auto:"));
    assert_true(harness_log_has(log, "W0015", "training on the CPU"));
    harness_tmp(log, sizeof log, "device-cuda.log");
    const char *cuda[] = {bin, "--standalone", "--device", "cuda", "--max-steps", "1", NULL};
    assert_int_not_equal(harness_wait(harness_spawn(cuda, log), 120000), 0);
    if (!harness_log_has(log, "no CUDA device on this machine", NULL) &&
        !harness_log_has(log, "this build has no CUDA backend", NULL)) {
        harness_dump_file(log);
        fail_msg("--device cuda without a GPU did not say so");
    }
}

/* Reads a whole file into a malloc'd buffer (*len bytes). */
static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n > 0);
    rewind(f);
    unsigned char *b = malloc((size_t)n);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* What --help promises of --compute-threads: 2 (a helper thread) and 1
 * with OpenBLAS on 1 thread train to the same bits. */
static void test_compute_threads_same_bits(void **state)
{
    (void)state;
    char model[2][320], log[320];
    const char *threads[2] = {"2", "1"};
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "threads-%s.safetensors", threads[i]);
        harness_tmp(model[i], sizeof model[i], name);
        snprintf(name, sizeof name, "threads-%s.log", threads[i]);
        harness_tmp(log, sizeof log, name);
        const char *argv[] = {
            getenv("PSWORKER_BIN"), "--standalone", "--device", "cpu",    "--max-steps", "60",
            "--compute-threads",    threads[i],     "--save",   model[i], NULL};
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
        int rc = harness_wait(harness_spawn(argv, log), 120000);
        unsetenv("OPENBLAS_NUM_THREADS");
        if (rc != 0)
            harness_dump_file(log);
        assert_int_equal(rc, 0);
    }
    size_t n0 = 0, n1 = 0;
    unsigned char *a = slurp(model[0], &n0), *b = slurp(model[1], &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(a, b, n0);
    free(a);
    free(b);
}

/* A worker beside its shard shares memory with it whatever the wire
 * dtype; with 16-bit values on the wire it says that shard takes f32
 * through the region (there is no wire to save), with f32 it has nothing
 * to say. */
static void test_wire_dtype_and_shared_memory_told(void **state)
{
    (void)state;
    struct psd_proc p;
    /* the second run's rank 0 takes the id once the first is silent 1 s */
    const char *args[] = {"--worker-timeout", "1", NULL};
    assert_int_equal(harness_psd_start(&p, args), 0);
    const char *dtypes[2] = {"f16", "f32"};
    for (int i = 0; i < 2; i++) {
        char log[320], name[32];
        snprintf(name, sizeof name, "wire-%s.log", dtypes[i]);
        harness_tmp(log, sizeof log, name);
        const char *argv[] = {
            getenv("PSWORKER_BIN"), "--servers", p.endpoint, "--wire-dtype", dtypes[i],
            "--max-steps",          "3",         "--device", "cpu",          NULL};
        int rc = harness_wait(harness_spawn(argv, log), 120000);
        if (rc != 0)
            harness_dump_file(log);
        assert_int_equal(rc, 0);
        int f16 = i == 0;
        assert_int_equal(harness_log_has(log, "W0022", "the 1 shard(s) sharing memory"), f16);
        assert_int_equal(harness_log_has(log, "W0008", "move without sockets"), 1);
    }
    assert_int_equal(harness_psd_stop(&p), 0);
}

/* Progress counts to --max-steps, not to the end of the epoch: 30 steps
 * logged every 10 end at 30/30 in epoch 1/1, each line once. */
static void test_progress_counts_to_max_steps(void **state)
{
    (void)state;
    char log[320];
    harness_tmp(log, sizeof log, "progress.log");
    const char *argv[] = {getenv("PSWORKER_BIN"),
                          "--standalone",
                          "--max-steps",
                          "30",
                          "--log-every",
                          "10",
                          "--device",
                          "cpu",
                          NULL};
    assert_int_equal(harness_wait(harness_spawn(argv, log), 120000), 0);
    assert_int_equal(harness_log_count(log, "W0200", NULL), 3);
    assert_true(harness_log_has(log, "W0200", "epoch 1/1 step 30/30"));
    assert_true(harness_log_has(log, "W0200", "epoch 1/1 step 10/30"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optimizer_choices),
        cmocka_unit_test(test_progress_counts_to_max_steps),
        cmocka_unit_test(test_wire_dtype_and_shared_memory_told),
        cmocka_unit_test(test_compute_threads_same_bits),
        cmocka_unit_test(test_device_choice_is_told),
        cmocka_unit_test(test_unanswered_servers_are_named),
        cmocka_unit_test(test_bsp_two_workers_match_one_with_double_batch),
        cmocka_unit_test(test_one_worker_equals_standalone),
        cmocka_unit_test(test_asp_shared_memory_equals_frames),
        cmocka_unit_test(test_shared_memory_requests_go_in_batches),
        cmocka_unit_test(test_accumulation_matches_bigger_batch),
        cmocka_unit_test(test_prune_keeps_zeros_and_shrinks_pulls),
        cmocka_unit_test(test_topk_sends_little_and_matches_standalone),
        cmocka_unit_test(test_ssp_bounds_staleness),
        cmocka_unit_test(test_asp_never_waits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
