/* Table-driven option parsing on top of getopt_long. */
#include "ps_opts.h"

#include "ps_hostlist.h"

#include "ps_err.h"
#include "ps_limits.h"
#include "ps_local.h"

#include <errno.h>
#include <getopt.h>
#include <ini.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int ps_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    if (s == NULL || *s < '0' || *s > '9')
        return PS_EINVAL; /* no sign, no space, not empty */
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return PS_ERANGE;
    if (*end != '\0')
        return PS_EINVAL;
    if (v < min || v > max)
        return PS_ERANGE;
    *out = v;
    return 0;
}

int ps_parse_f64(const char *s, double min, double max, double *out)
{
    if (s == NULL || *s == '\0')
        return PS_EINVAL;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (*end != '\0' || end == s)
        return PS_EINVAL;
    if (errno == ERANGE || !isfinite(v) || v < min || v > max)
        return PS_ERANGE;
    *out = v;
    return 0;
}

static int set_value(const struct ps_opt *o, void *cfg, const char *value, char *err, size_t errlen)
{
    char *field = (char *)cfg + o->offset;
    int rc = 0;
    switch (o->type) {
    case PS_OPT_STR:
        if (value == NULL || value[0] == '\0')
            rc = PS_EINVAL;
        else
            memcpy(field, &value, sizeof value);
        break;
    case PS_OPT_U64:
    case PS_OPT_U64A: {
        uint64_t v = PS_OPT_AUTO;
        if (o->type != PS_OPT_U64A || value == NULL || strcmp(value, "auto") != 0)
            rc = ps_parse_u64(value, o->min, o->max, &v);
        if (rc == 0)
            memcpy(field, &v, sizeof v);
        if (rc != 0) {
            snprintf(err, errlen, "--%s: '%s' is not a whole number in [%llu, %llu]%s", o->name,
                     value ? value : "", (unsigned long long)o->min, (unsigned long long)o->max,
                     o->type == PS_OPT_U64A ? " or auto" : "");
            return PS_EINVAL;
        }
        return 0;
    }
    case PS_OPT_F64: {
        double v = 0;
        rc = ps_parse_f64(value, o->fmin, o->fmax, &v);
        if (rc == 0)
            memcpy(field, &v, sizeof v);
        if (rc != 0) {
            snprintf(err, errlen, "--%s: '%s' is not a number in [%g, %g]", o->name,
                     value ? value : "", o->fmin, o->fmax);
            return PS_EINVAL;
        }
        return 0;
    }
    case PS_OPT_FLAG: {
        int one = 1;
        memcpy(field, &one, sizeof one);
        break;
    }
    }
    if (rc != 0)
        snprintf(err, errlen, "--%s: empty value", o->name);
    return rc;
}

/* Bytes of the field an option of this type sets. */
static size_t field_bytes(enum ps_opt_type t)
{
    switch (t) {
    case PS_OPT_STR:
        return sizeof(const char *);
    case PS_OPT_U64:
    case PS_OPT_U64A:
        return sizeof(uint64_t);
    case PS_OPT_F64:
        return sizeof(double);
    case PS_OPT_FLAG:
    default:
        return sizeof(int);
    }
}

int ps_opt_same(const struct ps_opt *o, const void *a, const void *b)
{
    const char *fa = (const char *)a + o->offset, *fb = (const char *)b + o->offset;
    if (o->type == PS_OPT_STR) {
        const char *x, *y;
        memcpy(&x, fa, sizeof x);
        memcpy(&y, fb, sizeof y);
        return x == NULL || y == NULL ? x == y : strcmp(x, y) == 0;
    }
    return memcmp(fa, fb, field_bytes(o->type)) == 0;
}

void ps_opt_copy(const struct ps_opt *o, void *dst, const void *src)
{
    memcpy((char *)dst + o->offset, (const char *)src + o->offset, field_bytes(o->type));
}

int ps_opts_set(const struct ps_opt *opts, size_t n, void *cfg, const char *name, const char *value,
                char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(opts[i].name, name) == 0)
            return set_value(&opts[i], cfg, value, err, errlen);
    snprintf(err, errlen, "unknown option '%s'", name);
    return PS_EINVAL;
}

/* ---- config files (INI, read with inih) ---------------------------------- */

/* Strings read from config files live as long as the process. */
struct kept {
    struct kept *next;
    char s[];
};
static struct kept *kept_list;

static void free_kept(void)
{
    while (kept_list != NULL) {
        struct kept *k = kept_list;
        kept_list = k->next;
        free(k);
    }
}

static const char *keep(const char *v)
{
    size_t len = strlen(v);
    struct kept *k = malloc(sizeof *k + len + 1);
    if (k == NULL)
        return NULL;
    if (kept_list == NULL)
        atexit(free_kept);
    memcpy(k->s, v, len + 1);
    k->next = kept_list;
    kept_list = k;
    return k->s;
}

struct ini_ctx {
    const struct ps_opt *opts;
    size_t n;
    void *cfg;
    int rc;
    char *err;
    size_t errlen;
};

