/* Process harness for integration tests. */
#include "harness.h"

#include "ps_clock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LIVE_MAX 32
static pid_t live[LIVE_MAX]; /* test-process bookkeeping for the atexit reaper */
static int atexit_set;

static void reap_all(void)
{
    for (int i = 0; i < LIVE_MAX; i++) {
        if (live[i] > 0) {
            kill(live[i], SIGKILL);
            waitpid(live[i], NULL, 0);
            live[i] = 0;
        }
    }
}

static void track(pid_t pid, int add)
{
    for (int i = 0; i < LIVE_MAX; i++) {
        if (add && live[i] == 0) {
            live[i] = pid;
            return;
        }
        if (!add && live[i] == pid) {
            live[i] = 0;
            return;
        }
    }
}

void harness_pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void harness_dump_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char line[1024];
    fprintf(stderr, "---- %s ----\n", path);
    while (fgets(line, sizeof line, f) != NULL)
        fputs(line, stderr);
    fclose(f);
}

int harness_json_number(const char *path, const char *key, double *out)
{
    FILE *f = fopen(path, "r");
    char buf[4096] = {0}, pat[96];
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *k = strstr(buf, pat);
    if (k == NULL)
        return -1;
    *out = strtod(k + strlen(pat), NULL);
    return 0;
}

/* Counts the lines of the file holding a (and b, when not NULL), up to
 * want; when it reaches want, line holds the want-th. */
static int log_lines(const char *path, const char *a, const char *b, char *line, size_t len,
                     int want)
{
    FILE *f = fopen(path, "r");
    int found = 0;
    while (f != NULL && found < want && fgets(line, (int)len, f) != NULL)
        found += strstr(line, a) != NULL && (b == NULL || strstr(line, b) != NULL);
    if (f != NULL)
        fclose(f);
    return found;
}

/* The first line holding a (and b): 1 when there is one. */
static int log_line(const char *path, const char *a, const char *b, char *line, size_t len)
{
    return log_lines(path, a, b, line, len, 1);
}

int harness_log_count(const char *path, const char *a, const char *b)
{
    char line[1024];
    return log_lines(path, a, b, line, sizeof line, INT_MAX);
}

int harness_log_has(const char *path, const char *a, const char *b)
{
    char line[1024];
    return log_line(path, a, b, line, sizeof line);
}

int harness_log_number(const char *path, const char *a, const char *before, double *out)
{
    char line[1024];
    if (!log_line(path, a, before, line, sizeof line))
        return -1;
    char *end;
    *out = strtod(strstr(line, before) + strlen(before), &end);
    return end == strstr(line, before) + strlen(before) ? -1 : 0;
}

int harness_log_wait(const char *path, const char *a, const char *b, int timeout_ms)
{
    long long deadline = ps_mono_ms() + timeout_ms;
    while (!harness_log_has(path, a, b)) {
        if (ps_mono_ms() >= deadline)
            return 0;
        harness_pause_ms(10);
    }
    return 1;
}

void harness_psd_dump_log(const struct psd_proc *p)
{
    harness_dump_file(p->log_path);
}

static void ensure_reaper(void)
{
    if (!atexit_set) {
        atexit(reap_all);
        atexit_set = 1;
    }
}

char *harness_tmp(char *out, size_t len, const char *name)
{
    static char dir[64]; /* one directory per test process */
    if (dir[0] == '\0') {
        snprintf(dir, sizeof dir, "/tmp/pstest.XXXXXX");
        if (mkdtemp(dir) == NULL)
            dir[0] = '\0';
    }
    snprintf(out, len, "%s/%s", dir[0] ? dir : "/tmp", name);
    return out;
}

static void redirect_output(const char *log_path)
{
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        dup2(fd, STDERR_FILENO);
        dup2(fd, STDOUT_FILENO);
        close(fd);
    }
}

pid_t harness_spawn(const char *const *argv, const char *log_path)
{
    ensure_reaper();
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        redirect_output(log_path);
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    track(pid, 1);
    return pid;
}

int harness_wait(pid_t pid, int timeout_ms)
{
    long long deadline = ps_mono_ms() + timeout_ms;
    int status = 0;
    pid_t r = 0;
    while ((r = waitpid(pid, &status, WNOHANG)) == 0 && ps_mono_ms() < deadline)
        harness_pause_ms(5);
    if (r == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        track(pid, 0);
        return -1;
    }
    track(pid, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int read_endpoint(const char *path, char *out, size_t len)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    int ok = fgets(out, (int)len, f) != NULL;
    fclose(f);
    if (!ok)
        return -1;
    out[strcspn(out, "\n")] = '\0';
    return out[0] ? 0 : -1;
}

static void exec_child(const struct psd_proc *p, const char *bin, const char *ep_file,
                       const char *const *args)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    redirect_output(p->log_path);
    const char *argv[64];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "--listen";
    argv[n++] = "tcp://127.0.0.1:0";
    argv[n++] = "--endpoint-file";
    argv[n++] = ep_file;
    for (int i = 0; args != NULL && args[i] != NULL && n < 62; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    execv(bin, (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
    _exit(127);
}

int harness_psd_start(struct psd_proc *p, const char *const *args)
{
    memset(p, 0, sizeof *p);
    const char *bin = getenv("PSD_BIN");
    if (bin == NULL) {
        fprintf(stderr, "harness: PSD_BIN is not set\n");
        return -1;
    }
    ensure_reaper();
    snprintf(p->dir, sizeof p->dir, "/tmp/pstest.XXXXXX");
    if (mkdtemp(p->dir) == NULL)
        return -1;
    snprintf(p->log_path, sizeof p->log_path, "%s/psd.log", p->dir);
    char ep_file[300];
    snprintf(ep_file, sizeof ep_file, "%s/endpoint", p->dir);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0)
        exec_child(p, bin, ep_file, args);
    p->pid = pid;
    track(pid, 1);
    long long deadline = ps_mono_ms() + 20000;
    while (ps_mono_ms() < deadline) {
        if (read_endpoint(ep_file, p->endpoint, sizeof p->endpoint) == 0)
            return 0;
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            track(pid, 0);
            p->pid = 0;
            fprintf(stderr, "harness: psd exited early (status %d)\n", status);
            harness_psd_dump_log(p);
            return -1;
        }
        harness_pause_ms(5); /* polling the endpoint file, bounded by the deadline */
    }
    fprintf(stderr, "harness: psd did not listen within 20 s\n");
    harness_psd_dump_log(p);
    harness_psd_stop(p);
    return -1;
}

int harness_psd_stop(struct psd_proc *p)
{
    if (p->pid <= 0)
        return -1;
    kill(p->pid, SIGTERM);
    int rc = harness_wait(p->pid, 10000);
    if (rc == -1)
        fprintf(stderr, "harness: psd %d ignored SIGTERM for 10 s; killed\n", (int)p->pid);
    p->pid = 0;
    return rc;
}
