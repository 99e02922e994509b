/* scale_bench: what each connected worker costs psd. For W = 1, 10, 100,
 * 1000 light clients (libpsclient, --per-process of them in each forked
 * process, one thread driving them all, over tcp loopback) of --shards 1
 * or 2 shards, in asp and in bsp, on a small dense table (--table dense:
 * push-pulls of its --size floats) or a sparse one (--table sparse:
 * push-pulls of --size / 8 rows of 8 floats, the same keys for every
 * worker, a hot set of embeddings); psd's numbers are summed over the
 * shards:
 *
 *   - psd's resident memory per idle worker: (VmRSS with W clients
 *     connected, each with its table handle, heartbeating - VmRSS before
 *     any) / W. Kernel socket buffers are not in it; psd's ZeroMQ pipes,
 *     its per-worker records and the bsp round's buffers are;
 *   - heartbeats' share of a core: psd's CPU time over the idle phase
 *     (every client says it is alive once a second) / its wall time;
 *   - asp: push-pulls per second over all clients (each client one
 *     request in flight), and psd's CPU per request;
 *   - bsp: the time a round takes (every worker's push-pull at one clock)
 *     and psd's CPU per round and per worker-request (a sparse table
 *     applies rows on arrival in every mode: its bsp "round" is the
 *     workers' requests at one clock, none waiting).
 * The ratio printed beside each is against W = 10 (1 where it is not
 * measured): a cost that grows faster than W shows as a per-worker or
 * per-request number that grows with W.
 *
 * A process's clients share one ZeroMQ context (psc_config.zmq_context:
 * one I/O thread for all of them); --context own gives each its own, as
 * a client made without one has.
 *
 *   scale_bench [--psd PATH] [--workers 1,10,100,1000] [--per-process N]
 *               [--context shared|own] [--shards 1|2] [--table dense|sparse]
 *               [--size N] [--seconds S] [--rounds R] [--idle S] [--json PATH]
 * Exits 1 when a process or a request fails; never on a number. */
#define _GNU_SOURCE
#include "bench_stats.h"
#include "psclient.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define TIMEOUT_MS  60000
#define WORKERS_MAX 4096
#define PROCS_MAX   256
#define SHARDS_MAX  2
#define SPARSE_DIM  8

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static pid_t kids[PROCS_MAX + 1];
static int nkids;

static void reap_all(void)
{
    for (int i = 0; i < nkids; i++) {
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
    }
    nkids = 0;
}

static void die(const char *what, const char *why)
{
    fprintf(stderr, "scale_bench: %s: %s\n", what, why);
    reap_all();
    exit(1);
}

/* psd's resident kB and CPU seconds (user + system), from /proc. */
static long rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    if (f != NULL)
        fclose(f);
    return kb;
}

static pid_t start_psd(const char *bin, const char *mode, int workers, int shard, int shards,
                       char *ep, size_t len)
{
    char file[64], w[16], sh[16], shs[16];
    snprintf(file, sizeof file, "/tmp/scale_bench.%d.ep", (int)getpid());
    snprintf(w, sizeof w, "%d", workers);
    snprintf(sh, sizeof sh, "%d", shard);
    snprintf(shs, sizeof shs, "%d", shards);
    unlink(file);
    pid_t pid = fork();
    if (pid < 0)
        die("fork", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(bin, bin, "--listen", "tcp://127.0.0.1:0", "--endpoint-file", file, "--consistency",
              mode, "--workers", w, "--shard", sh, "--shards", shs, "--worker-timeout", "30",
              "--log-level", "warn", (char *)NULL);
        _exit(127);
    }
    kids[nkids++] = pid;
    for (double end = now_s() + 10; now_s() < end; usleep(10000)) {
        FILE *f = fopen(file, "r");
        int ok = f != NULL && fgets(ep, (int)len, f) != NULL;
        if (f != NULL)
            fclose(f);
        if (ok && (ep[strcspn(ep, "\n")] = '\0', ep[0] != '\0')) {
            unlink(file);
            return pid;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid)
            die("psd", "exited at start");
    }
    die("psd", "no endpoint within 10 s");
    return -1;
}

/* What a client process reports. */
struct report {
    double requests, seconds, rounds;
    int failed;
    char error[256];
};

struct run_args {
    const char *const *eps; /* shards endpoints */
    int shards, sparse;
    const char *mode;
    int first, n; /* worker ids [first, first + n) */
    int workers;
    uint64_t size;
    double seconds;
    int rounds;
    int shared; /* one ZeroMQ context for the process's clients */
};

static int read_byte(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    unsigned char b;
    if (poll(&p, 1, timeout_ms) <= 0 || read(fd, &b, 1) != 1)
        return -1;
    return b;
}

