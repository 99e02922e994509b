/* Sparse logistic regression through real shards on generated click data:
 * the held-out log-loss comes within 2% of the ground-truth model's, and
 * each step pulls only the rows of the keys its mini-batch touched. */
#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define TIMEOUT_MS 300000
#define FEATURES   3000

static double json_number(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        fail_msg("no file %s", path);
    char buf[2048] = {0}, pat[64];
    assert_true(fread(buf, 1, sizeof buf - 1, f) > 0);
    fclose(f);
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *k = strstr(buf, pat);
    if (k == NULL)
        fail_msg("%s has no %s", path, key);
    return strtod(k + strlen(pat), NULL);
}

static void run(const char *const *argv, const char *log)
{
    int rc = harness_wait(harness_spawn(argv, log), TIMEOUT_MS);
    if (rc != 0) {
        harness_dump_file(log);
        fail_msg("%s exited with %d", argv[0], rc);
    }
}

static void test_sparse_lr_reaches_the_known_optimum(void **state)
{
    (void)state;
    char dir[320], log[320], truth[400], sum[2][320];
    harness_tmp(dir, sizeof dir, "");
    harness_tmp(log, sizeof log, "gen.log");
    const char *gen[] = {getenv("GEN_CLICKS_BIN"),
                         "--out",
                         dir,
                         "--train",
                         "400000",
                         "--test",
                         "20000",
                         "--features",
                         "3000",
                         "--active",
                         "8",
                         "--seed",
                         "3",
                         NULL};
    assert_non_null(gen[0]);
    run(gen, log);
    snprintf(truth, sizeof truth, "%s/truth.json", dir);
    struct psd_proc p[2];
    char servers[600];
    for (int i = 0; i < 2; i++) {
        const char *args[] = {"--shard", i ? "1" : "0", "--shards", "2", "--workers", "2", NULL};
        assert_int_equal(harness_psd_start(&p[i], args), 0);
    }
    snprintf(servers, sizeof servers, "%s,%s", p[0].endpoint, p[1].endpoint);
    pid_t w[2];
    char logs[2][320];
    for (int r = 0; r < 2; r++) {
        harness_tmp(sum[r], sizeof sum[r], r ? "s1.json" : "s0.json");
        harness_tmp(logs[r], sizeof logs[r], r ? "w1.log" : "w0.log");
        const char *argv[] = {getenv("PSWORKER_BIN"),
                              "--model",
                              "sparse-lr",
                              "--data",
                              dir,
                              "--servers",
                              servers,
                              "--rank",
                              r ? "1" : "0",
                              "--workers",
                              "2",
                              "--optimizer",
                              "adagrad",
                              "--lr",
                              "0.2",
                              "--batch",
                              "256",
                              "--epochs",
                              "3",
                              "--summary-json",
                              sum[r],
                              NULL};
        w[r] = harness_spawn(argv, logs[r]);
    }
    for (int r = 0; r < 2; r++) {
        int rc = harness_wait(w[r], TIMEOUT_MS);
        if (rc != 0) {
            harness_dump_file(logs[r]);
            fail_msg("worker %d exited with %d", r, rc);
        }
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(harness_psd_stop(&p[i]), 0);
    double best = json_number(truth, "test_logloss");
    double got = json_number(sum[0], "test_logloss");
    double rows = json_number(sum[0], "rows_pulled_per_step");
    printf("  held-out log-loss %.5f vs the true model's %.5f (%+.2f%%); %.0f of %d rows "
           "pulled per step\n",
           got, best, 100 * (got - best) / best, rows, FEATURES);
    assert_true(got < best * 1.02);
    assert_true(got > best * 0.9);                /* a learner cannot beat the truth by much */
    assert_true(rows > 0 && rows < FEATURES / 2); /* only the keys it touched */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sparse_lr_reaches_the_known_optimum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