static int on_ini(void *user, const char *section, const char *name, const char *value)
{
    (void)section; /* any section: the names are the long flags */
    struct ini_ctx *x = user;
    if (x->rc != 0)
        return 1; /* the first error is the one reported */
    const struct ps_opt *o = NULL;
    for (size_t i = 0; i < x->n && o == NULL; i++)
        if (strcmp(x->opts[i].name, name) == 0 && strcmp(name, "config") != 0)
            o = &x->opts[i];
    if (o == NULL) {
        snprintf(x->err, x->errlen, "unknown option '%s'", name);
        x->rc = PS_EINVAL;
        return 0;
    }
    if (o->type == PS_OPT_FLAG) {
        int on = strcmp(value, "true") == 0 || strcmp(value, "yes") == 0 ||
                 strcmp(value, "1") == 0 || strcmp(value, "on") == 0;
        int off = strcmp(value, "false") == 0 || strcmp(value, "no") == 0 ||
                  strcmp(value, "0") == 0 || strcmp(value, "off") == 0;
        if (!on && !off) {
            snprintf(x->err, x->errlen, "%s: '%s' is not true or false", name, value);
            x->rc = PS_EINVAL;
            return 0;
        }
        memcpy((char *)x->cfg + o->offset, &on, sizeof on);
        return 1;
    }
    const char *v = o->type == PS_OPT_STR ? keep(value) : value;
    if (v == NULL) {
        snprintf(x->err, x->errlen, "out of memory");
        x->rc = PS_ENOMEM;
        return 0;
    }
    x->rc = set_value(o, x->cfg, v, x->err, x->errlen);
    return x->rc == 0;
}

int ps_opts_load_file(const struct ps_opt *opts, size_t n, void *cfg, const char *path, char *err,
                      size_t errlen)
{
    char why[400] = "";
    struct ini_ctx x = {opts, n, cfg, 0, why, sizeof why};
    int line = ini_parse(path, on_ini, &x);
    if (line == -1) {
        snprintf(err, errlen, "--config: cannot read '%s': %s", path, strerror(errno));
        return PS_EIO;
    }
    if (line != 0) {
        snprintf(err, errlen, "--config: %s line %d: %s", path, line,
                 why[0] ? why : "not NAME = VALUE");
        return x.rc ? x.rc : PS_EINVAL;
    }
    return 0;
}

/* The value of --config in argv, or NULL. */
static const char *config_arg(const struct ps_opt *opts, size_t n, int argc, char **argv)
{
    int known = 0;
    for (size_t i = 0; i < n; i++)
        known |= strcmp(opts[i].name, "config") == 0;
    for (int i = 1; known && i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            break;
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            return argv[i + 1];
        if (strncmp(argv[i], "--config=", 9) == 0)
            return argv[i] + 9;
    }
    return NULL;
}

int ps_opts_parse(const struct ps_opt *opts, size_t n, void *cfg, int argc, char **argv,
                  int *first_positional, char *err, size_t errlen)
{
    if (n > PS_OPTS_MAX) {
        snprintf(err, errlen, "internal: %zu options, at most %d", n, PS_OPTS_MAX);
        return PS_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        if (opts[i].def != NULL) {
            int rc = set_value(&opts[i], cfg, opts[i].def, err, errlen);
            if (rc != 0)
                return rc;
        }
    }
    const char *file = config_arg(opts, n, argc, argv);
    if (file != NULL) { /* defaults, then the file, then the flags */
        int rc = ps_opts_load_file(opts, n, cfg, file, err, errlen);
        if (rc != 0)
            return rc;
    }
    struct option lo[PS_OPTS_MAX + 1];
    memset(lo, 0, sizeof lo);
    for (size_t i = 0; i < n; i++) {
        lo[i].name = opts[i].name;
        lo[i].has_arg = opts[i].type == PS_OPT_FLAG ? no_argument : required_argument;
        lo[i].val = 0x100 + (int)i;
    }
    optind = 1;
    opterr = 0;
    for (;;) {
        int idx = -1;
        int c = getopt_long(argc, argv, "+", lo, &idx);
        if (c == -1)
            break;
        if (c == '?' || c == ':') {
            const char *bad = argv[optind - 1] ? argv[optind - 1] : "?";
            if (optopt != 0 || c == ':')
                snprintf(err, errlen, "%s: missing value", bad);
            else
                snprintf(err, errlen, "unknown option '%s' (see --help)", bad);
            return PS_EINVAL;
        }
        const struct ps_opt *o = &opts[c - 0x100];
        int rc = set_value(o, cfg, optarg, err, errlen);
        if (rc != 0)
            return rc;
    }
    if (first_positional != NULL)
        *first_positional = optind;
    else if (optind < argc) {
        snprintf(err, errlen, "unexpected argument '%s'", argv[optind]);
        return PS_EINVAL;
    }
    return 0;
}

void ps_opts_usage(FILE *f, const char *usage_line, const char *summary, const struct ps_opt *opts,
                   size_t n)
{
    fprintf(f, "usage: %s\n\n%s\n\noptions:\n", usage_line, summary);
    for (size_t i = 0; i < n; i++) {
        const struct ps_opt *o = &opts[i];
        char left[64];
        if (o->type == PS_OPT_FLAG)
            snprintf(left, sizeof left, "--%s", o->name);
        else
            snprintf(left, sizeof left, "--%s %s", o->name, o->meta ? o->meta : "VALUE");
        fprintf(f, "  %-28s %s", left, o->help);
        if (o->type == PS_OPT_U64 || o->type == PS_OPT_U64A)
            fprintf(f, " [%llu..%llu%s]", (unsigned long long)o->min, (unsigned long long)o->max,
                    o->type == PS_OPT_U64A ? ", or auto" : "");
        if (o->def != NULL && o->type != PS_OPT_FLAG)
            fprintf(f, " (default %s)", o->def);
        fputc('\n', f);
    }
}

int ps_split_servers(const char *list, char *buf, size_t len, const char **eps, size_t *n,
                     char *err, size_t errlen)
{
    return ps_hostlist_expand("--servers", list, buf, len, eps, PS_SHARDS_MAX, n, err, errlen);
}
