/* A shard killed with SIGKILL in the middle of a BSP training run and
 * started again on the same port: it restores its newest checkpoint, the
 * workers re-send what it lost, a table that restored an older clock
 * catches up with them, and the run completes with a test accuracy within
 * 1 point of the same run uninterrupted. The workers share memory with the
 * restarted shard again. */
#include "harness.h"

#include <math.h>
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

#define TIMEOUT_MS 600000

static void start_shard(struct psd_proc *p, int i, const char *dir, const char *listen)
{
    const char *args[18] = {"--shard",          i ? "1" : "0", "--shards",           "2",
                            "--consistency",    "bsp",         "--workers",          "2",
                            "--checkpoint-dir", dir,           "--checkpoint-every", "1",
                            "--log-level",      "debug"};
    if (listen != NULL) {
        args[14] = "--listen";
        args[15] = listen;
    }
    assert_int_equal(harness_psd_start(p, args), 0);
}

/* One training run; kill > 0 kills shard 1 once it has checkpointed.
 * Returns rank 0's test accuracy. */
static double run(const char *tag, int kill_shard)
{
    char d0[320], d1[320], name[64];
    snprintf(name, sizeof name, "%s-d0", tag);
    harness_tmp(d0, sizeof d0, name);
    snprintf(name, sizeof name, "%s-d1", tag);
    harness_tmp(d1, sizeof d1, name);
    mkdir(d0, 0755);
    mkdir(d1, 0755);
    struct psd_proc p[2];
    start_shard(&p[0], 0, d0, NULL);
    start_shard(&p[1], 1, d1, NULL);
    char servers[600], listen1[256];
    snprintf(servers, sizeof servers, "%s,%s", p[0].endpoint, p[1].endpoint);
    snprintf(listen1, sizeof listen1, "%s", p[1].endpoint);
    pid_t w[2];
    char sums[2][320], logs[2][320];
    for (int r = 0; r < 2; r++) {
        snprintf(name, sizeof name, "%s-s%d.json", tag, r);
        harness_tmp(sums[r], sizeof sums[r], name);
        snprintf(name, sizeof name, "%s-w%d.log", tag, r);
        harness_tmp(logs[r], sizeof logs[r], name);
        const char *argv[] = {getenv("PSWORKER_BIN"),
                              "--servers",
                              servers,
                              "--rank",
                              r ? "1" : "0",
                              "--workers",
                              "2",
                              "--layers",
                              "784,64,10",
                              "--max-steps",
                              "900",
                              "--epochs",
                              "2",
                              "--lr",
                              "0.04",
                              "--device",
                              "cpu",
                              "--retry-ms",
                              "300",
                              "--test-delay-ms",
                              "4",
                              "--summary-json",
                              sums[r],
                              NULL};
        w[r] = harness_spawn(argv, logs[r]);
    }
    if (kill_shard) {
        /* a checkpoint holding all 4 tables (784,64,10: 2 weights, 2 biases) */
        assert_true(harness_log_wait(p[1].log_path, "S0600", "interval, 4 tables", 120000));
        kill(p[1].pid, SIGKILL);
        assert_true(harness_wait(p[1].pid, 10000) >= 0);
        p[1].pid = 0;
        start_shard(&p[1], 1, d1, listen1);
        assert_true(harness_log_has(p[1].log_path, "S0610", NULL)); /* restored */
    }
    for (int r = 0; r < 2; r++) {
        int rc = harness_wait(w[r], TIMEOUT_MS);
        if (rc != 0) {
            harness_dump_file(logs[r]);
            harness_psd_dump_log(&p[1]);
            fail_msg("worker %d exited with %d", r, rc);
        }
    }
    /* the workers reached the shards on their same-host Unix sockets, so
     * the restarted shard was found again there */
    for (int r = 0; r < 2; r++)
        assert_true(harness_log_has(logs[r], "W0006", "using ipc://@psd/"));
    /* ...and handed their shared regions to it again (the restart lost them) */
    for (int r = 0; kill_shard && r < 2; r++)
        if (!harness_log_has(p[1].log_path, "S0301", r ? "worker 1 shares" : "worker 0 shares"))
            fail_msg("worker %d did not share memory with the restarted shard again", r);
    if (kill_shard)
        printf("  shard 1 after the restart: %s\n", harness_log_has(p[1].log_path, "S0620", NULL)
                                                        ? "caught up, rounds lost (S0620)"
                                                        : "no rounds lost");
    for (int i = 0; i < 2; i++)
        assert_int_equal(harness_psd_stop(&p[i]), 0);
    double acc = 0;
    assert_int_equal(harness_json_number(sums[0], "test_accuracy", &acc), 0);
    return acc;
}

static void test_killed_shard_recovers(void **state)
{
    (void)state;
    double clean = run("clean", 0);
    double killed = run("killed", 1);
    printf("  test accuracy: %.4f uninterrupted, %.4f with shard 1 killed and restarted\n", clean,
           killed);
    assert_true(clean > 0.7); /* the run learned */
    assert_true(fabs(clean - killed) <= 0.01);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_shard_recovers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
