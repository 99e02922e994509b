/* Option table parsing: defaults, bounds at the limit and one past, junk,
 * unknown flags, missing values; CPU lists. */
#define _GNU_SOURCE
#include "ps_auto.h"
#include "ps_cpus.h"
#include "ps_err.h"
#include "ps_hostlist.h"
#include "ps_limits.h"
#include "ps_local.h"
#include "ps_opts.h"

#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

struct cfg {
    uint64_t n;
    double lr;
    const char *name;
    int flag;
};

static const struct ps_opt opts[] = {
    {"n", PS_OPT_U64, offsetof(struct cfg, n), "5", 1, 10, 0, 0, "N", "a count"},
    {"lr", PS_OPT_F64, offsetof(struct cfg, lr), "0.1", 0, 0, 0.0, 1.0, "LR", "a rate"},
    {"name", PS_OPT_STR, offsetof(struct cfg, name), NULL, 0, 0, 0, 0, "S", "a name"},
    {"flag", PS_OPT_FLAG, offsetof(struct cfg, flag), NULL, 0, 0, 0, 0, NULL, "a flag"},
};

static int run(struct cfg *c, int argc, const char **argv, char *err)
{
    memset(c, 0, sizeof *c);
    return ps_opts_parse(opts, 4, c, argc, (char **)argv, NULL, err, 256);
}

static void test_defaults_and_values(void **state)
{
    (void)state;
    struct cfg c;
    char err[256];
    const char *a0[] = {"p", NULL};
    assert_int_equal(run(&c, 1, a0, err), 0);
    assert_int_equal(c.n, 5);
    assert_true(c.lr == 0.1);
    assert_null(c.name);
    const char *a1[] = {"p", "--n", "10", "--lr=1", "--name", "x", "--flag", NULL};
    assert_int_equal(run(&c, 7, a1, err), 0);
    assert_int_equal(c.n, 10); /* at the limit */
    assert_true(c.lr == 1.0);
    assert_string_equal(c.name, "x");
    assert_int_equal(c.flag, 1);
}

