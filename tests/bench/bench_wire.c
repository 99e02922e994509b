/* Wire throughput and latency through the client library to real psd
 * processes (asp, 1 worker, 1 and 2 shards), beside a raw ZeroMQ
 * DEALER/ROUTER echo of the same sizes and window in the same run.
 *
 * The raw baseline does what a parameter server's wire must do and no
 * more: a small header frame plus the payload, zero-copy on both sides
 * (the client sends from one buffer it never touches; the echo server
 * sends back the message it received, or a preallocated buffer for pulls).
 * push: payload out, header back; pull: header out, payload back;
 * push-pull: payload both ways. With 2 shards each gets half the payload.
 * pull-view is a pull through psc_pull_view (the values read where they
 * arrived, then released), beside the same raw pull: psc_pull copies each
 * reply into the caller's buffer, which the raw client never does.
 *
 * Then latency (p50/p99) of a 64-byte and a 1 MiB push-pull at window 1
 * beside raw, the two sampled in alternating rounds, and sparse pushes:
 * 65,536 keys x 1 float into a 10M-element dense table (keyed push) and a
 * sparse table, 4,096 keys x 64 floats into a sparse table.
 *
 * Reports; never passes or fails on numbers.
 *   bench_wire [--psd PATH] [--seconds S] [--quick] [--only OP] [--size BYTES]
 *              [--window N] [--shards N] [--piece-bytes N|whole] [--pin] [--rounds N]
 *              [--rows R] [--dim D] [--life] [--shm] [--json PATH]
 * --only push|pull|push-pull|pull-view|sparse runs those rows alone, --size
 * (a multiple of 4096 up to 16 GiB; the table's size), --window (1 to 8)
 * and --shards (1 or 2) only those cells and no latency rows (for
 * profiling one path with perf or callgrind, and for the size curves of
 * size_bench.py). --only rows --rows R: a sparse table of R rows of --dim
 * floats (16) on 1 shard, filled by pushes of every key, then pulls and
 * pushes of random keys (65,536 a request, or R / 4): keys/s of each,
 * and psd's resident bytes a row. --life adds the same on a second table
 * with admission and eviction on, and the plain gather and scatter loops
 * over R rows in this process, on the same keys: the life cycle's cost
 * and psd end to end against the fastest a row store can be. --shm puts
 * the keys, gradients and pulled rows in the region shared with the
 * shard (psc_shm_alloc), as a worker on the shard's host can.
 * --piece-bytes sets the client's piece_bytes (whole: large requests are
 * not cut into pieces), to compare with the default in alternating runs.
 * --pin gives each side of the wire its own cores, as two hosts would have:
 * this process (both clients, their ZeroMQ I/O threads) on the last CPU it
 * may use, every server (psd and the raw echo) on the others. --rounds
 * (5) sets how many alternating rounds a cell's time is cut into: its
 * ratio is their median, so more rounds ride out more of a noisy
 * machine's bad seconds. */
#include "bench_stats.h"
#include "psclient.h"

#include "ps_clock.h"
#include "ps_cpus.h"
#include "ps_err.h"
#include "ps_limits.h"
#include "ps_opts.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define SHARDS_MAX 2
#define WINDOW_MAX 8
#define HDR_BYTES  32 /* the raw baseline's header frame, about psd's */
#define TIMEOUT_MS 30000
#define LAT_MAX    4000
#define ROUNDS_MAX 99 /* alternating psd and raw rounds a cell: --rounds, 5 unless told */

enum op { OP_PUSH, OP_PULL, OP_PUSH_PULL, OP_PULL_VIEW, OPS };
static const char *const op_names[] = {"push", "pull", "push-pull", "pull-view"};
#define ONLY_SPARSE OPS       /* --only sparse */
#define ONLY_ROWS   (OPS + 1) /* --only rows */

static void die(const char *what, const char *why)
{
    fprintf(stderr, "bench_wire: %s: %s\n", what, why);
    exit(1);
}

static void *xalloc(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, n ? n : 1) != 0)
        die("memory", "out of memory");
    memset(p, 0, n);
    return p;
}

/* ---- processes ------------------------------------------------------------ */

static pid_t children[2 * SHARDS_MAX + 2];
static int nchildren;

static void reap_all(void)
{
    for (int i = 0; i < nchildren; i++) {
        kill(children[i], SIGKILL);
        waitpid(children[i], NULL, 0);
    }
    nchildren = 0;
}

/* --pin: the servers' CPUs (n 0: not pinned) and the clients' one. */
static struct ps_cpus server_cpus;
static int client_cpu = -1;

/* --pin: splits the CPUs this process may use into the clients' (the last)
 * and the servers' (the rest), and moves this process to its own. */
static void pin_sides(void)
{
    ps_cpus_allowed_list(&server_cpus);
    if (server_cpus.n < 2)
        die("--pin", "needs at least 2 CPUs to split between clients and servers");
    client_cpu = server_cpus.cpu[--server_cpus.n];
    struct ps_cpus mine = {.n = 1, .cpu = {client_cpu}};
    char err[256];
    if (ps_cpus_pin_process(&mine, err, sizeof err) != 0)
        die("--pin", err);
}

static pid_t fork_child(void)
{
    pid_t pid = fork();
    if (pid < 0)
        die("fork", strerror(errno));
    char err[256];
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (server_cpus.n > 0 && ps_cpus_pin_process(&server_cpus, err, sizeof err) != 0) {
            fprintf(stderr, "bench_wire: --pin: %s\n", err); /* not die: its atexit reaps */
            _exit(1);
        }
    } else
        children[nchildren++] = pid;
    return pid;
}

