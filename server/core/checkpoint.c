/* This shard's checkpoints (checkpoint.h). */
#include "checkpoint.h"

#include "catalog.h"
#include "counters.h"
#include "dedup.h"
#include "live.h"
#include "reply.h"
#include "snapshot.h"

#include "ps_clock.h"
#include "ps_err.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

struct psd_autosave {
    char *dir; /* NULL: off */
    uint64_t every_ms, last_ms, written;
    uint64_t ok_ms;      /* when the last one was written */
    uint64_t current_ms; /* when the newest was last found to hold the current state */
    uint64_t state;      /* psd_state_version() the newest holds */
    int pending;         /* asked for (psctl checkpoint) while a round was in progress */
    int held;            /* psd_checkpoint_hold */
    /* the forked writer of an interval checkpoint (child 0: none), the
     * pipe it answers on, and the state it was forked with */
    pid_t child;
    int child_fd;
    uint64_t child_state, child_t0;
    uint32_t child_tables;
    uint64_t fork_us;                    /* how long the last fork held the loop */
    char path[PS_PATH_MAX];              /* the newest written */
    const uint64_t *pos_epoch, *pos_seq; /* psd_checkpoint_position */
    uint64_t restored_epoch, restored_seq;
    uint64_t label_epoch, label_seq; /* the newest written's position */
    uint64_t child_epoch, child_seq; /* the forked writer's */
};

/* The replication position the state is at now (checkpoint.h). */
static void position(const struct psd *s, uint64_t *epoch, uint64_t *seq)
{
    const struct psd_autosave *a = s->save;
    if (a->pos_epoch != NULL && *a->pos_epoch != 0) {
        *epoch = *a->pos_epoch;
        *seq = *a->pos_seq;
    } else { /* a replica that has not followed or led yet holds what it restored */
        *epoch = a->restored_epoch;
        *seq = a->restored_seq;
    }
}

struct psd_autosave *psd_autosave_create(const char *dir, uint64_t every_ms)
{
    struct psd_autosave *a = calloc(1, sizeof *a);
    if (a == NULL || (dir != NULL && (a->dir = strdup(dir)) == NULL)) {
        free(a);
        return NULL;
    }
    a->every_ms = every_ms;
    return a;
}

void psd_autosave_destroy(struct psd_autosave *a)
{
    if (a != NULL)
        free(a->dir);
    free(a);
}

void psd_set_checkpoint_every(struct psd *s, uint64_t ms)
{
    s->save->every_ms = ms;
}

uint64_t psd_checkpoints_written(const struct psd *s)
{
    return s->save->written;
}

uint64_t psd_checkpoint_last_ms(const struct psd *s)
{
    return s->save->last_ms;
}

const char *psd_checkpoint_current(const struct psd *s)
{
    const struct psd_autosave *a = s->save;
    uint64_t e, q;
    position(s, &e, &q);
    /* a replica's newest must also carry the position it is at: a clean
     * stop records that position in etcd */
    return a->written > 0 && psd_state_version(s) == a->state && e == a->label_epoch &&
                   q == a->label_seq
               ? a->path
               : NULL;
}

int psd_checkpoints_on(const struct psd *s)
{
    return s->save->dir != NULL;
}

/* ---- the shard as a snapshot, and back ---------------------------------- */

struct peers {
    struct psd_snapshot_peer *p;
    size_t n, cap;
};

static void count_peer(void *ctx, const struct psd_dedup_entry *e)
{
    (void)e;
    ((struct peers *)ctx)->cap++;
}

static void copy_peer(void *ctx, const struct psd_dedup_entry *e)
{
    struct peers *ps = ctx;
    if (ps->n == ps->cap)
        return;
    struct psd_snapshot_peer *p = &ps->p[ps->n++];
    p->worker_id = e->worker_id;
    p->session = e->session;
    p->last_applied = e->last_applied;
    p->has_bits = 1;
    memcpy(p->bits, e->bits, sizeof p->bits);
}

