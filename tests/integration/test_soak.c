/* Soak: 8 clients (one thread each, each with its own client) push-pull
 * small requests to one psd for PSD_SOAK_SECONDS (60); psd's resident
 * memory at the end must be within 10% of what it was after warm-up, and
 * no request may fail. */
#include "harness.h"
#include "psclient.h"

#include "ps_clock.h"
#include "ps_err.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define CLIENTS 8
#define ELEMS   256

struct worker {
    const char *endpoint;
    uint32_t id;
    long long until_ms;
    unsigned long long requests, failures;
    char error[256];
};

static long rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            kb = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return kb;
}

static void *run(void *arg)
{
    struct worker *w = arg;
    const char *eps[1] = {w->endpoint};
    struct psc_config cfg = {.struct_size = sizeof cfg,
                             .servers = eps,
                             .nservers = 1,
                             .worker_id = w->id,
                             .connect_timeout_ms = 10000};
    struct psc_client *c = NULL;
    if (psc_create(&cfg, &c, w->error, sizeof w->error) != 0) {
        w->failures++;
        return NULL;
    }
    struct psc_table_spec s;
    psc_table_spec_init(&s, "soak", ELEMS * CLIENTS);
    uint32_t t;
    if (psc_table_create(c, &s, 10000, &t) != 0) {
        snprintf(w->error, sizeof w->error, "%s", psc_last_error(c));
        w->failures++;
        psc_destroy(c);
        return NULL;
    }
    float g[ELEMS], out[ELEMS];
    for (int i = 0; i < ELEMS; i++)
        g[i] = 1e-6f;
    while (ps_mono_ms() < w->until_ms) {
        uint64_t tk;
        int rc = psc_push_pull(c, t, (uint64_t)w->id * ELEMS, ELEMS, g, out, w->requests, &tk);
        if (rc == 0)
            rc = psc_wait(c, tk, 10000);
        if (rc != 0 && w->failures++ == 0)
            snprintf(w->error, sizeof w->error, "%s", psc_last_error(c));
        w->requests++;
    }
    psc_destroy(c);
    return NULL;
}

static void test_memory_stays_flat(void **state)
{
    (void)state;
    long seconds = getenv("PSD_SOAK_SECONDS") ? atol(getenv("PSD_SOAK_SECONDS")) : 60;
    if (seconds < 5)
        seconds = 5;
    /* Under ASan, freed memory waits in a quarantine (256 MB) and RSS climbs
     * without any leak: switch it off for this psd so RSS means memory in
     * use. Leak detection stays on. Harmless for an unsanitized build. */
    char asan[512];
    const char *old = getenv("ASAN_OPTIONS");
    snprintf(asan, sizeof asan, "%s%squarantine_size_mb=0:thread_local_quarantine_size_kb=0",
             old ? old : "", old ? ":" : "");
    setenv("ASAN_OPTIONS", asan, 1);
    struct psd_proc p;
    assert_int_equal(harness_psd_start(&p, NULL), 0);
    struct worker w[CLIENTS];
    pthread_t th[CLIENTS];
    long long start = ps_mono_ms();
    for (int i = 0; i < CLIENTS; i++) {
        w[i] = (struct worker){
            .endpoint = p.endpoint, .id = (uint32_t)i, .until_ms = start + seconds * 1000};
        assert_int_equal(pthread_create(&th[i], NULL, run, &w[i]), 0);
    }
    /* warm-up: a tenth of the run, at least 2 s */
    long long warm = start + (seconds * 1000 / 10 > 2000 ? seconds * 100 : 2000);
    while (ps_mono_ms() < warm)
        harness_pause_ms(50);
    long rss_warm = rss_kb(p.pid), rss_peak = rss_warm;
    while (ps_mono_ms() < start + seconds * 1000) {
        harness_pause_ms(250);
        long r = rss_kb(p.pid);
        rss_peak = r > rss_peak ? r : rss_peak;
    }
    unsigned long long total = 0, failed = 0;
    for (int i = 0; i < CLIENTS; i++) {
        pthread_join(th[i], NULL);
        total += w[i].requests;
        failed += w[i].failures;
        if (w[i].failures)
            fprintf(stderr, "client %d: %s\n", i, w[i].error);
    }
    long rss_end = rss_kb(p.pid);
    printf("  %llu requests in %ld s from %d clients (%.0f/s); psd RSS %ld kB after warm-up, "
           "%ld kB at the end, %ld kB at most\n",
           total, seconds, CLIENTS, (double)total / seconds, rss_warm, rss_end, rss_peak);
    assert_int_equal(harness_psd_stop(&p), 0);
    assert_int_equal(failed, 0);
    assert_true(total > (unsigned long long)seconds * 100);
    assert_true(rss_warm > 0 && rss_end > 0);
    assert_true(rss_end * 10 <= rss_warm * 11);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory_stays_flat),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