/* Starts shard i of n; its endpoint goes to ep (polled from its file). */
static void start_psd(const char *bin, const char *dir, int i, int n, char *ep, size_t len)
{
    char file[256], si[16], sn[16];
    snprintf(file, sizeof file, "%s/ep%d-%d", dir, n, i);
    snprintf(si, sizeof si, "%d", i);
    snprintf(sn, sizeof sn, "%d", n);
    unlink(file);
    if (fork_child() == 0) {
        execl(bin, bin, "--listen", "tcp://127.0.0.1:0", "--endpoint-file", file, "--shard", si,
              "--shards", sn, "--consistency", "asp", "--workers", "1", "--log-level", "warn",
              (char *)NULL);
        _exit(127);
    }
    for (int t = 0; t < 2000; t++) {
        FILE *f = fopen(file, "r");
        if (f != NULL) {
            int ok = fgets(ep, (int)len, f) != NULL;
            fclose(f);
            if (ok) {
                ep[strcspn(ep, "\n")] = '\0';
                if (ep[0] != '\0')
                    return;
            }
        }
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    die("psd", "did not write its endpoint within 20 s");
}

/* ---- the raw ZeroMQ baseline ---------------------------------------------- */

/* The socket buffers psd and the client library use. */
static void set_bufs(void *s)
{
    int v = PS_SOCKET_BUFFER_BYTES;
    zmq_setsockopt(s, ZMQ_SNDBUF, &v, sizeof v);
    zmq_setsockopt(s, ZMQ_RCVBUF, &v, sizeof v);
}

/* Echo server: [id, hdr(op, bytes), payload?] -> [id, hdr, payload?]. */
static void raw_server(int fd, size_t max_bytes)
{
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_ROUTER);
    set_bufs(s);
    if (zmq_bind(s, "tcp://127.0.0.1:*") != 0)
        _exit(1);
    char ep[256];
    size_t len = sizeof ep;
    zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &len);
    if (write(fd, ep, strlen(ep) + 1) < 0)
        _exit(1);
    close(fd);
    unsigned char *pull_buf = xalloc(max_bytes);
    for (;;) {
        zmq_msg_t id, hdr, payload;
        zmq_msg_init(&id);
        zmq_msg_init(&hdr);
        zmq_msg_init(&payload);
        if (zmq_msg_recv(&id, s, 0) < 0 || zmq_msg_recv(&hdr, s, 0) < 0)
            _exit(1);
        int has = zmq_msg_more(&hdr);
        if (has && zmq_msg_recv(&payload, s, 0) < 0)
            _exit(1);
        unsigned char op = ((unsigned char *)zmq_msg_data(&hdr))[0];
        uint64_t bytes = 0;
        memcpy(&bytes, (unsigned char *)zmq_msg_data(&hdr) + 8, 8);
        int more = op != OP_PUSH;
        zmq_msg_send(&id, s, ZMQ_SNDMORE);
        zmq_msg_send(&hdr, s, more ? ZMQ_SNDMORE : 0);
        if (op == OP_PUSH_PULL) {
            zmq_msg_send(&payload, s, 0);
        } else if (op == OP_PULL) {
            zmq_msg_t out;
            zmq_msg_init_data(&out, pull_buf, bytes <= max_bytes ? bytes : max_bytes, NULL, NULL);
            zmq_msg_send(&out, s, 0);
        }
        zmq_msg_close(&payload);
    }
}

static void start_raw(size_t max_bytes, char *ep, size_t len)
{
    int p[2];
    if (pipe(p) != 0)
        die("pipe", strerror(errno));
    if (fork_child() == 0) {
        close(p[0]);
        raw_server(p[1], max_bytes);
        _exit(0);
    }
    close(p[1]);
    ssize_t n = read(p[0], ep, len - 1);
    close(p[0]);
    if (n <= 0)
        die("raw echo server", "did not start");
    ep[n] = '\0';
}

struct raw {
    void *ctx;
    void *socks[SHARDS_MAX];
    int n;
};

static void raw_connect(struct raw *r, char eps[][256], int n)
{
    r->ctx = zmq_ctx_new();
    r->n = n;
    for (int i = 0; i < n; i++) {
        r->socks[i] = zmq_socket(r->ctx, ZMQ_DEALER);
        int linger = 0;
        zmq_setsockopt(r->socks[i], ZMQ_LINGER, &linger, sizeof linger);
        set_bufs(r->socks[i]);
        if (zmq_connect(r->socks[i], eps[i]) != 0)
            die("raw connect", zmq_strerror(errno));
    }
}

static void raw_close(struct raw *r)
{
    for (int i = 0; i < r->n; i++)
        zmq_close(r->socks[i]);
    zmq_ctx_term(r->ctx);
}

static void raw_send(struct raw *r, int s, enum op op, const unsigned char *buf, size_t bytes)
{
    unsigned char hdr[HDR_BYTES] = {(unsigned char)op};
    uint64_t b = bytes;
    memcpy(hdr + 8, &b, 8);
    int payload = op != OP_PULL;
    zmq_send(r->socks[s], hdr, sizeof hdr, payload ? ZMQ_SNDMORE : 0);
    if (payload) {
        zmq_msg_t m;
        zmq_msg_init_data(&m, (void *)buf, bytes, NULL, NULL); /* zero-copy, never freed */
        zmq_msg_send(&m, r->socks[s], 0);
    }
}

static void raw_recv(struct raw *r, int s)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    do {
        if (zmq_msg_recv(&m, r->socks[s], 0) < 0)
            die("raw recv", zmq_strerror(errno));
    } while (zmq_msg_more(&m));
    zmq_msg_close(&m);
}

