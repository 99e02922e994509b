/* Checkpoints of a real psd: stopped with SIGTERM and started again on the
 * same directory (and port), a shard has the same weights, optimizer state
 * and clock, and still knows which pushes it applied (a re-sent push is a
 * duplicate). Training on from there gives bit for bit what a shard that
 * never stopped gives. A corrupted newest checkpoint is named in the log
 * and the one before it is restored. A client re-sends to a restarted
 * shard what it lost, in frames where the shard lost the shared region,
 * and hands the region over again. */
#define _GNU_SOURCE /* memmem */
#include "harness.h"
#include "psclient.h"
#include "raw.h"

#include "ps_clock.h"
#include "ps_err.h"

#include <dirent.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zmq.h>

#include <cmocka.h>

#define N 1000

static char dir[320];

static void start(struct psd_proc *p, const char *listen, int ckpt)
{
    const char *args[12] = {"--consistency", "bsp", "--workers", "1"};
    int n = 4;
    if (ckpt) {
        args[n++] = "--checkpoint-dir";
        args[n++] = dir;
        args[n++] = "--checkpoint-every";
        args[n++] = "0";
    }
    if (listen) {
        args[n++] = "--listen";
        args[n++] = listen;
    }
    assert_int_equal(harness_psd_start(p, args), 0);
}

static void hello_and_create(void *s, uint64_t session)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_HELLO);
    h.session = session;
    ps__header__free_unpacked(raw_exchange(s, &h, NULL, 0, NULL, 0), NULL);
    Ps__TableSpec sp;
    ps__table_spec__init(&sp);
    sp.name = "t";
    sp.size = N;
    sp.optimizer = PS__OPTIMIZER_KIND__OPT_MOMENTUM;
    sp.lr = 0.1f;
    sp.momentum = 0.9f;
    sp.init = PS__INIT_KIND__INIT_UNIFORM;
    sp.init_scale = 0.5f;
    sp.seed = 3;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &sp;
    ps__header__free_unpacked(raw_exchange(s, &h, NULL, 0, NULL, 0), NULL);
}

/* push-pull of clock k with request id id; the weights of clock k+1. */
static int push_pull(void *s, uint64_t id, uint64_t k, float *w)
{
    float g[N];
    for (int i = 0; i < N; i++)
        g[i] = (float)((i * 7 + (int)k * 13) % 19) * 0.01f - 0.09f;
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_PUSH_PULL);
    h.request_id = id;
    h.clock = k;
    h.count = N;
    Ps__Header *r = raw_exchange(s, &h, g, sizeof g, w, N * sizeof(float));
    int dup = r->duplicate;
    ps__header__free_unpacked(r, NULL);
    return dup;
}

static void pull(void *s, uint64_t clock, float *w)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_PULL);
    h.clock = clock;
    h.count = N;
    ps__header__free_unpacked(raw_exchange(s, &h, NULL, 0, w, N * sizeof(float)), NULL);
}

static int files(void)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        n += strstr(e->d_name, ".safetensors") != NULL && strstr(e->d_name, ".tmp") == NULL;
    if (d)
        closedir(d);
    return n;
}