static void test_errors_name_flag_and_value(void **state)
{
    (void)state;
    struct cfg c;
    char err[256];
    const struct {
        const char *argv[4];
        const char *needle;
    } bad[] = {
        {{"p", "--n", "11", NULL}, "--n: '11'"}, /* one past the limit */
        {{"p", "--n", "0", NULL}, "--n: '0'"},
        {{"p", "--n", "-1", NULL}, "--n: '-1'"},
        {{"p", "--n", "3x", NULL}, "--n: '3x'"},
        {{"p", "--n", "", NULL}, "--n: ''"},
        {{"p", "--n", "99999999999999999999999", NULL}, "--n"},
        {{"p", "--lr", "1.5", NULL}, "--lr: '1.5'"},
        {{"p", "--lr", "nan", NULL}, "--lr: 'nan'"},
        {{"p", "--bogus", NULL, NULL}, "unknown option '--bogus'"},
        {{"p", "--n", NULL, NULL}, "missing value"},
        {{"p", "stray", NULL, NULL}, "unexpected argument 'stray'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int argc = 0;
        while (bad[i].argv[argc] != NULL)
            argc++;
        const char *argv[5] = {0};
        memcpy(argv, bad[i].argv, sizeof bad[i].argv);
        assert_int_equal(run(&c, argc, argv, err), PS_EINVAL);
        if (strstr(err, bad[i].needle) == NULL)
            fail_msg("case %zu: '%s' does not mention '%s'", i, err, bad[i].needle);
    }
}

/* CPU lists: ranges, repeats and order folded into one ascending list and
 * written back in the short form; malformed items and CPUs this process
 * may not use are refused, naming the flag and the item; the list of CPUs
 * it may use is the kernel's. */
static void test_cpu_lists(void **state)
{
    (void)state;
    struct ps_cpus c = {.n = 0};
    char err[512], buf[64];
    cpu_set_t may; /* what the kernel says, not what the parser says */
    assert_int_equal(sched_getaffinity(0, sizeof may, &may), 0);
    int lo = -1, hi = -1;
    for (int i = 0; i < PS_CPUS_MAX; i++) { /* every CPU number up to the limit */
        char one[16];
        snprintf(one, sizeof one, "%d", i);
        int rc = ps_cpus_parse("--cpus", one, &c, err, sizeof err);
        if (CPU_ISSET(i, &may)) {
            assert_int_equal(rc, 0);
            assert_int_equal(c.n, 1);
            assert_int_equal(c.cpu[0], i);
            lo = lo < 0 ? i : lo;
            hi = i;
        } else {
            assert_int_equal(rc, PS_EINVAL);
            snprintf(one, sizeof one, "CPU %d is", i);
            assert_non_null(strstr(err, one));
            assert_non_null(strstr(err, "is not one this process may run on"));
        }
    }
    /* one past the limit is not a CPU number at all */
    char past[16], said[64];
    snprintf(past, sizeof past, "%d", PS_CPUS_MAX);
    snprintf(said, sizeof said, "'%s' in '%s' is not a CPU number", past, past);
    assert_int_equal(ps_cpus_parse("--cpus", past, &c, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, said));
    assert_true(lo >= 0);
    struct ps_cpus all; /* the same CPUs as a list, ascending */
    ps_cpus_allowed_list(&all);
    assert_int_equal(all.n, CPU_COUNT(&may));
    assert_int_equal(all.n, ps_cpus_allowed());
    for (int i = 0; i < all.n; i++)
        assert_true(CPU_ISSET(all.cpu[i], &may) && (i == 0 || all.cpu[i] > all.cpu[i - 1]));
    assert_int_equal(all.cpu[0], lo);
    assert_int_equal(all.cpu[all.n - 1], hi);
    snprintf(buf, sizeof buf, "%d,%d-%d,%d", hi, lo, lo, lo);
    assert_int_equal(ps_cpus_parse("--cpus", buf, &c, err, sizeof err), 0);
    assert_int_equal(c.n, lo == hi ? 1 : 2);
    assert_int_equal(c.cpu[0], lo);
    assert_int_equal(c.cpu[c.n - 1], hi);
    const char *bad[] = {"",     ",",  "x",    "1-",          "-1", "3-1",
                         "1,,2", "0,", "1024", "99999999999", " 0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        assert_int_equal(ps_cpus_parse("--io-cpus", bad[i], &c, err, sizeof err), PS_EINVAL);
        assert_non_null(strstr(err, "--io-cpus: "));
    }
    struct ps_cpus f = {.n = 6, .cpu = {0, 1, 2, 5, 7, 8}};
    ps_cpus_format(&f, buf, sizeof buf);
    assert_string_equal(buf, "0-2,5,7-8");
    ps_cpus_format(&f, buf, 5); /* truncated at a whole item */
    assert_string_equal(buf, "0-2");
}

/* Endpoint ports at their limits, to connect to and to bind. */
static void test_endpoint_ports(void **state)
{
    (void)state;
    char err[256];
    const struct {
        const char *ep;
        int bind, ok;
    } cases[] = {
        {"tcp://127.0.0.1:65535", 0, 1},
        {"tcp://127.0.0.1:65536", 0, 0},
        {"tcp://127.0.0.1:99999", 0, 0},
        {"tcp://127.0.0.1:1", 0, 1},
        {"tcp://127.0.0.1:0", 0, 0},
        {"tcp://127.0.0.1:0", 1, 1},
        {"tcp://*:*", 1, 1},
        {"tcp://127.0.0.1:*", 0, 0},
        {"tcp://127.0.0.1:", 0, 0},
        {"tcp://127.0.0.1:5x", 0, 0},
        {"tcp://127.0.0.1", 0, 0},
        {"tcp://[::1]:5570", 0, 1},
        {"tcp://h:000001", 0, 0},
        {"ipc://@psd/x", 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = ps_endpoint_check(cases[i].ep, cases[i].bind, err, sizeof err);
        if ((rc == 0) != cases[i].ok)
            fail_msg("%s (bind %d): got %d, %s", cases[i].ep, cases[i].bind, rc, err);
    }
    assert_int_equal(ps_endpoint_check("tcp://h:70000", 0, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "port '70000' is not a number in 1..65535"));
}

/* Expands list; returns the endpoints joined by spaces, or the error. */
static const char *expand(const char *list)
{
    static char out[4096];
    char buf[2048], err[256];
    const char *eps[PS_SHARDS_MAX];
    size_t n = 0;
    if (ps_hostlist_expand("--servers", list, buf, sizeof buf, eps, PS_SHARDS_MAX, &n, err,
                           sizeof err) != 0) {
        snprintf(out, sizeof out, "ERROR %s", err);
        return out;
    }
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n; i++)
        used += (size_t)snprintf(out + used, sizeof out - used, "%s%s", i ? " " : "", eps[i]);
    return out;
}

static void test_server_patterns(void **state)
{
    (void)state;
    assert_string_equal(expand("tcp://a:1,tcp://b:2"), "tcp://a:1 tcp://b:2");
    assert_string_equal(expand("tcp://psd-[0-3].psd:5570"),
                        "tcp://psd-0.psd:5570 tcp://psd-1.psd:5570 tcp://psd-2.psd:5570 "
                        "tcp://psd-3.psd:5570");
    assert_string_equal(expand("tcp://n[01-02,07]:9,tcp://x:1"),
                        "tcp://n01:9 tcp://n02:9 tcp://n07:9 tcp://x:1");
    assert_string_equal(expand("tcp://127.0.0.[1-2]:5570"),
                        "tcp://127.0.0.1:5570 tcp://127.0.0.2:5570");
    assert_string_equal(expand("tcp://h-[9-10]:1"), "tcp://h-9:1 tcp://h-10:1");
    assert_string_equal(expand("tcp://h:[5570-5571]"), "tcp://h:5570 tcp://h:5571");
    assert_string_equal(expand("tcp://a:1|tcp://b:1,tcp://c:1"), "tcp://a:1|tcp://b:1 tcp://c:1");
    assert_string_equal(expand("tcp://psd-[0-1].psd:5570|tcp://psd-[2-3].psd:5570"),
                        "tcp://psd-0.psd:5570|tcp://psd-2.psd:5570 "
                        "tcp://psd-1.psd:5570|tcp://psd-3.psd:5570");
    assert_string_equal(expand("tcp://h:[1-2]|tcp://h:[3-4]|tcp://g:[5-6]"),
                        "tcp://h:1|tcp://h:3|tcp://g:5 tcp://h:2|tcp://h:4|tcp://g:6");
    /* PS_REPLICAS_MAX replicas, plain and by pattern: the most (one more: below) */
    assert_string_equal(expand("tcp://a:1|tcp://b:1|tcp://c:1|tcp://d:1"),
                        "tcp://a:1|tcp://b:1|tcp://c:1|tcp://d:1");
    assert_string_equal(expand("tcp://a:[1-1]|tcp://b:1|tcp://c:1|tcp://d:1"),
                        "tcp://a:1|tcp://b:1|tcp://c:1|tcp://d:1");
    const struct {
        const char *list, *says;
    } bad[] = {
        {"tcp://h-[0-1:1", "has an unclosed '['"},
        {"tcp://h-[0-1]-[2]:1", "needs one [range] group"},
        {"tcp://h-0-1]:1", "has a ']' without its '['"},
        {"tcp://h-[3-1]:1", "must ascend"},
        {"tcp://h-[1-3,2]:1", "must ascend"},
        {"tcp://h-[]:1", "has an empty range"},
        {"tcp://h-[a-b]:1", "'a-b' in 'tcp://h-[a-b]:1' is not N or N-M"},
        {"tcp://h-[1,]:1", "ends its range with a comma"},
        {"tcp://h-[,1]:1", "'' in 'tcp://h-[,1]:1' is not N or N-M"},
        {"tcp://a:1,", "ends with a comma"},
        {"tcp://a:1,,tcp://b:1", "has an empty endpoint"},
        {"", "names no endpoint"},
        {"tcp://h-[0-9999]:1", "names more than"},
        {"tcp://h:[0-1]", "port '0' is not a number in 1..65535"},
        {"tcp://a-[0-1]:1|tcp://b-[0-2]:1", "its replicas expand to 2 and 3 endpoints"},
        {"tcp://a-[0-1]:1|tcp://b:1", "its replicas expand to 2 and 1 endpoints"},
        {"tcp://a-[0-1]:1|tcp://b-[0-1]:1|tcp://c-[0-1]:1|tcp://d-[0-1]:1|tcp://e-[0-1]:1",
         "names more than 4 replicas"},
        {"tcp://a:1||tcp://b:1", "an empty endpoint around '|'"},
        {"tcp://a:1|tcp://b:2|tcp://c:3|tcp://d:4|tcp://e:5", "more than 4 replicas"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *got = expand(bad[i].list);
        if (strncmp(got, "ERROR --servers: ", 17) != 0 || strstr(got, bad[i].says) == NULL)
            fail_msg("'%s': got '%s', not an error saying '%s'", bad[i].list, got, bad[i].says);
    }
    /* a range of PS_SHARDS_MAX endpoints is the most, one more is refused */
    static char big[PS_SHARDS_MAX * 24];
    const char *all[PS_SHARDS_MAX];
    size_t got = 0;
    char e2[256], at[64], past[64];
    snprintf(at, sizeof at, "tcp://h:[1-%u]", PS_SHARDS_MAX);
    snprintf(past, sizeof past, "tcp://h:[1-%u]", PS_SHARDS_MAX + 1);
    assert_int_equal(ps_hostlist_expand("--servers", at, big, sizeof big, all, PS_SHARDS_MAX, &got,
                                        e2, sizeof e2),
                     0);
    assert_int_equal(got, PS_SHARDS_MAX);
    assert_string_equal(all[PS_SHARDS_MAX - 1], "tcp://h:256");
    assert_int_equal(ps_hostlist_expand("--servers", past, big, sizeof big, all, PS_SHARDS_MAX,
                                        &got, e2, sizeof e2),
                     PS_EINVAL);
    assert_non_null(strstr(e2, "names more than 256 endpoints"));
    /* more endpoints than the caller has room for */
    char buf[64], err[256];
    const char *eps[2];
    size_t n;
    assert_int_equal(ps_hostlist_expand("--servers", "tcp://h-[1-3]:1", buf, sizeof buf, eps, 2, &n,
                                        err, sizeof err),
                     PS_EINVAL);
    assert_non_null(strstr(err, "more than 2 endpoints"));
    assert_int_equal(ps_hostlist_expand("--servers", "tcp://a-long-host-name-[1-9]:1", buf,
                                        sizeof buf, (const char *[PS_SHARDS_MAX]){0}, PS_SHARDS_MAX,
                                        &n, err, sizeof err),
                     PS_EINVAL);
    assert_non_null(strstr(err, "take more than 64 bytes"));
}

static void test_auto_indices(void **state)
{
    (void)state;
    assert_int_equal(ps_host_ordinal("psd-3"), 3);
    assert_int_equal(ps_host_ordinal("psd-12.psd.default.svc.cluster.local"), 12);
    assert_int_equal(ps_host_ordinal("a-b-7"), 7);
    assert_int_equal(ps_host_ordinal("psd"), -1);
    assert_int_equal(ps_host_ordinal("psd-"), -1);
    assert_int_equal(ps_host_ordinal("-3"), -1);
    assert_int_equal(ps_host_ordinal("psd3"), -1);
    assert_int_equal(ps_host_ordinal("psd-1234567890"), -1);
    const char *vars[] = {"JOB_COMPLETION_INDEX", "RANK",        "SLURM_PROCID",
                          "OMPI_COMM_WORLD_RANK", "WORLD_SIZE",  "SLURM_NTASKS",
                          "OMPI_COMM_WORLD_SIZE", "PSD_WORKERS", "PSD_SHARD"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    uint64_t v = 0;
    char err[512];
    assert_int_equal(ps_auto_rank("--rank auto", 0, 7, &v, err, sizeof err), PS_EINVAL);
    assert_string_equal(err, "--rank auto: none of JOB_COMPLETION_INDEX, RANK, SLURM_PROCID or "
                             "OMPI_COMM_WORLD_RANK is set (give the number instead)");
    setenv("OMPI_COMM_WORLD_RANK", "5", 1);
    assert_int_equal(ps_auto_rank("--rank auto", 0, 7, &v, err, sizeof err), 0);
    assert_int_equal(v, 5);
    setenv("RANK", "2", 1); /* earlier in the order: it wins */
    assert_int_equal(ps_auto_rank("--rank auto", 0, 7, &v, err, sizeof err), 0);
    assert_int_equal(v, 2);
    setenv("JOB_COMPLETION_INDEX", "8", 1); /* the first, out of range: named */
    assert_int_equal(ps_auto_rank("--rank auto", 0, 7, &v, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "JOB_COMPLETION_INDEX is '8', not a whole number in [0, 7]"));
    setenv("JOB_COMPLETION_INDEX", "1x", 1);
    assert_int_equal(ps_auto_rank("--rank auto", 0, 7, &v, err, sizeof err), PS_EINVAL);
    assert_int_equal(ps_auto_workers("--workers auto", 1, 64, &v, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "none of WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE or "
                                "PSD_WORKERS is set"));
    setenv("PSD_WORKERS", "4", 1);
    assert_int_equal(ps_auto_workers("--workers auto", 1, 64, &v, err, sizeof err), 0);
    assert_int_equal(v, 4);
    setenv("SLURM_NTASKS", "0", 1);
    assert_int_equal(ps_auto_workers("--workers auto", 1, 64, &v, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "SLURM_NTASKS is '0'"));
    setenv("PSD_SHARD", "3", 1);
    assert_int_equal(ps_auto_shard("--shard auto", 0, 3, &v, err, sizeof err), 0);
    assert_int_equal(v, 3);
    assert_int_equal(ps_auto_shard("--shard auto", 0, 2, &v, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "PSD_SHARD is '3', not a whole number in [0, 2]"));
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoint_ports),
        cmocka_unit_test(test_defaults_and_values),
        cmocka_unit_test(test_errors_name_flag_and_value),
        cmocka_unit_test(test_cpu_lists),
        cmocka_unit_test(test_server_patterns),
        cmocka_unit_test(test_auto_indices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