/* One request = a part to each shard; window requests outstanding. */
static double raw_run(struct raw *r, enum op op, size_t bytes, int window, double secs,
                      const unsigned char *buf, double *lat, int nlat)
{
    if (op == OP_PULL_VIEW) /* the raw client never copies */
        op = OP_PULL;
    size_t part = bytes / (size_t)r->n;
    uint64_t done = 0, sent = 0;
    double sent_at[WINDOW_MAX] = {0};
    double t0 = ps_mono_s(), end = t0 + secs;
    for (;;) {
        int issue =
            sent - done < (uint64_t)window && (lat ? sent < (uint64_t)nlat : ps_mono_s() < end);
        if (issue) {
            for (int s = 0; s < r->n; s++)
                raw_send(r, s, op, buf + (size_t)s * part, part);
            sent_at[sent % WINDOW_MAX] = ps_mono_s();
            sent++;
            continue;
        }
        if (done == sent)
            break;
        for (int s = 0; s < r->n; s++)
            raw_recv(r, s);
        if (lat)
            lat[done] = ps_mono_s() - sent_at[done % WINDOW_MAX];
        done++;
    }
    return (double)done / (ps_mono_s() - t0);
}

/* ---- through psclient ------------------------------------------------------ */

struct ps {
    struct psc_client *c;
    uint32_t t;
    int n;
};

static size_t piece_bytes; /* --piece-bytes; 0: the client's default */

static void ps_connect(struct ps *p, char eps[][256], int n, uint64_t size)
{
    const char *e[SHARDS_MAX];
    for (int i = 0; i < n; i++)
        e[i] = eps[i];
    struct psc_config cfg = {.struct_size = sizeof cfg,
                             .servers = e,
                             .nservers = (size_t)n,
                             .worker_id = 0,
                             .connect_timeout_ms = TIMEOUT_MS,
                             .piece_bytes = piece_bytes};
    char err[512];
    if (psc_create(&cfg, &p->c, err, sizeof err) != 0)
        die("psc_create", err);
    struct psc_table_spec s;
    psc_table_spec_init(&s, "w", size);
    s.lr = 1e-6f;
    if (psc_table_create(p->c, &s, TIMEOUT_MS, &p->t) != 0)
        die("create", psc_last_error(p->c));
    p->n = n;
}

static int ps_issue(struct ps *p, enum op op, uint64_t n, const float *g, float *out, uint64_t *tk)
{
    switch (op) {
    case OP_PUSH:
        return psc_push(p->c, p->t, 0, n, g, 0, tk);
    case OP_PULL:
        return psc_pull(p->c, p->t, 0, n, out, 0, tk);
    case OP_PULL_VIEW:
        return psc_pull_view(p->c, p->t, 0, n, 0, tk);
    default:
        return psc_push_pull(p->c, p->t, 0, n, g, out, 0, tk);
    }
}

static double ps_run(struct ps *p, enum op op, size_t bytes, int window, double secs,
                     const float *g, float **outs, double *lat, int nlat)
{
    uint64_t n = bytes / 4, done = 0, sent = 0, tk[WINDOW_MAX];
    double sent_at[WINDOW_MAX] = {0};
    double t0 = ps_mono_s(), end = t0 + secs;
    for (;;) {
        int issue =
            sent - done < (uint64_t)window && (lat ? sent < (uint64_t)nlat : ps_mono_s() < end);
        if (issue) {
            int k = (int)(sent % (uint64_t)window); /* outs[0..window) exist */
            if (ps_issue(p, op, n, g, outs[k], &tk[k]) != 0)
                die(op_names[op], psc_last_error(p->c));
            sent_at[k] = ps_mono_s();
            sent++;
            continue;
        }
        if (done == sent)
            break;
        int k = (int)(done % (uint64_t)window);
        if (psc_wait(p->c, tk[k], TIMEOUT_MS) != 0 ||
            (op == OP_PULL_VIEW && psc_view_release(p->c, tk[k]) != 0))
            die(op_names[op], psc_last_error(p->c));
        if (lat)
            lat[done] = ps_mono_s() - sent_at[k];
        done++;
    }
    return (double)done / (ps_mono_s() - t0);
}

/* What a measurement runs on: psd through the client, and raw. */
struct sides {
    struct ps *p;
    struct raw *r;
    const unsigned char *buf; /* the values sent */
    float **outs;             /* psd's pull buffers */
};

/* One measurement of a cell on both sides, psd's first when k is even and
 * raw's first when it is odd: this machine's speed drifts over seconds,
 * and a drift inside one long run of each side moved a cell's ratio by
 * tens of percent between runs. A timed run of secs each, requests/s into
 * *pr and *rr (when not NULL); or, with nlat, that many round trips each,
 * their latencies into lp and lr. */
static void both_sides(const struct sides *sd, int k, enum op op, size_t bytes, int window,
                       double secs, double *lp, double *lr, int nlat, double *pr, double *rr)
{
    double a = 0, c = 0;
    if (k % 2 == 0)
        a = ps_run(sd->p, op, bytes, window, secs, (const float *)sd->buf, sd->outs, lp, nlat);
    c = raw_run(sd->r, op, bytes, window, secs, sd->buf, lr, nlat);
    if (k % 2 != 0)
        a = ps_run(sd->p, op, bytes, window, secs, (const float *)sd->buf, sd->outs, lp, nlat);
    if (pr != NULL)
        *pr = a;
    if (rr != NULL)
        *rr = c;
}

/* ---- report ---------------------------------------------------------------- */

static FILE *json;
static int json_first = 1;

static void json_row(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void json_row(const char *fmt, ...)
{
    if (json == NULL)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs(json_first ? "\n  " : ",\n  ", json);
    vfprintf(json, fmt, ap);
    va_end(ap);
    json_first = 0;
}

static double pct(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_d);
    int i = (int)(q * (n - 1) + 0.5);
    return v[i];
}