static void test_restart_restores_and_skips_corrupt(void **state)
{
    (void)state;
    harness_tmp(dir, sizeof dir, "ckpt");
    mkdir(dir, 0755);
    void *ctx = zmq_ctx_new();
    static float w5[N], w5b[N], w6[N], w6ctl[N], w[N];

    struct psd_proc a;
    start(&a, NULL, 1);
    char listen[256];
    snprintf(listen, sizeof listen, "%s", a.endpoint);
    void *s = raw_dealer(ctx, a.endpoint);
    hello_and_create(s, 9);
    for (uint64_t k = 0; k < 5; k++)
        assert_false(push_pull(s, 100 + k, k, w5));
    assert_int_equal(harness_psd_stop(&a), 0);
    assert_int_equal(files(), 1);

    struct psd_proc b; /* same directory, same port: the socket reconnects */
    start(&b, listen, 1);
    assert_true(harness_log_has(b.log_path, "S0610", NULL));
    assert_true(push_pull(s, 104, 4, w)); /* re-sent: a duplicate, not applied */
    pull(s, 5, w5b);
    assert_memory_equal(w5, w5b, sizeof w5);
    assert_false(push_pull(s, 105, 5, w6));
    assert_int_equal(harness_psd_stop(&b), 0);
    assert_int_equal(files(), 2);

    struct psd_proc c; /* control: never stopped */
    start(&c, NULL, 0);
    void *sc = raw_dealer(ctx, c.endpoint);
    hello_and_create(sc, 1);
    for (uint64_t k = 0; k < 6; k++)
        push_pull(sc, 1 + k, k, w6ctl);
    assert_memory_equal(w6, w6ctl, sizeof w6); /* momentum state came back exactly */
    zmq_close(sc);
    assert_int_equal(harness_psd_stop(&c), 0);

    /* corrupt the newest (clock 6): the one before (clock 5) is restored */
    char newest[700] = "";
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (strstr(e->d_name, "0002.safetensors") != NULL)
            snprintf(newest, sizeof newest, "%s/%s", dir, e->d_name);
    closedir(d);
    FILE *f = fopen(newest, "r+b");
    assert_non_null(f);
    fseek(f, -7, SEEK_END);
    int ch = fgetc(f);
    fseek(f, -7, SEEK_END);
    fputc(ch ^ 0x40, f);
    fclose(f);
    struct psd_proc e2;
    start(&e2, NULL, 1);
    assert_true(harness_log_has(e2.log_path, "S0601", NULL));
    assert_true(harness_log_has(e2.log_path, "0002.safetensors", NULL));
    assert_true(harness_log_has(e2.log_path, "S0610", NULL));
    void *s2 = raw_dealer(ctx, e2.endpoint);
    hello_and_create(s2, 10); /* the same spec: found, not recreated */
    pull(s2, 5, w);
    assert_memory_equal(w5, w, sizeof w);
    zmq_close(s2);
    /* its own checkpoint at shutdown comes after the corrupt one, not over it */
    char third[700];
    snprintf(third, sizeof third, "%.*s3.safetensors", (int)(strlen(newest) - 13), newest);
    zmq_close(s);
    assert_int_equal(harness_psd_stop(&e2), 0);
    FILE *t3 = fopen(third, "rb");
    if (t3 == NULL)
        fail_msg("no checkpoint %s after the restore from an older one", third);
    fclose(t3);
    zmq_ctx_term(ctx);
}

/* A psd of the default (async) mode checkpointing into dir on SIGTERM
 * only, in a new directory `name` (NULL: the same one), on listen (NULL: a
 * free port). */
static void start_async(struct psd_proc *p, const char *name, const char *listen)
{
    if (name != NULL) {
        harness_tmp(dir, sizeof dir, name);
        mkdir(dir, 0755);
    }
    const char *args[] = {"--checkpoint-dir",
                          dir,
                          "--checkpoint-every",
                          "0",
                          listen ? "--listen" : NULL,
                          listen,
                          NULL};
    assert_int_equal(harness_psd_start(p, args), 0);
}

static char first_ep[256]; /* where start_and_connect's psd listens */

/* start_async's first psd in directory `name`, and a client of it with
 * cfg's other settings. */
static struct psc_client *start_and_connect(struct psd_proc *p, const char *name,
                                            struct psc_config cfg)
{
    start_async(p, name, NULL);
    snprintf(first_ep, sizeof first_ep, "%s", p->endpoint);
    static const char *eps[1] = {first_ep};
    cfg.struct_size = sizeof cfg;
    cfg.servers = eps;
    cfg.nservers = 1;
    cfg.connect_timeout_ms = 10000;
    struct psc_client *c = NULL;
    char err[256];
    if (psc_create(&cfg, &c, err, sizeof err) != 0)
        fail_msg("client: %s", err);
    return c;
}

/* A push lost with a server that died (frozen with SIGSTOP so the push is
 * stuck in its socket, then SIGKILLed) is re-sent by psc_wait to the
 * restarted server, which restored its checkpoint: applied exactly once.
 * PSD_TEST_RETRY_MS overrides the client's retry interval (0 shows the
 * test failing without re-sends). */