/* A client process: connects its clients, says 'R', heartbeats until the
 * parent says 'L', runs the load, writes its report. */
static void client_proc(const struct run_args *a, int ctl, int out)
{
    struct psc_client **c = calloc((size_t)a->n, sizeof *c);
    uint32_t *t = calloc((size_t)a->n, sizeof *t);
    uint64_t *tk = calloc((size_t)a->n, sizeof *tk);
    float *g = calloc(a->size, sizeof *g), *w = calloc((size_t)a->n * a->size, sizeof *w);
    struct report r = {0};
    void *ctx = a->shared ? zmq_ctx_new() : NULL;
    for (uint64_t i = 0; i < a->size; i++)
        g[i] = 1e-6f;
    size_t nrows = (size_t)(a->size / SPARSE_DIM);
    uint64_t *keys = calloc(nrows ? nrows : 1, sizeof *keys);
    for (size_t j = 0; j < nrows; j++)
        keys[j] = j * 13u; /* every worker's: a hot set */
    for (int i = 0; i < a->n && !r.failed; i++) {
        struct psc_config cfg = {.struct_size = sizeof cfg,
                                 .servers = a->eps,
                                 .nservers = (size_t)a->shards,
                                 .worker_id = (uint32_t)(a->first + i),
                                 .connect_timeout_ms = TIMEOUT_MS,
                                 .zmq_context = ctx};
        struct psc_table_spec s;
        psc_table_spec_init(&s, "w", a->sparse ? 0 : a->size);
        s.lr = 1e-3f;
        if (a->sparse) {
            s.sparse = 1;
            s.dim = SPARSE_DIM;
            s.rows_max = 1u << 20;
        }
        if (psc_create(&cfg, &c[i], r.error, sizeof r.error) != 0 ||
            psc_table_create(c[i], &s, TIMEOUT_MS, &t[i]) != 0) {
            if (c[i] != NULL)
                snprintf(r.error, sizeof r.error, "%s", psc_last_error(c[i]));
            r.failed = 1;
        }
    }
    if (write(out, "R", 1) != 1)
        _exit(1);
    int cmd;
    while ((cmd = read_byte(ctl, 100)) != 'L') { /* idle: alive once a second */
        if (cmd == 'Q')
            _exit(0);
        for (int i = 0; i < a->n && !r.failed; i++)
            psc_heartbeat(c[i]);
    }
    int bsp = strcmp(a->mode, "bsp") == 0;
    double t0 = now_s();
    for (uint64_t clock = 0; !r.failed; clock++) {
        if (bsp ? clock >= (uint64_t)a->rounds : now_s() - t0 >= a->seconds)
            break;
        for (int i = 0; i < a->n && !r.failed; i++)
            if ((a->sparse ? psc_push_pull_rows(c[i], t[i], keys, nrows, g, w + (size_t)i * a->size,
                                                bsp ? clock : 0, &tk[i])
                           : psc_push_pull(c[i], t[i], 0, a->size, g, w + (size_t)i * a->size,
                                           bsp ? clock : 0, &tk[i])) != 0) {
                snprintf(r.error, sizeof r.error, "push-pull: %s", psc_last_error(c[i]));
                r.failed = 1;
            }
        for (int i = 0; i < a->n && !r.failed; i++)
            if (psc_wait(c[i], tk[i], TIMEOUT_MS) != 0) {
                snprintf(r.error, sizeof r.error, "wait: %s", psc_last_error(c[i]));
                r.failed = 1;
            }
        r.requests += a->n;
        r.rounds += 1;
    }
    r.seconds = now_s() - t0;
    if (write(out, &r, sizeof r) != (ssize_t)sizeof r)
        _exit(1);
    for (int i = 0; i < a->n; i++)
        psc_destroy(c[i]);
    if (ctx != NULL)
        zmq_ctx_term(ctx);
    _exit(0);
}

struct result {
    const char *mode;
    int shards, sparse;
    int workers, procs;
    double rss_base_kb, rss_idle_kb, per_worker_kb, beat_share, rate, cpu_per_req_us, round_ms;
};

static double cpu_all(const pid_t *sp, int n)
{
    double t = 0;
    for (int i = 0; i < n; i++)
        t += bench_cpu_s(sp[i]);
    return t;
}

static long rss_all(const pid_t *sp, int n)
{
    long t = 0;
    for (int i = 0; i < n; i++)
        t += rss_kb(sp[i]);
    return t;
}