static const char *size_name(size_t b, char *buf, size_t len)
{
    if (b >= (1u << 20))
        snprintf(buf, len, "%zu MiB", b >> 20);
    else if (b >= 1024)
        snprintf(buf, len, "%zu KiB", b >> 10);
    else
        snprintf(buf, len, "%zu B", b);
    return buf;
}

/* ---- sparse ------------------------------------------------------------------ */

/* n strictly increasing keys spread over [0, space): one per stride. */
static void random_keys(uint64_t *k, size_t n, uint64_t space, unsigned *seed)
{
    uint64_t stride = space / n;
    for (size_t i = 0; i < n; i++)
        k[i] = i * stride + (uint64_t)rand_r(seed) % stride;
}

enum via { VIA_TCP, VIA_IPC, VIA_SHM };

/* Resident bytes of a process, from /proc (0 when unknown). */
static uint64_t rss_bytes(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    uint64_t kb = 0;
    if (f == NULL)
        return 0;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "VmRSS: %" SCNu64, &kb) == 1)
            break;
    fclose(f);
    return kb * 1024;
}

enum { ROW_SETS = 8, ROW_BATCH = 65536 };

/* Keys a request of rows_bench: 65,536, or rows / 4 of a small table. */
static size_t row_keys(uint64_t rows)
{
    return rows / 4 < ROW_BATCH ? (size_t)(rows / 4) : ROW_BATCH;
}

/* --only rows --life: the plain gather and scatter loops (bench_stats.h)
 * over rows x dim floats, on the request keys rows_bench sends, for secs
 * each; their keys/s into rate[0] (gather) and rate[1] (scatter). */
static void loop_bench(uint64_t rows, uint32_t dim, double secs, double rate[2])
{
    size_t n = row_keys(rows);
    float *w = xalloc((size_t)rows * dim * sizeof(float));
    float *g = xalloc(n * dim * sizeof(float));
    uint64_t *keys = xalloc(ROW_SETS * n * sizeof(uint64_t));
    for (size_t i = 0; i < (size_t)rows * dim; i++)
        w[i] = 0.01f;
    for (size_t i = 0; i < n * dim; i++)
        g[i] = 1e-3f;
    unsigned seed = 11;
    for (int k = 0; k < ROW_SETS; k++)
        random_keys(keys + (size_t)k * n, n, rows, &seed);
    for (int op = 0; op < 2; op++) {
        uint64_t done = 0;
        double t0 = ps_mono_s(), end = t0 + secs;
        while (ps_mono_s() < end) {
            const uint64_t *k = keys + (done % ROW_SETS) * n;
            if (op == 0)
                bench_gather(g, w, k, n, dim);
            else
                bench_scatter(w, k, g, n, dim, 1e-6f);
            done++;
        }
        rate[op] = (double)(done * n) / (ps_mono_s() - t0);
    }
    printf("%-12s %5u %8zu %14s %14.0f %14.0f %12s  (a plain loop in this process)\n", "gather",
           dim, n, "", rate[0], rate[1], "");
    json_row("{\"bench\": \"rows\", \"case\": \"loop\", \"rows\": %" PRIu64
             ", \"dim\": %u, \"keys\": %zu, \"pull_keys_per_s\": %.1f, "
             "\"push_keys_per_s\": %.1f}",
             rows, dim, n, rate[0], rate[1]);
    free(w);
    free(g);
    free(keys);
}

/* --only rows: a sparse table of rows x dim, filled, then pulled and
 * pushed at random keys; psd is the shard started last (pid). With life,
 * the table admits an id at its second push and evicts (at its budget,
 * and rows not pushed in 2^30 pushes, so that age eviction's slices run
 * and find nothing): each key is pushed until it has a row. Keys/s of
 * the pulls and pushes into rate[0] and rate[1]. */