static void test_client_resends_to_restarted_server(void **state)
{
    (void)state;
    struct psd_proc a;
    const char *retry = getenv("PSD_TEST_RETRY_MS");
    struct psc_client *c = start_and_connect(
        &a, "ckpt-resend",
        (struct psc_config){.worker_id = 4, .retry_ms = retry ? atoi(retry) : 200});
    struct psc_table_spec spec;
    psc_table_spec_init(&spec, "r", 100);
    spec.lr = 1.0f;
    uint32_t t;
    assert_int_equal(psc_table_create(c, &spec, 10000, &t), 0);
    float g[100], w[100];
    for (int i = 0; i < 100; i++)
        g[i] = 1.0f;
    uint64_t tk;
    assert_int_equal(psc_push(c, t, 0, 100, g, 0, &tk), 0);
    assert_int_equal(psc_wait(c, tk, 10000), 0);
    assert_int_equal(harness_psd_stop(&a), 0); /* checkpoint: w = -1 */

    struct psd_proc b;
    start_async(&b, NULL, first_ep);
    assert_int_equal(psc_pull(c, t, 0, 100, w, 0, &tk), 0); /* reconnected, restored */
    assert_int_equal(psc_wait(c, tk, 10000), 0);
    assert_true(w[0] == -1.0f);
    kill(b.pid, SIGSTOP);
    assert_int_equal(psc_push(c, t, 0, 100, g, 1, &tk), 0); /* stuck with the frozen server */
    kill(b.pid, SIGKILL);
    assert_true(harness_wait(b.pid, 10000) >= 0);
    b.pid = 0;
    struct psd_proc e;
    start_async(&e, NULL, first_ep); /* restores w = -1 again */
    int rc = psc_wait(c, tk, 20000);
    if (rc != 0)
        fail_msg("the lost push was not re-sent: %s", psc_last_error(c));
    assert_int_equal(psc_pull(c, t, 0, 100, w, 1, &tk), 0);
    assert_int_equal(psc_wait(c, tk, 10000), 0);
    assert_true(w[0] == -2.0f); /* applied once */
    psc_destroy(c);
    assert_int_equal(harness_psd_stop(&e), 0);
}

/* Copies of one shared-memory push-pull queue up while its shard is down
 * (the first try and the client's re-sends). The restarted shard has no
 * region and refuses each copy (PS_ESHM): the first refusal sends the
 * request again in frames, and the later ones, answers to copies already
 * replaced, are dropped, not taken as the request's answer. The push is
 * applied once, and the region is handed over again and used. */
static void test_shared_memory_copies_to_restarted_server(void **state)
{
    (void)state;
    struct psd_proc a;
    struct psc_client *c = start_and_connect(
        &a, "ckpt-shm",
        (struct psc_config){.worker_id = 5, .retry_ms = 100, .local_ipc = 1, .shm_bytes = 1 << 20});
    assert_int_equal(psc_shm_shards(c), 1);
    struct psc_table_spec spec;
    psc_table_spec_init(&spec, "m", 100);
    spec.lr = 1.0f;
    uint32_t t;
    assert_int_equal(psc_table_create(c, &spec, 10000, &t), 0);
    float *g = psc_shm_alloc(c, 100 * sizeof(float)), *w = psc_shm_alloc(c, 100 * sizeof(float));
    assert_non_null(g);
    assert_non_null(w);
    for (int i = 0; i < 100; i++)
        g[i] = 1.0f;
    uint64_t tk;
    assert_int_equal(psc_push_pull(c, t, 0, 100, g, w, 0, &tk), 0);
    assert_int_equal(psc_wait(c, tk, 10000), 0);
    assert_true(w[0] == -1.0f);
    assert_int_equal(harness_psd_stop(&a), 0); /* checkpoint: w = -1 */

    uint64_t resends = psc_resends(c);
    assert_int_equal(psc_push_pull(c, t, 0, 100, g, w, 1, &tk), 0);
    /* no shard: the try and its re-sends (100, 300, 700 ms in) queue up;
     * three re-sends leave at least two copies even if zmq lost the first
     * with the old connection */
    int64_t until = ps_mono_ms() + 10000;
    while (psc_resends(c) < resends + 3 && ps_mono_ms() < until)
        assert_int_equal(psc_wait(c, tk, 50), PS_ETIMEDOUT);
    assert_true(psc_resends(c) >= resends + 3);
    struct psd_proc b;
    start_async(&b, NULL, first_ep);
    int rc = psc_wait(c, tk, 10000);
    if (rc != 0)
        fail_msg("the push-pull failed: %s", psc_last_error(c));
    for (int i = 0; i < 100; i++)
        assert_true(w[i] == -2.0f); /* applied once */
    struct psc_shard_stats st = {.struct_size = sizeof st};
    assert_int_equal(psc_stats(c, 0, 10000, &st), 0);
    if (st.errors < 2)
        fail_msg("only %llu refusal(s): the copies did not queue up",
                 (unsigned long long)st.errors);
    assert_int_equal(psc_shm_shards(c), 1); /* handed over again */
    uint64_t sent0, sent1, got;
    psc_shm_bytes(c, &sent0, &got);
    assert_int_equal(psc_push_pull(c, t, 0, 100, g, w, 2, &tk), 0);
    assert_int_equal(psc_wait(c, tk, 10000), 0);
    assert_true(w[99] == -3.0f);
    psc_shm_bytes(c, &sent1, &got);
    assert_int_equal(sent1, sent0 + 400);
    psc_destroy(c);
    assert_int_equal(harness_psd_stop(&b), 0);
}