int psd_checkpoint_write(struct psd *s, const char *dir, char *path, size_t pathlen, char *err,
                         size_t errlen)
{
    struct psd_snapshot snap = {.shard = s->conf.shard,
                                .shards = s->conf.shards,
                                .cons = s->conf.cons,
                                .ntables = psd_ntables(s),
                                .duplicates_dropped = psd_dedup_dropped(s)};
    position(s, &snap.repl_epoch, &snap.repl_seq);
    struct peers ps = {0};
    psd_dedup_each(s, count_peer, &ps);
    ps.p = calloc(ps.cap ? ps.cap : 1, sizeof *ps.p);
    snap.tables = calloc(snap.ntables ? snap.ntables : 1, sizeof *snap.tables);
    int rc = PS_ENOMEM;
    if (ps.p == NULL || snap.tables == NULL) {
        snprintf(err, errlen, "checkpoint: out of memory");
    } else {
        psd_dedup_each(s, copy_peer, &ps);
        snap.peers = ps.p;
        snap.npeers = ps.n;
        for (uint32_t i = 0; i < snap.ntables; i++)
            snap.tables[i] = psd_table_at(s, i);
        rc = psd_snapshot_write(&snap, dir, path, pathlen, err, errlen);
    }
    free(ps.p);
    free(snap.tables);
    return rc;
}

int psd_checkpoint_load(struct psd *s, const char *path, char *err, size_t errlen)
{
    if (psd_ntables(s) != 0)
        return ps_errf(PS_ESTATE, err, errlen, "this shard holds tables already");
    struct psd_snapshot snap = {
        .shard = s->conf.shard, .shards = s->conf.shards, .cons = s->conf.cons};
    int rc = psd_snapshot_read(&snap, path, s->conf.table_bytes_max, err, errlen);
    if (rc != 0)
        return rc;
    for (uint32_t i = 0; i < snap.ntables; i++) {
        snap.tables[i]->pool = s->conf.pool;
        psd_tables_add(s, snap.tables[i]); /* the snapshot holds at most PS_TABLES_MAX */
    }
    snap.ntables = 0; /* the catalog's now */
    for (size_t i = 0; i < snap.npeers; i++) {
        const struct psd_snapshot_peer *p = &snap.peers[i];
        struct psd_dedup_entry e = {p->worker_id, p->session, p->last_applied,
                                    p->has_bits ? p->bits : NULL};
        psd_dedup_restore(s, &e);
        psd_live_restored(s, p->worker_id); /* dropped if it stays silent */
    }
    psd_dedup_set_dropped(s, snap.duplicates_dropped);
    s->save->restored_epoch = snap.repl_epoch;
    s->save->restored_seq = snap.repl_seq;
    psd_snapshot_free(&snap);
    return 0;
}

void psd_checkpoint_position(struct psd *s, const uint64_t *epoch, const uint64_t *seq)
{
    s->save->pos_epoch = epoch;
    s->save->pos_seq = seq;
}

void psd_checkpoint_restored_at(const struct psd *s, uint64_t *epoch, uint64_t *seq)
{
    *epoch = s->save->restored_epoch;
    *seq = s->save->restored_seq;
}

enum psd_restored psd_checkpoint_restore(struct psd *s, const char *dir, char *path, size_t pathlen)
{
    int64_t seqs[64];
    size_t n = psd_snapshot_seqs(dir, s->conf.shard, s->conf.shards, seqs, 64);
    for (size_t i = 0; i < n; i++) {
        char err[512];
        psd_snapshot_path(dir, s->conf.shard, s->conf.shards, seqs[i], path, pathlen);
        if (psd_checkpoint_load(s, path, err, sizeof err) == 0)
            return PSD_RESTORED;
        PS_LOG(s->conf.log, PS_LOG_WARN, S0601, "checkpoint %s is bad (%s); trying an older one",
               path, err);
    }
    return PSD_RESTORED_NONE;
}

/* ---- when they are written ---------------------------------------------- */

/* Writes a checkpoint (the shard is between rounds); out gets the path
 * written, or the error. */
static int write_checkpoint(struct psd *s, const char *why, char *out, size_t outlen)
{
    char path[PS_PATH_MAX], err[512];
    uint64_t t0 = (uint64_t)ps_mono_ms();
    struct psd_autosave *a = s->save;
    int rc = psd_checkpoint_write(s, a->dir, path, sizeof path, err, sizeof err);
    a->last_ms = (uint64_t)ps_mono_ms();
    if (rc != 0) {
        PS_LOG(s->conf.log, PS_LOG_ERROR, S0602, "%s", err);
        snprintf(out, outlen, "%s", err);
        return rc;
    }
    a->written++;
    a->ok_ms = a->current_ms = a->last_ms;
    a->state = psd_state_version(s);
    position(s, &a->label_epoch, &a->label_seq);
    a->pending = 0;
    PS_LOG(s->conf.log, PS_LOG_INFO, S0600, "checkpoint %s written (%s, %u tables, %llu ms)", path,
           why, psd_ntables(s), (unsigned long long)(a->last_ms - t0));
    snprintf(out, outlen, "%s", path);
    snprintf(a->path, sizeof a->path, "%s", path);
    return 0;
}