static void rows_bench(char eps[][256], pid_t pid, uint64_t rows, uint32_t dim, double secs,
                       int life, int window, int shm, double rate[2])
{
    enum { SETS = ROW_SETS, BATCH = ROW_BATCH };
    size_t n = row_keys(rows);
    if (n == 0)
        die("--rows", "expects at least 4 rows");
    size_t kbytes = (SETS * n > BATCH ? SETS * n : BATCH) * sizeof(uint64_t);
    size_t gbytes = (size_t)window * BATCH * dim * sizeof(float); /* one a request in flight */
    const char *e[1] = {eps[0]};
    struct psc_config cfg = {.struct_size = sizeof cfg,
                             .servers = e,
                             .nservers = 1,
                             .worker_id = 0,
                             .connect_timeout_ms = TIMEOUT_MS,
                             .local_ipc = 1,
                             .shm_bytes = shm ? kbytes + gbytes + 256 : 0};
    struct psc_client *c = NULL;
    char err[512];
    if (psc_create(&cfg, &c, err, sizeof err) != 0)
        die("psc_create", err);
    if (shm && psc_shm_shards(c) != 1)
        die("--shm", "the shard did not take the shared region");
    uint64_t rss0 = rss_bytes(pid);
    struct psc_table_spec s;
    psc_table_spec_init(&s, life ? "rows.life" : "rows", 0);
    s.sparse = 1;
    s.dim = dim;
    s.rows_max = rows;
    s.lr = 1e-6f;
    if (life) {
        s.admit_after = 2;
        s.evict_after = UINT64_C(1) << 30;
        s.evict_at_budget = 1;
        /* the sketch halves its counts every admit_counters / 4 pushed ids:
         * room for a pass over every id between halvings */
        s.admit_counters = 64;
        while (s.admit_counters < 8 * rows && s.admit_counters < (UINT64_C(1) << 30))
            s.admit_counters *= 2;
    }
    uint32_t t = 0;
    if (psc_table_create(c, &s, TIMEOUT_MS, &t) != 0)
        die("create", psc_last_error(c));
    /* in the region, keys, gradients and pulled rows go through it */
    uint64_t *keys = shm ? psc_shm_alloc(c, kbytes) : xalloc(kbytes);
    float *g = shm ? psc_shm_alloc(c, gbytes) : xalloc(gbytes);
    if (keys == NULL || g == NULL)
        die("--shm", "no room in the shared region");
    for (size_t i = 0; i < (size_t)window * BATCH * dim; i++)
        g[i] = 1e-3f;
    /* every row, in key order, BATCH a request (with life, until each id
     * has one: a halving of the sketch between an id's pushes can need a
     * third) */
    double t0 = ps_mono_s();
    for (int pass = 0; pass < (life ? 4 : 1); pass++)
        for (uint64_t k0 = 0; k0 < rows; k0 += BATCH) {
            size_t m = rows - k0 < BATCH ? (size_t)(rows - k0) : BATCH;
            for (size_t i = 0; i < m; i++)
                keys[i] = k0 + i;
            uint64_t tk = 0;
            if (psc_push_rows(c, t, keys, m, g, 0, &tk) != 0 || psc_wait(c, tk, TIMEOUT_MS) != 0)
                die("fill", psc_last_error(c));
        }
    double fill = (double)rows / (ps_mono_s() - t0);
    struct psc_shard_stats st = {.struct_size = sizeof st};
    struct psc_table_stats ts[4] = {{.struct_size = sizeof ts[0]}};
    if (psc_stats_tables(c, 0, TIMEOUT_MS, &st, ts, 4) != 0)
        die("stats", psc_last_error(c));
    for (uint32_t i = 0; i < st.tables && i < 4; i++)
        if (strcmp(ts[i].name, s.name) == 0 && ts[i].rows != rows) {
            fprintf(stderr,
                    "bench_wire: the fill left %" PRIu64 " of %" PRIu64 " ids of %s "
                    "without a row\n",
                    rows - ts[i].rows, rows, s.name);
            exit(1);
        }
    uint64_t rss = rss_bytes(pid);
    unsigned seed = 11;
    for (int k = 0; k < SETS; k++)
        random_keys(keys + (size_t)k * n, n, rows, &seed);
    double per_cpu[2]; /* keys per CPU second of both processes */
    for (int op = 0; op < 2; op++) {
        uint64_t done = 0;
        double cpu0 = bench_cpu_s(pid) + bench_cpu_s(getpid());
        double end = (t0 = ps_mono_s()) + secs;
        uint64_t tks[WINDOW_MAX], sent = 0;
        while (done < sent || ps_mono_s() < end) {
            if (sent - done == (uint64_t)window || (sent > done && ps_mono_s() >= end)) {
                if (psc_wait(c, tks[done % (uint64_t)window], TIMEOUT_MS) != 0)
                    die(op == 0 ? "pull rows" : "push rows", psc_last_error(c));
                done++;
                continue;
            }
            const uint64_t *k = keys + (sent % SETS) * n;
            float *b = g + (sent % (uint64_t)window) * BATCH * dim;
            uint64_t *tk = &tks[sent % (uint64_t)window];
            int rc =
                op == 0 ? psc_pull_rows(c, t, k, n, b, 0, tk) : psc_push_rows(c, t, k, n, b, 0, tk);
            if (rc != 0)
                die(op == 0 ? "pull rows" : "push rows", psc_last_error(c));
            sent++;
        }
        rate[op] = (double)(done * n) / (ps_mono_s() - t0);
        double cpu = bench_cpu_s(pid) + bench_cpu_s(getpid()) - cpu0;
        per_cpu[op] = cpu > 0 ? (double)(done * n) / cpu : 0;
    }
    double per_row = rss > rss0 ? (double)(rss - rss0) / (double)rows : 0;
    printf("%-12" PRIu64 " %5u %8zu %14.0f %14.0f %14.0f %12.1f%s\n", rows, dim, n, fill, rate[0],
           rate[1], per_row, life ? "  (admission and eviction on)" : "");
    printf("%-12s %5s %8s %14s %14.0f %14.0f %12s  (keys per CPU second, both processes)\n", "", "",
           "", "", per_cpu[0], per_cpu[1], "");
    json_row("{\"bench\": \"rows\", \"case\": \"%s\", \"rows\": %" PRIu64
             ", \"dim\": %u, \"keys\": %zu, \"fill_keys_per_s\": %.1f, "
             "\"pull_keys_per_s\": %.1f, \"push_keys_per_s\": %.1f, \"rss_bytes_per_row\": %.1f, "
             "\"pull_keys_per_cpu_s\": %.1f, \"push_keys_per_cpu_s\": %.1f}",
             life ? "life" : "psd", rows, dim, n, fill, rate[0], rate[1], per_row, per_cpu[0],
             per_cpu[1]);
    if (!shm) {
        free(keys);
        free(g);
    }
    psc_destroy(c);
}