/* A checkpoint directory written by another --shards does not restore
 * here: psd refuses to start, naming what the directory holds, rather
 * than serve empty tables; --start-empty starts it empty on purpose. */
static void test_other_shard_count_is_refused(void **state)
{
    (void)state;
    char other[320], log[320];
    harness_tmp(other, sizeof other, "ckpt-two-shards");
    mkdir(other, 0755);
    struct psd_proc a;
    const char *two[] = {
        "--shard", "0", "--shards", "2", "--checkpoint-dir", other, "--checkpoint-every",
        "0",       NULL};
    assert_int_equal(harness_psd_start(&a, two), 0);
    void *ctx = zmq_ctx_new();
    void *s = raw_dealer(ctx, a.endpoint);
    hello_and_create(s, 3);
    zmq_close(s);
    zmq_ctx_term(ctx);
    assert_int_equal(harness_psd_stop(&a), 0); /* writes its checkpoint */

    harness_tmp(log, sizeof log, "one-shard.log");
    const char *one[] = {getenv("PSD_BIN"),
                         "--listen",
                         "tcp://127.0.0.1:0",
                         "--shards",
                         "1",
                         "--checkpoint-dir",
                         other,
                         NULL};
    assert_int_equal(harness_wait(harness_spawn(one, log), 20000), 2);
    if (!harness_log_has(log, "S0612", "(shard 0 of 2) but none restores into shard 0 of 1")) {
        harness_dump_file(log);
        fail_msg("psd did not name the checkpoints it would not restore");
    }
    struct psd_proc b;
    const char *empty[] = {"--shards", "1", "--checkpoint-dir", other, "--start-empty", NULL};
    assert_int_equal(harness_psd_start(&b, empty), 0);
    assert_true(harness_log_has(b.log_path, "S0611", "--start-empty"));
    assert_int_equal(harness_psd_stop(&b), 0);
}

/* The only checkpoint of a directory, its JSON state damaged (one digit
 * of the learning rate): the checksum refuses it, so psd refuses to start
 * rather than restore a wrong rate. A good one whose table is over this
 * psd's --max-table-bytes is refused before it is allocated. */
static void test_damaged_state_and_big_table_refused(void **state)
{
    (void)state;
    char d[320], log[320], path[700];
    harness_tmp(d, sizeof d, "ckpt-damaged");
    mkdir(d, 0755);
    struct psd_proc a;
    const char *w[] = {"--checkpoint-dir", d, "--checkpoint-every", "0", NULL};
    assert_int_equal(harness_psd_start(&a, w), 0);
    void *ctx = zmq_ctx_new();
    void *s = raw_dealer(ctx, a.endpoint);
    hello_and_create(s, 5);
    zmq_close(s);
    zmq_ctx_term(ctx);
    assert_int_equal(harness_psd_stop(&a), 0);
    snprintf(path, sizeof path, "%s/shard-0-of-1-%016d.safetensors", d, 1);

    /* over the limit: the table "t" of 1000 floats and its state */
    harness_tmp(log, sizeof log, "small-limit.log");
    const char *small[] = {getenv("PSD_BIN"),
                           "--listen",
                           "tcp://127.0.0.1:0",
                           "--checkpoint-dir",
                           d,
                           "--max-table-bytes",
                           "4096",
                           NULL};
    assert_int_equal(harness_wait(harness_spawn(small, log), 20000), 2);
    assert_true(harness_log_has(log, "S0601", "over psd --max-table-bytes 4096"));

    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    char *lr = memmem(buf, n, "\\\"lr\\\":", 7); /* the state is JSON inside a string */
    assert_non_null(lr);
    char *digit = lr + 7;
    while (*digit < '1' || *digit > '8')
        digit++;
    (*digit)++; /* same length: only the checksum can tell */
    assert_int_equal(fseek(f, 0, SEEK_SET), 0);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    harness_tmp(log, sizeof log, "damaged.log");
    const char *again[] = {getenv("PSD_BIN"),  "--listen", "tcp://127.0.0.1:0",
                           "--checkpoint-dir", d,          NULL};
    assert_int_equal(harness_wait(harness_spawn(again, log), 20000), 2);
    if (!harness_log_has(log, "S0601", "checksum of the tensors and state") ||
        !harness_log_has(log, "S0612", NULL)) {
        harness_dump_file(log);
        fail_msg("the damaged state was not refused by its checksum");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restart_restores_and_skips_corrupt),
        cmocka_unit_test(test_other_shard_count_is_refused),
        cmocka_unit_test(test_damaged_state_and_big_table_refused),
        cmocka_unit_test(test_client_resends_to_restarted_server),
        cmocka_unit_test(test_shared_memory_copies_to_restarted_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