void psd_checkpoint_hold(struct psd *s, int hold)
{
    s->save->held = hold != 0;
}

int psd_checkpoint_now(struct psd *s, const char *why)
{
    if (s->save->dir != NULL && s->save->held)
        return PSD_CKPT_HELD;
    psd_checkpoint_reap(s, 1); /* one writer at a time in the directory */
    if (s->save->dir == NULL || !psd_quiescent(s))
        return PSD_CKPT_SKIPPED;
    char out[PS_PATH_MAX + 100];
    return write_checkpoint(s, why, out, sizeof out);
}

uint64_t psd_state_version(const struct psd *s)
{
    /* each term only grows: a change moves the sum */
    return psd_counts(s)->changes + psd_tables_version(s);
}

pid_t psd_checkpoint_fork(struct psd *s, const char *dir, int *fd)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = -1;
    if (fcntl(fds[0], F_SETFD, FD_CLOEXEC) != 0 || fcntl(fds[1], F_SETFD, FD_CLOEXEC) != 0 ||
        (pid = fork()) < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) { /* the child: only this thread; glibc's malloc is usable after fork */
        close(fds[0]);
        char path[PS_PATH_MAX], err[512], msg[PS_PATH_MAX + 600];
        int rc = psd_checkpoint_write(s, dir, path, sizeof path, err, sizeof err);
        int len = snprintf(msg, sizeof msg, "%d %s", rc, rc == 0 ? path : err);
        ssize_t w = write(fds[1], msg, (size_t)len < sizeof msg ? (size_t)len : sizeof msg - 1);
        (void)w;
        _exit(rc == 0 ? 0 : 1); /* no atexit handlers: they are the parent's */
    }
    close(fds[1]);
    *fd = fds[0];
    return pid;
}

int psd_checkpoint_forked(pid_t pid, int fd, int wait, char *path, size_t pathlen, char *err,
                          size_t errlen)
{
    int st = 0;
    pid_t r;
    while ((r = waitpid(pid, &st, wait ? 0 : WNOHANG)) < 0 && errno == EINTR)
        ;
    if (r == 0)
        return 1; /* still writing */
    char msg[PS_PATH_MAX + 600] = "";
    ssize_t n = read(fd, msg, sizeof msg - 1);
    msg[n > 0 ? n : 0] = '\0';
    close(fd);
    int rc = -1;
    char *text = NULL;
    if (r > 0 && WIFEXITED(st))
        rc = (int)strtol(msg, &text, 10);
    if (rc != 0 || text == NULL || *text != ' ')
        return ps_errf(PS_EIO, err, errlen, "%s",
                       text != NULL && *text == ' ' ? text + 1
                       : r > 0 && WIFSIGNALED(st)   ? strsignal(WTERMSIG(st))
                                                    : "it gave no answer");
    snprintf(path, pathlen, "%s", text + 1);
    return 0;
}

/* The forked writer's result, once it has ended (wait: until it has):
 * the checkpoint counted as written, or the failure logged. */
static void reap_writer(struct psd *s, int wait)
{
    struct psd_autosave *a = s->save;
    if (a->child <= 0)
        return;
    char path[PS_PATH_MAX], err[PS_PATH_MAX + 600];
    int rc = psd_checkpoint_forked(a->child, a->child_fd, wait, path, sizeof path, err, sizeof err);
    if (rc == 1)
        return;
    a->child = 0;
    if (rc != 0) {
        PS_LOG(s->conf.log, PS_LOG_ERROR, S0602, "the forked checkpoint writer failed: %s", err);
        return;
    }
    uint64_t now = (uint64_t)ps_mono_ms();
    a->written++;
    a->ok_ms = a->current_ms = now;
    a->state = a->child_state; /* what it was forked with: a change since is written next */
    a->label_epoch = a->child_epoch;
    a->label_seq = a->child_seq;
    snprintf(a->path, sizeof a->path, "%s", path);
    PS_LOG(s->conf.log, PS_LOG_INFO, S0600,
           "checkpoint %s written (interval, %u tables, %llu ms, by a forked writer while the "
           "shard served; the fork held it %llu us)",
           a->path, a->child_tables, (unsigned long long)(now - a->child_t0),
           (unsigned long long)a->fork_us);
}