static void sparse_bench(char eps[][256], double secs)
{
    const uint64_t space = 10000000;
    struct {
        const char *what;
        size_t nkeys;
        uint32_t dim;
        int sparse;
        enum via via;
    } cases[] = {
        {"keyed push, dense table of 10M", 65536, 1, 0, VIA_TCP},
        {"keyed push, dense 10M, local ipc", 65536, 1, 0, VIA_IPC},
        {"keyed push, dense 10M, shared memory", 65536, 1, 0, VIA_SHM},
        {"row push, sparse table, keys < 10M", 65536, 1, 1, VIA_TCP},
        {"row push, sparse 10M, local ipc", 65536, 1, 1, VIA_IPC},
        {"row push, sparse table dim 64", 4096, 64, 1, VIA_TCP},
    };
    enum { SETS = 8 };
    static const char *via_names[] = {"tcp", "ipc", "shm"};
    printf("\nsparse pushes, 1 shard, window 1 (tcp loopback unless named; local ipc and shared "
           "memory are what a worker on the shard's host uses)\n");
    printf("%-38s %8s %10s %12s %12s\n", "case", "keys", "floats", "requests/s", "keys/s");
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const char *e[1] = {eps[0]};
        size_t n = cases[ci].nkeys, d = cases[ci].dim;
        size_t kbytes = SETS * n * sizeof(uint64_t), gbytes = n * d * sizeof(float);
        struct psc_config cfg = {.struct_size = sizeof cfg,
                                 .servers = e,
                                 .nservers = 1,
                                 .worker_id = 0,
                                 .connect_timeout_ms = TIMEOUT_MS,
                                 .local_ipc = cases[ci].via != VIA_TCP,
                                 .shm_bytes = cases[ci].via == VIA_SHM ? kbytes + gbytes + 128 : 0};
        struct psc_client *c = NULL;
        char err[512];
        if (psc_create(&cfg, &c, err, sizeof err) != 0)
            die("psc_create", err);
        if (cases[ci].via != VIA_TCP && strncmp(psc_endpoint(c, 0), "ipc://", 6) != 0)
            die(cases[ci].what, "the client did not move to the shard's local endpoint");
        if (cases[ci].via == VIA_SHM && psc_shm_shards(c) != 1)
            die(cases[ci].what, "the shard did not take the shared region");
        struct psc_table_spec s;
        char name[32];
        snprintf(name, sizeof name, "sp%zu", ci);
        psc_table_spec_init(&s, name, cases[ci].sparse ? 0 : space);
        s.sparse = cases[ci].sparse;
        s.dim = cases[ci].sparse ? cases[ci].dim : 0;
        s.rows_max = cases[ci].sparse ? space : 0;
        uint32_t t = 0;
        if (psc_table_create(c, &s, TIMEOUT_MS, &t) != 0)
            die("create", psc_last_error(c));
        int shm = cases[ci].via == VIA_SHM;
        uint64_t *keys = shm ? psc_shm_alloc(c, kbytes) : xalloc(kbytes);
        float *g = shm ? psc_shm_alloc(c, gbytes) : xalloc(gbytes);
        if (keys == NULL || g == NULL)
            die(cases[ci].what, "no room in the shared region");
        unsigned seed = 7;
        for (size_t i = 0; i < n * d; i++)
            g[i] = 1e-3f;
        for (int k = 0; k < SETS; k++)
            random_keys(keys + (size_t)k * n, n, space, &seed);
        uint64_t done = 0, shm_sent0 = 0, shm_sent = 0, shm_received = 0;
        psc_shm_bytes(c, &shm_sent0, &shm_received);
        double t0 = ps_mono_s(), end = t0 + secs;
        while (ps_mono_s() < end) {
            uint64_t tk = 0;
            const uint64_t *k = keys + (done % SETS) * n;
            int rc = cases[ci].sparse ? psc_push_rows(c, t, k, n, g, 0, &tk)
                                      : psc_push_keys(c, t, k, g, n, 0, &tk);
            if (rc != 0 || psc_wait(c, tk, TIMEOUT_MS) != 0)
                die("sparse push", psc_last_error(c));
            done++;
        }
        double rps = (double)done / (ps_mono_s() - t0);
        psc_shm_bytes(c, &shm_sent, &shm_received);
        if (shm && shm_sent - shm_sent0 != done * n * (sizeof(uint64_t) + sizeof(float)))
            die(cases[ci].what, "not every key and value went through the region");
        printf("%-38s %8zu %10zu %12.0f %12.0f\n", cases[ci].what, n, n * d, rps, rps * (double)n);
        json_row("{\"bench\": \"sparse\", \"case\": \"%s\", \"via\": \"%s\", \"keys\": %zu, "
                 "\"dim\": %zu, \"requests_per_s\": %.1f}",
                 cases[ci].what, via_names[cases[ci].via], n, d, rps);
        if (!shm) {
            free(keys);
            free(g);
        }
        psc_destroy(c);
    }
}

/* ---- main ---------------------------------------------------------------- */

