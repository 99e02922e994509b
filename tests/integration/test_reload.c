/* SIGHUP on a real psd: the config file is read again, the options that
 * may change while running are applied, and only a restart-only option
 * whose value changed is named (S0032); a reload that changes nothing
 * names none. */
#include "harness.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <cmocka.h>

#define DEADLINE_MS 20000

static void write_config(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* Sends SIGHUP and waits until psd has logged its n-th reload (S0033). */
static void reload(const struct psd_proc *p, int n)
{
    assert_int_equal(kill(p->pid, SIGHUP), 0);
    for (int waited = 0; harness_log_count(p->log_path, "S0033", NULL) < n; waited += 10) {
        if (waited >= DEADLINE_MS) {
            harness_psd_dump_log(p);
            fail_msg("no reload %d logged in %d ms", n, DEADLINE_MS);
        }
        harness_pause_ms(10);
    }
}

static void test_reload_names_what_changed(void **state)
{
    (void)state;
    char cfg[320];
    harness_tmp(cfg, sizeof cfg, "psd.ini");
    write_config(cfg, "workers = 2\nconsistency = bsp\nlog-level = info\n");
    const char *args[] = {"--config", cfg, NULL};
    struct psd_proc p;
    assert_int_equal(harness_psd_start(&p, args), 0);

    reload(&p, 1); /* nothing changed */
    assert_int_equal(harness_log_count(p.log_path, "S0032", NULL), 0);
    assert_true(harness_log_has(p.log_path, "S0033", "0 option(s) applied"));

    write_config(cfg, "workers = 3\nconsistency = bsp\nlog-level = info\nwait-timeout-ms = 5000\n");
    reload(&p, 2);
    assert_int_equal(harness_log_count(p.log_path, "S0032", NULL), 1);
    assert_true(harness_log_has(p.log_path, "S0032", "SIGHUP: workers changed"));
    assert_false(harness_log_has(p.log_path, "S0032", "listen"));
    assert_true(harness_log_has(p.log_path, "S0030", "wait-timeout-ms 120000 -> 5000"));
    assert_true(harness_log_has(p.log_path, "S0033", "1 option(s) applied"));

    reload(&p, 3); /* the kept workers = 2 still differs from the file: named again */
    assert_int_equal(harness_log_count(p.log_path, "S0032", NULL), 2);
    assert_int_equal(harness_psd_stop(&p), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reload_names_what_changed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
