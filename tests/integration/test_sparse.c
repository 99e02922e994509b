/* Sparse models through real shards on generated click data: logistic
 * regression comes within 2% of the ground-truth model's held-out
 * log-loss, the embedding + MLP variant within 3% (its model class is not
 * the truth's), and each step pulls only the rows its mini-batch touched. */
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

static char dir[320], truth[400];

static int gen_data(void **state)
{
    (void)state;
    char log[320];
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
    if (gen[0] == NULL || harness_wait(harness_spawn(gen, log), TIMEOUT_MS) != 0) {
        harness_dump_file(log);
        return -1;
    }
    snprintf(truth, sizeof truth, "%s/truth.json", dir);
    return 0;
}

/* Trains on 2 shards with 2 workers; returns rank 0's summary path. */
static void train(const char *embed_dim, const char *opt, const char *lr, char *sum, size_t len)
{
    struct psd_proc p[2];
    char servers[600], sums[2][320], logs[2][320];
    for (int i = 0; i < 2; i++) {
        const char *args[] = {"--shard", i ? "1" : "0", "--shards", "2", "--workers", "2", NULL};
        assert_int_equal(harness_psd_start(&p[i], args), 0);
    }
    snprintf(servers, sizeof servers, "%s,%s", p[0].endpoint, p[1].endpoint);
    pid_t w[2];
    for (int r = 0; r < 2; r++) {
        harness_tmp(sums[r], sizeof sums[r], r ? "s1.json" : "s0.json");
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
                              opt,
                              "--lr",
                              lr,
                              "--batch",
                              "256",
                              "--epochs",
                              "3",
                              "--embed-dim",
                              embed_dim,
                              "--embed-hidden",
                              "32",
                              "--device",
                              "cpu",
                              "--summary-json",
                              sums[r],
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
    /* progress: the last step of each epoch, with the rate and what is left */
    assert_true(harness_log_has(logs[0], "W0220", "epoch 3/3 step 781/781"));
    assert_true(harness_log_has(logs[0], "W0220", "samples/s ETA 0s"));
    snprintf(sum, len, "%s", sums[0]);
}

static void check(const char *what, const char *sum, double within)
{
    double best = 0, got = 0, rows = 0;
    assert_int_equal(harness_json_number(truth, "test_logloss", &best), 0);
    assert_int_equal(harness_json_number(sum, "test_logloss", &got), 0);
    assert_int_equal(harness_json_number(sum, "rows_pulled_per_step", &rows), 0);
    printf("  %s: held-out log-loss %.5f vs the true model's %.5f (%+.2f%%); %.0f of %d rows "
           "pulled per step\n",
           what, got, best, 100 * (got - best) / best, rows, FEATURES);
    assert_true(got < best * (1 + within));
    assert_true(got > best * 0.9);                /* a learner cannot beat the truth by much */
    assert_true(rows > 0 && rows < FEATURES / 2); /* only the keys it touched */
}

static void test_sparse_lr_reaches_the_known_optimum(void **state)
{
    (void)state;
    char sum[320];
    train("0", "adagrad", "0.2", sum, sizeof sum);
    check("logistic regression", sum, 0.02);
}

static void test_embedding_mlp_learns(void **state)
{
    (void)state;
    char sum[320];
    train("8", "adagrad", "0.05", sum, sizeof sum);
    check("embedding 8 + MLP 32", sum, 0.03);
}

/* Row-wise Adagrad (one accumulator per row, the dense head on Adagrad):
 * the same model learns as well with a float of state a row instead of 8. */
static void test_rowwise_adagrad_learns(void **state)
{
    (void)state;
    char sum[320];
    train("8", "rowwise_adagrad", "0.05", sum, sizeof sum);
    check("embedding 8 + MLP 32, row-wise Adagrad", sum, 0.03);
}

/* gen_clicks explains itself, makes the folders it writes
 * into, and refuses more active features than there are. */
static void test_gen_clicks_cli(void **state)
{
    (void)state;
    char log[320], out[320], path[400];
    const char *bin = getenv("GEN_CLICKS_BIN");
    assert_non_null(bin);
    harness_tmp(log, sizeof log, "gen-help.log");
    const char *help[] = {bin, "--help", NULL};
    assert_int_equal(harness_wait(harness_spawn(help, log), TIMEOUT_MS), 0);
    assert_true(harness_log_has(log, "--out DIR", NULL));
    harness_tmp(out, sizeof out, "new/nested/dir");
    const char *gen[] = {bin, "--out", out, "--train", "10", "--test", "10", NULL};
    harness_tmp(log, sizeof log, "gen-nested.log");
    assert_int_equal(harness_wait(harness_spawn(gen, log), TIMEOUT_MS), 0);
    snprintf(path, sizeof path, "%s/truth.json", out);
    double loss = -1;
    assert_int_equal(harness_json_number(path, "test_logloss", &loss), 0);
    assert_true(loss > 0);
    const char *bad[] = {bin, "--out", out, "--features", "5", "--active", "6", NULL};
    harness_tmp(log, sizeof log, "gen-bad.log");
    assert_int_equal(harness_wait(harness_spawn(bad, log), TIMEOUT_MS), 2);
    assert_true(harness_log_has(log, "--active 6 is more than --features 5", NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rowwise_adagrad_learns),
        cmocka_unit_test(test_gen_clicks_cli),
        cmocka_unit_test(test_sparse_lr_reaches_the_known_optimum),
        cmocka_unit_test(test_embedding_mlp_learns),
    };
    return cmocka_run_group_tests(tests, gen_data, NULL);
}