static void measure(const char *psd, const char *mode, int workers, int per, int shared, int shards,
                    int sparse, uint64_t size, double seconds, int rounds, double idle,
                    struct result *res)
{
    static char ep[SHARDS_MAX][256];
    const char *eps[SHARDS_MAX];
    pid_t sp[SHARDS_MAX];
    for (int i = 0; i < shards; i++) {
        sp[i] = start_psd(psd, mode, workers, i, shards, ep[i], sizeof ep[i]);
        eps[i] = ep[i];
    }
    usleep(200000);
    long base = rss_all(sp, shards);
    int procs = (workers + per - 1) / per;
    if (procs > PROCS_MAX)
        die("--per-process", "too many processes for this many workers");
    int ctl[PROCS_MAX], out[PROCS_MAX];
    for (int p = 0; p < procs; p++) {
        int a[2], b[2];
        if (pipe(a) != 0 || pipe(b) != 0)
            die("pipe", strerror(errno));
        struct run_args ra = {.eps = eps,
                              .shards = shards,
                              .sparse = sparse,
                              .mode = mode,
                              .first = p * per,
                              .n = workers - p * per < per ? workers - p * per : per,
                              .workers = workers,
                              .size = size,
                              .seconds = seconds,
                              .rounds = rounds,
                              .shared = shared};
        pid_t pid = fork();
        if (pid < 0)
            die("fork", strerror(errno));
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            close(a[1]);
            close(b[0]);
            client_proc(&ra, a[0], b[1]);
        }
        kids[nkids++] = pid;
        close(a[0]);
        close(b[1]);
        ctl[p] = a[1];
        out[p] = b[0];
    }
    for (int p = 0; p < procs; p++)
        if (read_byte(out[p], 120000) != 'R')
            die("a client process", "did not connect its clients within 120 s");
    usleep(500000); /* the connections settle */
    double c0 = cpu_all(sp, shards), t0 = now_s();
    usleep((useconds_t)(idle * 1e6));
    double c1 = cpu_all(sp, shards), t1 = now_s();
    long idle_kb = rss_all(sp, shards);
    for (int p = 0; p < procs; p++)
        if (write(ctl[p], "L", 1) != 1)
            die("pipe", strerror(errno));
    double reqs = 0, secs = 0, rnds = 0;
    for (int p = 0; p < procs; p++) {
        struct report r;
        struct pollfd pf = {.fd = out[p], .events = POLLIN};
        if (poll(&pf, 1, (int)(seconds * 1000) + TIMEOUT_MS * 2) <= 0 ||
            read(out[p], &r, sizeof r) != (ssize_t)sizeof r)
            die("a client process", "no report");
        if (r.failed)
            die("a client", r.error);
        reqs += r.requests;
        secs = r.seconds > secs ? r.seconds : secs;
        rnds = r.rounds;
        close(out[p]);
        close(ctl[p]);
    }
    double c2 = cpu_all(sp, shards);
    reap_all();
    res->mode = mode;
    res->shards = shards;
    res->sparse = sparse;
    res->workers = workers;
    res->procs = procs;
    res->rss_base_kb = (double)base;
    res->rss_idle_kb = (double)idle_kb;
    res->per_worker_kb = (double)(idle_kb - base) / workers;
    res->beat_share = (c1 - c0) / (t1 - t0);
    res->rate = reqs / secs;
    res->cpu_per_req_us = (c2 - c1) / reqs * 1e6;
    res->round_ms = strcmp(mode, "bsp") == 0 ? secs / rnds * 1e3 : 0;
}

