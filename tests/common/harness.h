/* Test harness: start real psd processes on loopback with free ports, wait
 * for them to listen (polling their endpoint file under a deadline), and
 * always reap them: on stop, at exit, and through PR_SET_PDEATHSIG if the
 * test itself dies. The psd binary comes from $PSD_BIN (set by meson). */
#ifndef PSTEST_HARNESS_H
#define PSTEST_HARNESS_H

#include <stddef.h>
#include <sys/types.h>

struct psd_proc {
    pid_t pid;
    char endpoint[256];
    char dir[256];
    char log_path[300];
};

/* Starts psd with "--listen tcp://127.0.0.1:0" plus args (NULL-terminated).
 * Returns 0 once it listens (within 20 s), -1 with the log on stderr. */
int harness_psd_start(struct psd_proc *p, const char *const *args);
/* SIGTERM, wait up to 10 s, then SIGKILL. Returns the exit status, or -1. */
int harness_psd_stop(struct psd_proc *p);
/* Prints the process's log to stderr (for failures). */
void harness_psd_dump_log(const struct psd_proc *p);
/* Starts argv (argv[0] is a path) with stdout+stderr to log_path; the
 * child dies with the test. Returns the pid or -1. */
pid_t harness_spawn(const char *const *argv, const char *log_path);
/* Waits up to timeout_ms for pid; kills it after that. Returns its exit
 * status, 128+signal, or -1 on timeout. Always reaps. */
int harness_wait(pid_t pid, int timeout_ms);
/* Prints a file to stderr. */
void harness_dump_file(const char *path);
/* Writes into out the path of a scratch file in this process's temp
 * directory (created on first use). Returns out. */
char *harness_tmp(char *out, size_t len, const char *name);
/* Reads "key": NUMBER from a one-line JSON file (psworker --summary-json,
 * gen_clicks' truth.json) into *out. Returns 0, or -1 if absent. */
int harness_json_number(const char *path, const char *key, double *out);
/* 1 when a line of the file holds a (and b, when not NULL). */
int harness_log_has(const char *path, const char *a, const char *b);
/* How many lines of the file hold a (and b, when not NULL). */
int harness_log_count(const char *path, const char *a, const char *b);
/* The number that follows `before` on the first line holding a and before;
 * -1 when there is none. */
int harness_log_number(const char *path, const char *a, const char *before, double *out);
/* harness_log_has, polled every 10 ms until it holds or timeout_ms pass. */
int harness_log_wait(const char *path, const char *a, const char *b, int timeout_ms);
/* Sleeps ms milliseconds: only between polls of a state, under a deadline. */
void harness_pause_ms(long ms);

#endif
