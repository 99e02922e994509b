/* psctl against a running 2-shard cluster after a short training run:
 * status shows every shard, worker and table (tables and --json); export
 * writes one safetensors file whose tensors hold what the shards hold
 * (sparse tables gathered by key from every shard);
 * checkpoint makes each shard write one; with a shard down, status names
 * it and exits 1. */
#include "harness.h"
#include "psclient.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_limits.h"

#include <jansson.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

struct cluster {
    struct psd_proc p[2];
    char servers[600];
};

/* Runs psctl with the cluster's servers and args; its output goes to out
 * (a path). Returns its exit status. */
static int psctl(const struct cluster *k, const char *out, const char *const *args)
{
    const char *argv[16] = {getenv("PSCTL_BIN"), "--servers", k->servers, "--timeout-ms", "1000"};
    size_t n = 5;
    while (*args != NULL && n < 15)
        argv[n++] = *args++;
    argv[n] = NULL;
    pid_t pid = harness_spawn(argv, out);
    assert_true(pid > 0);
    return harness_wait(pid, 60000);
}

static void start(struct cluster *k)
{
    static int runs;
    char dir[320], name[32];
    snprintf(name, sizeof name, "ckpt%d", runs++); /* each cluster starts empty */
    harness_tmp(dir, sizeof dir, name);
    mkdir(dir, 0755);
    for (int i = 0; i < 2; i++) {
        const char *args[] = {"--shard",
                              i ? "1" : "0",
                              "--shards",
                              "2",
                              "--workers",
                              "1",
                              "--consistency",
                              "bsp",
                              "--checkpoint-dir",
                              dir,
                              "--checkpoint-every",
                              "0",
                              NULL};
        assert_int_equal(harness_psd_start(&k->p[i], args), 0);
    }
    snprintf(k->servers, sizeof k->servers, "%s,%s", k->p[0].endpoint, k->p[1].endpoint);
    char log[320];
    harness_tmp(log, sizeof log, "worker.log");
    const char *argv[] = {getenv("PSWORKER_BIN"), "--servers", k->servers, "--layers", "784,16,10",
                          "--max-steps",          "30",        "--device", "cpu",      NULL};
    pid_t w = harness_spawn(argv, log);
    int rc = harness_wait(w, 120000);
    if (rc != 0)
        harness_dump_file(log);
    assert_int_equal(rc, 0);
}

/* A client of the cluster that is no worker (it reads, creates tables). */
static struct psc_client *observer(const struct cluster *k)
{
    const char *eps[2] = {k->p[0].endpoint, k->p[1].endpoint};
    struct psc_config cfg = {.struct_size = sizeof cfg,
                             .servers = eps,
                             .nservers = 2,
                             .worker_id = PSC_OBSERVER,
                             .connect_timeout_ms = 10000};
    struct psc_client *c = NULL;
    char err[256];
    if (psc_create(&cfg, &c, err, sizeof err) != 0)
        fail_msg("client: %s", err);
    return c;
}

static json_t *load_json(const char *path)
{
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (j == NULL) {
        harness_dump_file(path);
        fail_msg("%s: %s", path, e.text);
    }
    return j;
}

/* Reads tensor `name` of safetensors file path into out (exactly `bytes`,
 * dtype as given); shape gets its dimensions (0 past its rank). Returns
 * its rank. */
static int read_tensor(const char *path, const char *name, const char *dtype, void *out,
                       size_t bytes, uint64_t shape[2])
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char len8[8];
    assert_int_equal(fread(len8, 1, 8, f), 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | len8[i];
    char *hdr = calloc(1, hlen + 1);
    assert_int_equal(fread(hdr, 1, hlen, f), hlen);
    json_error_t e;
    json_t *j = json_loads(hdr, 0, &e);
    assert_non_null(j);
    json_t *t = json_object_get(j, name);
    if (t == NULL)
        fail_msg("%s has no tensor '%s': %s", path, name, hdr);
    assert_string_equal(json_string_value(json_object_get(t, "dtype")), dtype);
    json_t *sh = json_object_get(t, "shape");
    int rank = (int)json_array_size(sh);
    assert_true(rank >= 1 && rank <= 2);
    for (int i = 0; i < 2; i++)
        shape[i] = i < rank ? (uint64_t)json_integer_value(json_array_get(sh, (size_t)i)) : 0;
    json_t *offs = json_object_get(t, "data_offsets");
    long a = (long)json_integer_value(json_array_get(offs, 0));
    long b = (long)json_integer_value(json_array_get(offs, 1));
    assert_int_equal((size_t)(b - a), bytes);
    assert_int_equal(fseek(f, (long)(8 + hlen) + a, SEEK_SET), 0);
    assert_int_equal(fread(out, 1, bytes, f), bytes);
    fclose(f);
    free(hdr);
    json_decref(j);
    return rank;
}

