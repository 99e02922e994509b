/* Option table parsing: defaults, bounds at the limit and one past, junk,
 * unknown flags, missing values. */
#include "ps_err.h"
#include "ps_opts.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_values),
        cmocka_unit_test(test_errors_name_flag_and_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