int main(int argc, char **argv)
{
    psc_malloc_tune(); /* as psworker does; raw shares the process */
    const char *psd = getenv("PSD_BIN");
    const char *json_path = NULL;
    double secs = 0.5;
    int quick = 0, only = -1, shards_only = 0, pin = 0, rounds = 5, window_only = 0, life = 0;
    int shm = 0;
    size_t size_only = 0;
    uint64_t rows = 0, dim = 16;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--psd") == 0 && i + 1 < argc)
            psd = argv[++i];
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
            if (ps_parse_f64(argv[++i], 0, 600, &secs) != 0 || secs == 0 || secs == 600)
                die("--seconds", "must be a number in (0, 600)");
        } else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json_path = argv[++i];
        else if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--pin") == 0)
            pin = 1;
        else if (strcmp(argv[i], "--life") == 0)
            life = 1;
        else if (strcmp(argv[i], "--shm") == 0)
            shm = 1;
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
            uint64_t v = 0;
            if (ps_parse_u64(argv[++i], 1, ROUNDS_MAX, &v) != 0)
                die("--rounds", "expects a whole number from 1 to 99");
            rounds = (int)v;
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            i++;
            for (int o = 0; o < OPS; o++)
                if (strcmp(argv[i], op_names[o]) == 0)
                    only = o;
            if (strcmp(argv[i], "sparse") == 0)
                only = ONLY_SPARSE;
            if (strcmp(argv[i], "rows") == 0)
                only = ONLY_ROWS;
            if (only < 0)
                die("--only", "expects push, pull, push-pull, pull-view, sparse or rows");
        } else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc) {
            uint64_t v = 0;
            if (ps_parse_u64(argv[++i], 4096, UINT64_C(16) << 30, &v) != 0 || v % 4096 != 0)
                die("--size", "expects a multiple of 4096 bytes, at most 16 GiB");
            size_only = (size_t)v;
        } else if (strcmp(argv[i], "--window") == 0 && i + 1 < argc) {
            uint64_t v = 0;
            if (ps_parse_u64(argv[++i], 1, WINDOW_MAX, &v) != 0)
                die("--window", "expects a whole number from 1 to 8");
            window_only = (int)v;
        } else if (strcmp(argv[i], "--rows") == 0 && i + 1 < argc) {
            if (ps_parse_u64(argv[++i], 4, UINT64_C(1) << 31, &rows) != 0)
                die("--rows", "expects a whole number from 4 to 2^31");
        } else if (strcmp(argv[i], "--dim") == 0 && i + 1 < argc) {
            if (ps_parse_u64(argv[++i], 1, 1024, &dim) != 0)
                die("--dim", "expects a whole number from 1 to 1024");
        } else if (strcmp(argv[i], "--shards") == 0 && i + 1 < argc) {
            uint64_t v = 0;
            if (ps_parse_u64(argv[++i], 1, SHARDS_MAX, &v) != 0)
                die("--shards", "expects 1 or 2");
            shards_only = (int)v;
        } else if (strcmp(argv[i], "--piece-bytes") == 0 && i + 1 < argc) {
            uint64_t v = SIZE_MAX;
            if (strcmp(argv[++i], "whole") != 0 &&
                ps_parse_u64(argv[i], PSC_PIECE_BYTES_MIN, 1u << 30, &v) != 0)
                die("--piece-bytes", "expects whole or a size in bytes, 4096 to 1 GiB");
            piece_bytes = (size_t)v;
        } else {
            fprintf(stderr, "usage: bench_wire [--psd PATH] [--seconds S] [--quick] [--only OP] "
                            "[--size BYTES] [--window N] [--shards N] [--piece-bytes N|whole] "
                            "[--pin] [--rounds N] [--rows R] [--dim D] [--life] [--json PATH]\n");
            return 2;
        }
    }
    if (psd == NULL)
        psd = "build-release/server/psd";
    if (access(psd, X_OK) != 0)
        die(psd, "not an executable psd (--psd PATH or PSD_BIN)");
    if (json_path != NULL && (json = fopen(json_path, "w")) == NULL)
        die(json_path, strerror(errno));
    if (json)
        fputs("[", json);
    atexit(reap_all);
    signal(SIGPIPE, SIG_IGN);
    if (pin)
        pin_sides();
    char dir[] = "/tmp/bench-wire-XXXXXX";
    if (mkdtemp(dir) == NULL)
        die("mkdtemp", strerror(errno));

    if ((only == ONLY_ROWS) != (rows > 0))
        die("--rows", "goes with --only rows, and --only rows needs it");
    if (life && only != ONLY_ROWS)
        die("--life", "goes with --only rows");
    if (shm && only != ONLY_ROWS)
        die("--shm", "goes with --only rows");
    size_t sizes[] = {4096, 65536, 1u << 20, 16u << 20};
    int windows[] = {1, 8}, nwin = 2;
    size_t nsizes = quick ? 3 : 4;
    if (size_only) { /* that size alone */
        sizes[0] = size_only;
        nsizes = 1;
    }
    if (window_only) {
        windows[0] = window_only;
        nwin = 1;
    }
    size_t max_bytes = only == ONLY_ROWS ? 4096 : sizes[nsizes - 1];
    int wmax = windows[nwin - 1];
    unsigned char *buf = xalloc(max_bytes);
    float *outs[WINDOW_MAX] = {NULL};
    for (int k = 0; k < wmax; k++)
        outs[k] = xalloc(max_bytes);
    for (size_t i = 0; i < max_bytes / 4; i++)
        ((float *)buf)[i] = 1e-3f;

    char pb[32];
    if (piece_bytes == SIZE_MAX)
        snprintf(pb, sizeof pb, "whole");
    else
        size_name(piece_bytes ? piece_bytes : PSC_PIECE_BYTES_DEFAULT, pb, sizeof pb);
    char where[PS_CPUS_MAX * 4 + 64] = "";
    if (pin) {
        char list[PS_CPUS_MAX * 4];
        ps_cpus_format(&server_cpus, list, sizeof list);
        snprintf(where, sizeof where, "; clients on CPU %d, servers on CPU%s %s", client_cpu,
                 server_cpus.n > 1 ? "s" : "", list);
    }
    printf("bench_wire: %.2f s per cell and side, in %d alternating rounds; psd asp 1 worker; "
           "client pieces: %s; raw = ZeroMQ DEALER/ROUTER echo, zero-copy%s\n\n",
           secs, rounds, pb, where);
    if (only != ONLY_ROWS)
        printf("%-6s %-9s %7s %3s %11s %11s %11s %11s %7s\n", "shards", "op", "size", "win",
               "psd req/s", "psd GB/s", "raw req/s", "raw GB/s", "ratio");
    char eps[SHARDS_MAX][256], reps[SHARDS_MAX][256], sb[32];
    if (only == ONLY_ROWS) {
        printf("sparse rows, 1 shard, window %d, %s: filled in key order, then random keys\n",
               window_only ? window_only : 1,
               shm ? "keys and rows through the shared region" : "local ipc");
        printf("%-12s %5s %8s %14s %14s %14s %12s\n", "rows", "dim", "keys", "fill keys/s",
               "pull keys/s", "push keys/s", "psd B/row");
        double loop[2], off[2], on[2];
        int window = window_only ? window_only : 1;
        if (life)
            loop_bench(rows, (uint32_t)dim, secs, loop);
        start_psd(psd, dir, 0, 1, eps[0], sizeof eps[0]);
        rows_bench(eps, children[nchildren - 1], rows, (uint32_t)dim, secs, 0, window, shm, off);
        if (life) {
            rows_bench(eps, children[nchildren - 1], rows, (uint32_t)dim, secs, 1, window, shm, on);
            printf("\nlife cycle on / off: pull %.0f%%, push %.0f%%; psd end to end / the plain "
                   "loop: pull %.0f%% (%.0f%% with life), push %.0f%% (%.0f%% with life)\n",
                   100 * on[0] / off[0], 100 * on[1] / off[1], 100 * off[0] / loop[0],
                   100 * on[0] / loop[0], 100 * off[1] / loop[1], 100 * on[1] / loop[1]);
        }
        reap_all();
    }
    for (int n = 1; n <= (only >= ONLY_SPARSE ? only == ONLY_SPARSE : SHARDS_MAX); n++) {
        if (shards_only && n != shards_only)
            continue;
        for (int i = 0; i < n; i++) {
            start_psd(psd, dir, i, n, eps[i], sizeof eps[i]);
            start_raw(max_bytes, reps[i], sizeof reps[i]);
        }
        struct ps p;
        struct raw r;
        ps_connect(&p, eps, n, max_bytes / 4);
        raw_connect(&r, reps, n);
        const struct sides sd = {&p, &r, buf, outs};
        for (int op = 0; op < OPS; op++)
            for (size_t si = 0; si < nsizes && (only < 0 || only == op); si++)
                for (int wi = 0; wi < nwin; wi++) {
                    size_t b = sizes[si];
                    int w = windows[wi];
                    /* warm both paths, then measure them in rounds */
                    both_sides(&sd, 0, op, b, w, secs / 10, NULL, NULL, 0, NULL, NULL);
                    double pr = 0, rr = 0, ratio[ROUNDS_MAX];
                    for (int k = 0; k < rounds; k++) {
                        double a, c;
                        both_sides(&sd, k, op, b, w, secs / rounds, NULL, NULL, 0, &a, &c);
                        pr += a / rounds;
                        rr += c / rounds;
                        ratio[k] = a / c;
                    }
                    double med = pct(ratio, rounds, 0.5), gb = (double)b / 1e9;
                    printf("%-6d %-9s %7s %3d %11.0f %11.3f %11.0f %11.3f %6.0f%%\n", n,
                           op_names[op], size_name(b, sb, sizeof sb), w, pr, pr * gb, rr, rr * gb,
                           100.0 * med);
                    json_row("{\"bench\": \"throughput\", \"shards\": %d, \"op\": \"%s\", "
                             "\"bytes\": %zu, \"window\": %d, \"psd_rps\": %.1f, "
                             "\"raw_rps\": %.1f, \"ratio\": %.4f, \"pieces\": \"%s\", "
                             "\"pinned\": %s, \"rounds\": %d}",
                             n, op_names[op], b, w, pr, rr, med, pb, pin ? "true" : "false",
                             rounds);
                }
        if (n == 1 && only == ONLY_SPARSE) {
            sparse_bench(eps, secs * 2);
        } else if (n == 1 && only < 0 && !size_only && !window_only) {
            printf("\nlatency, push-pull, window 1, 1 shard (microseconds)\n");
            printf("%7s %10s %10s %10s %10s %7s\n", "size", "psd p50", "psd p99", "raw p50",
                   "raw p99", "p50 %");
            static double lp[LAT_MAX], lr[LAT_MAX];
            const size_t lsizes[] = {64, 1u << 20};
            for (int li = 0; li < 2; li++) {
                int cnt = lsizes[li] < 4096 ? LAT_MAX : 400, part = cnt / rounds;
                /* warmed, then in rounds as the cells above; the
                 * percentiles over all the rounds' samples */
                both_sides(&sd, 0, OP_PUSH_PULL, lsizes[li], 1, 0, lp, lr, cnt / 4, NULL, NULL);
                for (int k = 0; k < rounds; k++)
                    both_sides(&sd, k, OP_PUSH_PULL, lsizes[li], 1, 0, lp + k * part, lr + k * part,
                               part, NULL, NULL);
                cnt = part * rounds;
                double p50 = pct(lp, cnt, 0.5) * 1e6, p99 = pct(lp, cnt, 0.99) * 1e6;
                double r50 = pct(lr, cnt, 0.5) * 1e6, r99 = pct(lr, cnt, 0.99) * 1e6;
                printf("%7s %10.1f %10.1f %10.1f %10.1f %6.0f%%\n",
                       size_name(lsizes[li], sb, sizeof sb), p50, p99, r50, r99, 100.0 * r50 / p50);
                json_row("{\"bench\": \"latency\", \"bytes\": %zu, \"psd_p50_us\": %.2f, "
                         "\"psd_p99_us\": %.2f, \"raw_p50_us\": %.2f, \"raw_p99_us\": %.2f}",
                         lsizes[li], p50, p99, r50, r99);
            }
            sparse_bench(eps, secs * 2);
            printf("\n");
        }
        psc_destroy(p.c);
        raw_close(&r);
        reap_all();
    }
    if (json) {
        fputs("\n]\n", json);
        fclose(json);
    }
    printf("\nratio = median over the %d rounds of psd requests/s over raw requests/s, same size "
           "and window; latency p50 %% = raw p50 over psd p50\n",
           rounds);
    for (int k = 0; k < wmax; k++)
        free(outs[k]);
    free(buf);
    for (int n = 1; n <= SHARDS_MAX; n++)
        for (int i = 0; i < n; i++) {
            char file[300];
            snprintf(file, sizeof file, "%s/ep%d-%d", dir, n, i);
            unlink(file);
        }
    rmdir(dir);
    return 0;
}