int main(int argc, char **argv)
{
    const char *psd = "build-release/server/psd", *json = NULL, *list = "1,10,100,1000";
    int per = 100, rounds = 50, shared = 1, shards = 1, sparse = 0;
    uint64_t size = 1024;
    double seconds = 2, idle = 3;
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) {
            fprintf(stderr, "scale_bench: %s needs a value\n", a);
            return 2;
        } else if (strcmp(a, "--psd") == 0) {
            psd = v;
        } else if (strcmp(a, "--workers") == 0) {
            list = v;
        } else if (strcmp(a, "--per-process") == 0 && atoi(v) >= 1 && atoi(v) <= 1000) {
            per = atoi(v);
        } else if (strcmp(a, "--size") == 0 && atol(v) >= 1 && atol(v) <= (1 << 24)) {
            size = (uint64_t)atol(v);
        } else if (strcmp(a, "--seconds") == 0 && atof(v) > 0 && atof(v) <= 600) {
            seconds = atof(v);
        } else if (strcmp(a, "--rounds") == 0 && atoi(v) >= 1 && atoi(v) <= 100000) {
            rounds = atoi(v);
        } else if (strcmp(a, "--idle") == 0 && atof(v) > 0 && atof(v) <= 600) {
            idle = atof(v);
        } else if (strcmp(a, "--context") == 0 &&
                   (strcmp(v, "shared") == 0 || strcmp(v, "own") == 0)) {
            shared = strcmp(v, "shared") == 0;
        } else if (strcmp(a, "--shards") == 0 && atoi(v) >= 1 && atoi(v) <= SHARDS_MAX) {
            shards = atoi(v);
        } else if (strcmp(a, "--table") == 0 &&
                   (strcmp(v, "dense") == 0 || strcmp(v, "sparse") == 0)) {
            sparse = strcmp(v, "sparse") == 0;
        } else if (strcmp(a, "--json") == 0) {
            json = v;
        } else {
            fprintf(stderr, "scale_bench: unknown option or bad value '%s %s'\n", a, v);
            return 2;
        }
    }
    int ws[16], nw = 0;
    for (const char *p = list; *p && nw < 16;) {
        char *end;
        long w = strtol(p, &end, 10);
        if (end == p || w < 1 || w > WORKERS_MAX || (*end != ',' && *end != '\0')) {
            fprintf(stderr, "scale_bench: --workers '%s': counts 1..%d, comma-separated\n", list,
                    WORKERS_MAX);
            return 2;
        }
        ws[nw++] = (int)w;
        p = *end ? end + 1 : end;
    }
    signal(SIGPIPE, SIG_IGN);
    const char *modes[2] = {"asp", "bsp"};
    struct result res[2][16];
    if (sparse && size < SPARSE_DIM) {
        fprintf(stderr, "scale_bench: --table sparse needs --size %d or more\n", SPARSE_DIM);
        return 2;
    }
    char what[96];
    if (sparse)
        snprintf(what, sizeof what, "a sparse table (%llu rows of %d a request)",
                 (unsigned long long)(size / SPARSE_DIM), SPARSE_DIM);
    else
        snprintf(what, sizeof what, "a %llu-float dense table", (unsigned long long)size);
    printf("%d psd shard%s (numbers summed), %s, W clients over tcp loopback (%d a "
           "process, %s); idle %.0f s, asp %.0f s, bsp %d rounds\n",
           shards, shards > 1 ? "s" : "", what, per,
           shared ? "one ZeroMQ context each process"
                  : "a "
                    "ZeroMQ context each client",
           idle, seconds, rounds);
    printf("%4s %6s %10s %12s %10s %12s %12s %10s\n", "mode", "W", "psd MiB", "kB/worker",
           "beats %", "requests/s", "cpu us/req", "round ms");
    for (int m = 0; m < 2; m++)
        for (int i = 0; i < nw; i++) {
            struct result *r = &res[m][i];
            measure(psd, modes[m], ws[i], per, shared, shards, sparse, size, seconds, rounds, idle,
                    r);
            printf("%4s %6d %10.1f %12.1f %9.2f%% %12.0f %12.1f %10.2f\n", r->mode, r->workers,
                   r->rss_idle_kb / 1024, r->per_worker_kb, r->beat_share * 100, r->rate,
                   r->cpu_per_req_us, r->round_ms);
            fflush(stdout);
        }
    int ref = -1; /* the ratios' baseline: W = 10 where it was run */
    for (int i = 0; i < nw; i++)
        if (ws[i] == 10)
            ref = i;
    if (ref >= 0) {
        printf("against W = 10:");
        for (int m = 0; m < 2; m++)
            for (int i = 0; i < nw; i++)
                printf(" %s W=%d requests/s %.2fx, cpu/request %.2fx%s", modes[m], ws[i],
                       res[m][i].rate / res[m][ref].rate,
                       res[m][i].cpu_per_req_us / res[m][ref].cpu_per_req_us,
                       m == 1 && i == nw - 1 ? "\n" : ";");
    }
    if (json != NULL) {
        FILE *f = fopen(json, "w");
        if (f == NULL)
            die(json, strerror(errno));
        fprintf(f, "[");
        for (int m = 0; m < 2; m++)
            for (int i = 0; i < nw; i++) {
                const struct result *r = &res[m][i];
                fprintf(f,
                        "%s\n {\"mode\": \"%s\", \"shards\": %d, \"table\": \"%s\", "
                        "\"workers\": %d, \"processes\": %d, "
                        "\"psd_rss_base_kb\": %.0f, \"psd_rss_idle_kb\": %.0f, "
                        "\"kb_per_idle_worker\": %.2f, \"heartbeat_cpu_share\": %.5f, "
                        "\"requests_per_s\": %.1f, \"psd_cpu_us_per_request\": %.2f, "
                        "\"round_ms\": %.3f}",
                        m || i ? "," : "", r->mode, r->shards, r->sparse ? "sparse" : "dense",
                        r->workers, r->procs, r->rss_base_kb, r->rss_idle_kb, r->per_worker_kb,
                        r->beat_share, r->rate, r->cpu_per_req_us, r->round_ms);
            }
        fprintf(f, "\n]\n");
        fclose(f);
    }
    return 0;
}
