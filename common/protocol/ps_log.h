/* Line-oriented logging to stderr: "TIME PROG[PID] LEVEL ID message".
 *
 * Each line carries a stable id (e.g. "S0101") so operators and journald
 * filters can match it across versions. The logger is a small struct owned by
 * whoever logs (no global state); PS_LOG does not evaluate its format
 * arguments when the level is filtered out. Kernels never log. */
#ifndef PS_LOG_H
#define PS_LOG_H

#include "ps_logids.h"

#include <stdio.h>

enum ps_log_level {
    PS_LOG_ERROR = 0,
    PS_LOG_WARN = 1,
    PS_LOG_INFO = 2,
    PS_LOG_DEBUG = 3,
};

struct ps_log {
    int level;        /* lines above this level are dropped */
    const char *prog; /* program name in each line; not owned */
    FILE *out;        /* NULL means stderr */
};

/* id: a bare id from ps_logids.h (S0010, not "S0010"); one not listed
 * there does not compile. */
#define PS_LOG(lg, lvl, id, ...)                                                                   \
    do {                                                                                           \
        (void)PS_LOGID_##id;                                                                       \
        if ((lg) != NULL && (lvl) <= (lg)->level)                                                  \
            ps_log_write((lg), (lvl), #id, __VA_ARGS__);                                           \
    } while (0)

/* Whether the nth occurrence (counting from 1) of a message a peer can
 * repeat at will is logged: the first 20, then every 1,000th. */
static inline int ps_log_sampled(unsigned long long nth)
{
    return nth <= 20 || nth % 1000 == 0;
}

void ps_log_init(struct ps_log *lg, const char *prog, int level);
void ps_log_write(const struct ps_log *lg, int level, const char *id, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Parses "error|warn|info|debug"; returns a level or PS_EINVAL. */
int ps_log_level_parse(const char *s);

#endif