/* An interval checkpoint, written by a forked child from the pages as
 * they are at this round boundary, while the shard goes on serving (as
 * Redis's BGSAVE does): the parent's writes from here copy the pages
 * they touch, so memory grows by at most what changes during the write.
 * The child answers on a pipe and exits; reap_writer takes it in. Where
 * fork fails, the checkpoint is written here, on the loop. */
static void write_checkpoint_forked(struct psd *s)
{
    struct psd_autosave *a = s->save;
    uint64_t t0 = (uint64_t)ps_mono_ns();
    int fd = -1;
    pid_t pid = psd_checkpoint_fork(s, a->dir, &fd);
    if (pid < 0) {
        char out[PS_PATH_MAX + 100];
        write_checkpoint(s, "interval", out, sizeof out);
        return;
    }
    a->fork_us = ((uint64_t)ps_mono_ns() - t0) / 1000; /* the loop's pause for it */
    a->child = pid;
    a->child_fd = fd;
    a->child_state = psd_state_version(s);
    position(s, &a->child_epoch, &a->child_seq);
    a->child_t0 = a->last_ms = (uint64_t)ps_mono_ms();
    a->child_tables = psd_ntables(s);
}

void psd_checkpoint_reap(struct psd *s, int wait)
{
    reap_writer(s, wait);
}

void psd_checkpoint_mark_saved(struct psd *s)
{
    s->save->state = psd_state_version(s);
    s->save->last_ms = s->save->current_ms = (uint64_t)ps_mono_ms();
}

void psd_checkpoint_if_due(struct psd *s, uint64_t now)
{
    struct psd_autosave *a = s->save;
    if (a->dir == NULL)
        return;
    if (a->pending) {
        psd_checkpoint_now(s, "asked for");
    } else if (a->every_ms > 0 && now - a->last_ms >= a->every_ms && a->child == 0) {
        if (psd_state_version(s) == a->state) {
            a->last_ms = (uint64_t)ps_mono_ms();
            if (a->written)
                a->current_ms = a->last_ms;
        } else if (!a->held && psd_quiescent(s)) {
            write_checkpoint_forked(s);
        }
    }
}

/* psctl checkpoint: now, or (bsp, mid-round) at the end of the round. */
void psd_op_checkpoint(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    struct psd_autosave *a = s->save;
    if (a->dir == NULL) {
        psd_reply_errorf(s, req, PS_ENOTSUP, rep,
                         "checkpoint: shard %u runs without --checkpoint-dir", s->conf.shard);
        return;
    }
    if (a->held) {
        psd_reply_errorf(s, req, PS_ESTATE, rep,
                         "checkpoint: shard %u is a backup that has not loaded its primary's "
                         "state: a checkpoint now would hide the newest in its directory",
                         s->conf.shard);
        return;
    }
    char detail[PS_PATH_MAX + 200]; /* a path and a sentence about it */
    uint64_t age = (uint64_t)ps_mono_ms() - a->ok_ms;
    if (a->written > 0 && age < PS_CHECKPOINT_ASK_MIN_MS) {
        snprintf(detail, sizeof detail,
                 "%s, written %llu ms ago, stands (at most one asked-for checkpoint every %u ms)",
                 a->path, (unsigned long long)age, PS_CHECKPOINT_ASK_MIN_MS);
    } else if (psd_quiescent(s)) {
        psd_checkpoint_reap(s, 1); /* one writer at a time in the directory */
        int rc = write_checkpoint(s, "asked for", detail, sizeof detail);
        if (rc != 0) {
            psd_reply_errorf(s, req, rc, rep, "checkpoint: %s", detail);
            return;
        }
    } else {
        a->pending = 1;
        snprintf(detail, sizeof detail, "a round is in progress: written when it ends");
    }
    Ps__Header h;
    psd_reply_init(&h, req);
    h.detail = detail;
    psd_reply_header(s, &h, rep);
}

double psd_checkpoint_age_s(const struct psd *s)
{
    const struct psd_autosave *a = s->save;
    return a->written ? (double)((uint64_t)ps_mono_ms() - a->current_ms) / 1e3 : -1.0;
}
