/* Command-line options from one table: name, type, bounds, default, help.
 *
 * Each program describes its options once (Redis-style config table); this
 * module applies the defaults, parses long flags with getopt_long, checks
 * each value against its bounds, and prints --help from the same table, so
 * the help text and the checks cannot drift apart. Errors name the flag and
 * the value. It does not know what any option means. */
#ifndef PS_OPTS_H
#define PS_OPTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum ps_opt_type {
    PS_OPT_STR,  /* const char * (points into argv or the default; not copied) */
    PS_OPT_U64,  /* uint64_t within [min, max] */
    PS_OPT_F64,  /* double within [fmin, fmax] */
    PS_OPT_FLAG, /* int, set to 1 when present; takes no value */
    PS_OPT_U64A, /* PS_OPT_U64, or "auto", stored as PS_OPT_AUTO for the program to
                  * work out (ps_auto.h) */
};

#define PS_OPT_AUTO UINT64_MAX

struct ps_opt {
    const char *name; /* long flag without the dashes */
    enum ps_opt_type type;
    size_t offset;   /* offsetof(config struct, field) */
    const char *def; /* default as text, parsed like a flag; NULL: none */
    uint64_t min, max;
    double fmin, fmax;
    const char *meta; /* value placeholder in --help, e.g. "ADDR" */
    const char *help;
};

#define PS_OPTS_MAX 64

/* Table entries for a config struct CFG: whole-number/string/flag options,
 * and floating-point ones. A program defines its own short names, e.g.
 *   #define OPT(...) PS_OPT(struct config, __VA_ARGS__) */
#define PS_OPT(CFG, name, type, field, def, lo, hi, meta, help)                                    \
    {                                                                                              \
        name, type, offsetof(CFG, field), def, lo, hi, 0, 0, meta, help                            \
    }
#define PS_FOPT(CFG, name, field, def, lo, hi, meta, help)                                         \
    {                                                                                              \
        name, PS_OPT_F64, offsetof(CFG, field), def, 0, 0, lo, hi, meta, help                      \
    }

/* Reads an INI file of NAME = VALUE lines (NAME a long flag without the
 * dashes, in any [section]; flags take true/false) into cfg. 0, or an error
 * naming the file, the line and what was wrong. */
int ps_opts_load_file(const struct ps_opt *opts, size_t n, void *cfg, const char *path, char *err,
                      size_t errlen);

/* Applies defaults, then the file of --config (when the table has a
 * "config" option and argv names one), then argv. Returns 0, or PS_EINVAL with a message in err
 * naming the flag and the value. Positional arguments are left in argv from
 * index *first_positional on (when not NULL). */
int ps_opts_parse(const struct ps_opt *opts, size_t n, void *cfg, int argc, char **argv,
                  int *first_positional, char *err, size_t errlen);

/* Sets one option by name from text (used by flags and config files). */
int ps_opts_set(const struct ps_opt *opts, size_t n, void *cfg, const char *name, const char *value,
                char *err, size_t errlen);

/* Whether option o has the same value in configs a and b (strings by
 * their text), and copying its value from src to dst: for a reload that
 * keeps some options as they were. */
int ps_opt_same(const struct ps_opt *o, const void *a, const void *b);
void ps_opt_copy(const struct ps_opt *o, void *dst, const void *src);

/* Prints usage generated from the table. */
void ps_opts_usage(FILE *f, const char *usage_line, const char *summary, const struct ps_opt *opts,
                   size_t n);

/* Splits --servers "EP,EP,..." (hostlist ranges expanded: ps_hostlist.h)
 * into buf of len bytes and eps (PS_SHARDS_MAX entries), each checked by
 * ps_endpoint_check. 0, or PS_EINVAL with a sentence in err. */
int ps_split_servers(const char *list, char *buf, size_t len, const char **eps, size_t *n,
                     char *err, size_t errlen);

/* Strict decimal parse into [min, max]; 0 or PS_EINVAL / PS_ERANGE. */
int ps_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out);
/* Strict finite double parse into [min, max]; 0 or PS_EINVAL / PS_ERANGE. */
int ps_parse_f64(const char *s, double min, double max, double *out);

#endif