static void test_status_export_checkpoint(void **state)
{
    (void)state;
    struct cluster k;
    start(&k);
    char out[320];
    harness_tmp(out, sizeof out, "status.txt");
    const char *status[] = {"status", NULL};
    assert_int_equal(psctl(&k, out, status), 0);
    assert_true(harness_log_has(out, "shard 0", k.p[0].endpoint));
    assert_true(harness_log_has(out, "shard 1", k.p[1].endpoint));
    assert_true(harness_log_has(out, "workers   1 of 1 live", NULL));
    assert_true(harness_log_has(out, "fc1.weight", "[0, 6272)"));
    assert_true(harness_log_has(out, "fc2.bias", "[5, 10)"));

    harness_tmp(out, sizeof out, "status.json");
    const char *sj[] = {"--json", "status", NULL};
    assert_int_equal(psctl(&k, out, sj), 0);
    json_t *j = load_json(out);
    json_t *shards = json_object_get(j, "shards");
    assert_int_equal(json_array_size(shards), 2);
    for (size_t s = 0; s < 2; s++) {
        json_t *o = json_array_get(shards, s);
        assert_true(json_is_true(json_object_get(o, "up")));
        assert_int_equal(json_integer_value(json_object_get(o, "live_workers")), 1);
        assert_int_equal(json_array_size(json_object_get(o, "tables")), 4);
        json_t *clocks = json_object_get(o, "worker_clocks");
        assert_int_equal(json_integer_value(json_array_get(clocks, 0)), 30);
    }
    json_decref(j);

    /* export: the file's fc2.bias is what the shards hold */
    char st[320];
    harness_tmp(st, sizeof st, "model.safetensors");
    harness_tmp(out, sizeof out, "export.txt");
    const char *ex[] = {"export", "--format", "safetensors", st, NULL};
    assert_int_equal(psctl(&k, out, ex), 0);
    float file_bias[10];
    uint64_t shape[2];
    assert_int_equal(read_tensor(st, "fc2.bias", "F32", file_bias, sizeof file_bias, shape), 1);
    assert_int_equal(shape[0], 10);
    struct psc_client *c = observer(&k);
    uint32_t t;
    uint64_t ticket;
    float live[10];
    assert_int_equal(psc_table_open(c, "fc2.bias", 10000, &t), 0);
    assert_int_equal(psc_pull(c, t, 0, 10, live, 0, &ticket), 0);
    assert_int_equal(psc_wait(c, ticket, 10000), 0);
    psc_destroy(c);
    assert_memory_equal(file_bias, live, sizeof live);
    int nonzero = 0;
    for (int i = 0; i < 10; i++)
        nonzero += live[i] != 0.0f; /* trained: the biases moved from 0 */
    assert_true(nonzero > 0);

    harness_tmp(out, sizeof out, "checkpoint.txt");
    const char *ck[] = {"checkpoint", NULL};
    assert_int_equal(psctl(&k, out, ck), 0);
    assert_true(harness_log_has(out, "shard 0: ", "shard-0-of-2-"));
    assert_true(harness_log_has(out, "shard 1: ", "shard-1-of-2-"));
    /* past the limit (asked again at once): the newest file stands; at it
     * (a second after that one): a new file */
    c = observer(&k);
    char first[PS_ERROR_TEXT_MAX], again[PS_ERROR_TEXT_MAX];
    long long t0 = ps_mono_ms();
    assert_int_equal(psc_checkpoint(c, 0, 10000, first, sizeof first), 0);
    if (strstr(first, "stands") == NULL) { /* starved past the limit: asked at once now */
        t0 = ps_mono_ms();
        assert_int_equal(psc_checkpoint(c, 0, 10000, first, sizeof first), 0);
    }
    assert_non_null(strstr(first, "ms ago, stands (at most one asked-for checkpoint every 1000"));
    long long deadline = t0 + 10000;
    do {
        harness_pause_ms(50);
        assert_int_equal(psc_checkpoint(c, 0, 10000, again, sizeof again), 0);
    } while (strstr(again, "stands") != NULL && ps_mono_ms() < deadline);
    printf("  asked again at once: %s\n  a new file after %lld ms: %s\n", first, ps_mono_ms() - t0,
           again);
    assert_null(strstr(again, "stands"));
    assert_true(strstr(again, "shard-0-of-2-") != NULL);
    assert_true(strncmp(first, again, strlen(again)) != 0); /* another file */
    /* not before the limit: the first answer said how long ago the file
     * that stood was written, and the new one came at least the limit after
     * it (2 ms for the two clocks' rounding) */
    unsigned long long age = 0;
    const char *w = strstr(first, "written ");
    assert_non_null(w);
    assert_int_equal(sscanf(w, "written %llu ms ago", &age), 1);
    assert_true(ps_mono_ms() - t0 + (long long)age >= (long long)PS_CHECKPOINT_ASK_MIN_MS - 2);
    psc_destroy(c);

    /* one shard down: named, exit 1 */
    kill(k.p[1].pid, SIGKILL);
    assert_true(harness_wait(k.p[1].pid, 10000) >= 0);
    k.p[1].pid = 0;
    harness_tmp(out, sizeof out, "status-down.txt");
    int64_t t1 = ps_mono_ms();
    assert_int_equal(psctl(&k, out, status), 1);
    fprintf(stderr, "status with a shard down took %lld ms (--timeout-ms 1000)\n",
            (long long)(ps_mono_ms() - t1)); /* told, not checked: a slow machine is no fault */
    assert_true(harness_log_has(out, "shard 1", "UNREACHABLE"));
    /* the hello had 3/4 of the time; the shard is not asked again */
    assert_true(harness_log_has(out, "no answer to hello within 750 ms (--timeout-ms 1000)", NULL));
    assert_true(harness_log_has(out, "shard 0", "bsp"));
    harness_tmp(out, sizeof out, "status-down.json");
    assert_int_equal(psctl(&k, out, sj), 1);
    j = load_json(out);
    assert_int_equal(json_integer_value(json_object_get(j, "unreachable")), 1);
    json_decref(j);
    assert_int_equal(harness_psd_stop(&k.p[0]), 0);
}

