/* Logging implementation: one formatted line per call, written with a
 * single fwrite so lines from threads or processes sharing stderr do not
 * interleave mid-line. */
#include "ps_log.h"

#include "ps_err.h"

#include <stdarg.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *level_name(int level)
{
    static const char *const names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    if (level < 0 || level > PS_LOG_DEBUG)
        return "?";
    return names[level];
}

void ps_log_init(struct ps_log *lg, const char *prog, int level)
{
    lg->level = level;
    lg->prog = prog;
    lg->out = NULL;
}

void ps_log_write(const struct ps_log *lg, int level, const char *id, const char *fmt, ...)
{
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s[%ld] %s %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000L, lg->prog ? lg->prog : "ps", (long)getpid(),
                     level_name(level), id);
    if (n < 0 || (size_t)n >= sizeof line)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2; /* truncated: keep the newline */
    line[len++] = '\n';
    FILE *f = lg->out ? lg->out : stderr;
    fwrite(line, 1, len, f);
    fflush(f);
}

int ps_log_level_parse(const char *s)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i <= PS_LOG_DEBUG; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return PS_EINVAL;
}
