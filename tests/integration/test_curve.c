/* CURVE encryption and access control against a real psd: an admitted
 * client works; a client with an unknown key and a plaintext client are
 * refused and told why by their own handshake, each refusal is in the
 * server's log, and the admitted client
 * goes on working meanwhile. */
#include "harness.h"
#include "psclient.h"

#include "ps_curve.h"
#include "ps_err.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#define TIMEOUT_MS 10000

struct fixture {
    struct psd_proc psd;
    struct ps_curve_keys server, client, stranger;
    struct psc_client *c;
    uint32_t table;
};

static void keygen(const char *name, struct ps_curve_keys *k)
{
    char path[320], err[256];
    harness_tmp(path, sizeof path, name);
    assert_int_equal(ps_curve_keygen(path, err, sizeof err), 0);
    assert_int_equal(ps_curve_read(path, 1, k, err, sizeof err), 0);
}

static int connect_as(struct fixture *f, const struct ps_curve_keys *me, int timeout_ms,
                      struct psc_client **out, char *err, size_t errlen)
{
    const char *eps[1] = {f->psd.endpoint};
    struct psc_config cfg = {.struct_size = sizeof cfg,
                             .servers = eps,
                             .nservers = 1,
                             .worker_id = 1,
                             .connect_timeout_ms = timeout_ms};
    if (me != NULL) {
        cfg.curve_server_key = f->server.pub;
        cfg.curve_public = me->pub;
        cfg.curve_secret = me->sec;
    }
    return psc_create(&cfg, out, err, errlen);
}

static int setup(void **state)
{
    static struct fixture f;
    keygen("server.key", &f.server);
    keygen("client.key", &f.client);
    keygen("stranger.key", &f.stranger);
    char allow[320], key[320], pub[330], dst[400];
    harness_tmp(allow, sizeof allow, "allow");
    mkdir(allow, 0755);
    harness_tmp(pub, sizeof pub, "client.key.pub");
    snprintf(dst, sizeof dst, "%s/worker-1.pub", allow);
    if (rename(pub, dst) != 0)
        return -1;
    harness_tmp(key, sizeof key, "server.key");
    const char *args[] = {"--curve-secret", key, "--curve-allow", allow, NULL};
    if (harness_psd_start(&f.psd, args) != 0)
        return -1;
    char err[256];
    if (connect_as(&f, &f.client, TIMEOUT_MS, &f.c, err, sizeof err) != 0) {
        fprintf(stderr, "admitted client: %s\n", err);
        return -1;
    }
    struct psc_table_spec s;
    psc_table_spec_init(&s, "w", 100);
    s.lr = 1.0f;
    if (psc_table_create(f.c, &s, TIMEOUT_MS, &f.table) != 0)
        return -1;
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    psc_destroy(f->c);
    return harness_psd_stop(&f->psd) == 0 ? 0 : -1;
}

static void still_served(struct fixture *f, float expect)
{
    float g[100], w[100];
    for (int i = 0; i < 100; i++)
        g[i] = 0.5f;
    uint64_t t;
    assert_int_equal(psc_push_pull(f->c, f->table, 0, 100, g, w, 0, &t), 0);
    assert_int_equal(psc_wait(f->c, t, TIMEOUT_MS), 0);
    assert_float_equal(w[0], expect, 1e-6);
}

static void test_admitted_client_trains(void **state)
{
    struct fixture *f = *state;
    still_served(f, -0.5f); /* zeros init, SGD lr 1 */
    assert_true(
        harness_log_wait(f->psd.log_path, "S0500", NULL, 5000)); /* the admission is logged */
}

static void test_unknown_key_refused(void **state)
{
    struct fixture *f = *state;
    struct psc_client *c = NULL;
    char err[256];
    /* told by the handshake, long before this timeout */
    assert_int_equal(connect_as(f, &f->stranger, 60000, &c, err, sizeof err), PS_EAUTH);
    assert_null(c);
    assert_non_null(strstr(err, "CURVE allow list does not admit this client's public key"));
    assert_true(harness_log_wait(f->psd.log_path, "S0501", NULL, 5000));
    assert_true(harness_log_wait(f->psd.log_path, f->stranger.pub, NULL,
                                 5000)); /* names the key it refused */
    still_served(f, -1.0f);
}

static void test_plaintext_refused(void **state)
{
    struct fixture *f = *state;
    struct psc_client *c = NULL;
    char err[256];
    assert_int_equal(connect_as(f, NULL, 60000, &c, err, sizeof err), PS_EAUTH);
    assert_null(c);
    assert_non_null(strstr(err, "the server speaks CURVE and this client does not"));
    assert_true(harness_log_wait(f->psd.log_path, "S0502", NULL, 5000));
    still_served(f, -1.5f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admitted_client_trains),
        cmocka_unit_test(test_unknown_key_refused),
        cmocka_unit_test(test_plaintext_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