#define NKEYS 300
#define DIM   3

/* A sparse table's rows, spread over both shards by key: psc_rows pages
 * each shard's rows (in pages of 7 here), and export gathers them into
 * NAME [rows, dim] and NAME.keys [rows], sorted by key, equal to what the
 * shards hold. Rows of a dense table, or past the end, are refused. */
static void test_export_sparse(void **state)
{
    (void)state;
    struct cluster k;
    start(&k);
    struct psc_client *c = observer(&k);
    struct psc_table_spec sp;
    psc_table_spec_init(&sp, "emb", 0);
    sp.sparse = 1;
    sp.dim = DIM;
    sp.rows_max = 10000;
    sp.init = PSC_INIT_UNIFORM;
    sp.init_scale = 0.5f;
    sp.seed = 9;
    uint32_t t;
    assert_int_equal(psc_table_create(c, &sp, 10000, &t), 0);
    { /* no rows yet: an empty page, not an error */
        uint64_t pk[7], got = 1, total = 1;
        float pv[7 * DIM];
        assert_int_equal(psc_rows(c, t, 0, 0, 7, pk, pv, &got, &total, 10000), 0);
        assert_int_equal(got, 0);
        assert_int_equal(total, 0);
    }
    static uint64_t keys[NKEYS];
    static float rows[NKEYS * DIM];
    for (int i = 0; i < NKEYS; i++) /* increasing, spread wide */
        keys[i] = (uint64_t)i * 2654435761u + 17;
    uint64_t ticket;
    assert_int_equal(psc_pull_rows(c, t, keys, NKEYS, rows, 0, &ticket), 0); /* creates them */
    assert_int_equal(psc_wait(c, ticket, 10000), 0);

    /* paged by hand: every key once, on one shard, with its row */
    uint64_t seen = 0, per_shard[2] = {0, 0};
    for (uint32_t s = 0; s < 2; s++) {
        uint64_t off = 0, total = 1, got;
        uint64_t pk[7];
        float pv[7 * DIM];
        while (off < total) {
            assert_int_equal(psc_rows(c, t, s, off, 7, pk, pv, &got, &total, 10000), 0);
            assert_true(got > 0 && got <= 7);
            for (uint64_t i = 0; i < got; i++) {
                int at = -1;
                for (int j = 0; j < NKEYS && at < 0; j++)
                    at = keys[j] == pk[i] ? j : -1;
                assert_true(at >= 0);
                assert_memory_equal(pv + i * DIM, rows + at * DIM, DIM * sizeof(float));
            }
            off += got;
            seen += got;
        }
        per_shard[s] = total;
        uint64_t tot2 = 0;
        assert_int_equal(psc_rows(c, t, s, total + 1, 7, pk, pv, &got, &tot2, 10000), PS_EREMOTE);
        assert_non_null(strstr(psc_last_error(c), "past the"));
    }
    assert_int_equal(seen, NKEYS);
    assert_true(per_shard[0] > 0 && per_shard[1] > 0); /* both shards hold some */
    uint32_t dense;
    assert_int_equal(psc_table_open(c, "fc2.bias", 10000, &dense), 0);
    uint64_t pk[1], got, total;
    float pv[DIM];
    assert_int_equal(psc_rows(c, dense, 0, 0, 1, pk, pv, &got, &total, 10000), PS_ENOTABLE);
    psc_destroy(c);

    char st[320], out[320];
    harness_tmp(st, sizeof st, "sparse.safetensors");
    harness_tmp(out, sizeof out, "export-sparse.txt");
    const char *ex[] = {"--json", "export", st, NULL};
    assert_int_equal(psctl(&k, out, ex), 0);
    json_error_t e;
    json_t *j = json_load_file(out, 0, &e);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(j, "tables")), 5);
    assert_int_equal(json_integer_value(json_object_get(j, "sparse")), 1);
    json_decref(j);
    static uint64_t fkeys[NKEYS];
    static float frows[NKEYS * DIM];
    uint64_t shape[2];
    assert_int_equal(read_tensor(st, "emb.keys", "U64", fkeys, sizeof fkeys, shape), 1);
    assert_int_equal(shape[0], NKEYS);
    assert_int_equal(read_tensor(st, "emb", "F32", frows, sizeof frows, shape), 2);
    assert_int_equal(shape[0], NKEYS);
    assert_int_equal(shape[1], DIM);
    assert_memory_equal(fkeys, keys, sizeof keys); /* sorted like ours */
    assert_memory_equal(frows, rows, sizeof rows);
    for (int i = 0; i < 2; i++)
        assert_int_equal(harness_psd_stop(&k.p[i]), 0);
}

static void test_usage_errors(void **state)
{
    (void)state;
    struct cluster k;
    memset(&k, 0, sizeof k);
    snprintf(k.servers, sizeof k.servers, "tcp://127.0.0.1:1");
    char out[320];
    harness_tmp(out, sizeof out, "usage.txt");
    const char *bad[] = {"frobnicate", NULL};
    assert_int_equal(psctl(&k, out, bad), 2);
    assert_true(harness_log_has(out, "unknown command 'frobnicate'", NULL));
    const char *fmt[] = {"--format", "npz", "export", "x", NULL};
    assert_int_equal(psctl(&k, out, fmt), 2);
    assert_true(harness_log_has(out, "--format: 'npz'", NULL));
    const char *none[] = {NULL};
    assert_int_equal(psctl(&k, out, none), 2);
    assert_true(harness_log_has(out, "no command", NULL));
}

/* Ports no TCP endpoint can have are refused where endpoints are read:
 * psctl's --servers and psd's --listen, naming the port. */
static void test_impossible_ports_refused(void **state)
{
    (void)state;
    char log[320];
    harness_tmp(log, sizeof log, "port-psctl.log");
    const char *ctl[] = {getenv("PSCTL_BIN"), "--servers", "tcp://127.0.0.1:99999", "status", NULL};
    assert_int_equal(harness_wait(harness_spawn(ctl, log), 20000), 2);
    assert_true(harness_log_has(log, "port '99999' is not a number in 1..65535", NULL));
    harness_tmp(log, sizeof log, "port-psd.log");
    const char *psd[] = {getenv("PSD_BIN"), "--listen", "tcp://127.0.0.1:65536", NULL};
    assert_int_equal(harness_wait(harness_spawn(psd, log), 20000), 2);
    assert_true(harness_log_has(log, "--listen", "port '65536' is not a number in 0..65535"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_impossible_ports_refused),
        cmocka_unit_test(test_status_export_checkpoint),
        cmocka_unit_test(test_export_sparse),
        cmocka_unit_test(test_usage_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
