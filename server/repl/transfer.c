/* A primary's state transfer, written by a forked child (transfer.h). */
#define _GNU_SOURCE /* fallocate */
#include "transfer.h"

#include "checkpoint.h"
#include "record.h"

#include "ps_clock.h"
#include "ps_err.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void psd_transfer_init(struct psd_transfer *x, uint64_t kept_max)
{
    memset(x, 0, sizeof *x);
    x->kept_max = kept_max;
    x->fd = -1;
    x->child_fd = -1;
}

int psd_transfer_busy(const struct psd_transfer *x)
{
    return x->child > 0 || x->fd >= 0 || x->resume;
}

/* The file written: open it to send. */
static int open_written(struct psd_transfer *x, char *err, size_t errlen)
{
    struct stat st;
    x->fd = open(x->path, O_RDWR | O_CLOEXEC); /* written to free what went */
    if (x->fd < 0 || fstat(x->fd, &st) != 0)
        return ps_errf(PS_EIO, err, errlen, "cannot read %s: %s", x->path, strerror(errno));
    x->size = (uint64_t)st.st_size;
    x->off = 0;
    return 0;
}

/* A new transfer (a state's, or a resume) to the backups in mask, at
 * record seq of epoch: what the last one left is let go. */
static void begin(struct psd_transfer *x, uint64_t epoch, uint64_t seq, uint32_t mask)
{
    psd_transfer_end(x);
    x->epoch = epoch;
    x->seq = seq;
    x->mask = mask;
    x->sent_kept = 0;
    x->t0_ms = (uint64_t)ps_mono_ms();
    x->fork_us = 0;
    x->child_used = 0;
}

int psd_transfer_start(struct psd_transfer *x, struct psd *s, const char *dir, uint64_t epoch,
                       uint64_t seq, uint32_t mask, char *err, size_t errlen)
{
    begin(x, epoch, seq, mask);
    x->started++;
    uint64_t t0 = (uint64_t)ps_mono_ns();
    x->child = psd_checkpoint_fork(s, dir, &x->child_fd);
    if (x->child > 0) {
        x->fork_us = ((uint64_t)ps_mono_ns() - t0) / 1000;
        x->forked++;
        x->child_used = 1;
        return 0;
    }
    x->child = 0; /* no fork: written here, on the loop */
    int rc = psd_checkpoint_write(s, dir, x->path, sizeof x->path, err, errlen);
    if (rc == 0 && (rc = open_written(x, err, errlen)) != 0)
        psd_transfer_end(x);
    return rc;
}

/* Keeps a record: its header packed (len bytes) and n frames, shared. */
static int keep_packed(struct psd_transfer *x, uint64_t seq, const uint8_t *hdr, size_t len,
                       zmq_msg_t *frames, size_t n)
{
    uint64_t bytes = psd_rec_bytes(len, frames, n);
    if (x->kept.bytes + bytes > x->kept_max) {
        x->over_bound++;
        return PS_ELIMIT;
    }
    int rc = psd_recq_push(&x->kept, seq, hdr, len, frames, n, bytes);
    if (rc == 0 && x->kept.bytes > x->kept_peak_bytes)
        x->kept_peak_bytes = x->kept.bytes;
    return rc;
}

int psd_transfer_keep(struct psd_transfer *x, const Ps__Header *h, zmq_msg_t *frames, size_t n)
{
    uint8_t hdr[PS_HEADER_BYTES_MAX];
    int64_t len = ps_wire_header_pack(h, hdr, sizeof hdr);
    if (len < 0)
        return PS_ENOMEM;
    return keep_packed(x, h->seq, hdr, (size_t)len, frames, n);
}

int psd_transfer_resume(struct psd_transfer *x, uint64_t epoch, uint64_t seq, uint32_t mask,
                        const struct psd_backlog *bl, uint64_t resume_epoch, uint64_t resume_seq)
{
    begin(x, epoch, seq, mask);
    for (const struct psd_rec *k = psd_backlog_after(bl, seq); k != NULL; k = k->next) {
        /* keep_packed does not change the frames it shares */
        int rc = keep_packed(x, k->seq, k->hdr, k->hdr_len, (zmq_msg_t *)k->frames, k->n);
        if (rc != 0) {
            psd_transfer_end(x);
            return rc;
        }
    }
    x->resume = 1;
    x->resume_epoch = resume_epoch;
    x->resume_seq = resume_seq;
    return 0;
}

/* The current message to the backups still owed it (x->owed): 1 when
 * every one has it. */
static int send_owed(struct psd_transfer *x, void *sock, const struct psd_backups *set,
                     const void *hdr, size_t hdr_len, zmq_msg_t *frames, size_t n, uint32_t *failed)
{
    x->owed &= x->mask;
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++) {
        if (!(x->owed & (1u << i)))
            continue;
        int rc =
            psd_record_send_to(sock, set->b[i].route, set->b[i].route_len, hdr, hdr_len, frames, n);
        if (rc == 1)
            continue; /* its queue is full: the next step */
        x->owed &= ~(1u << i);
        if (rc < 0) {
            *failed |= 1u << i;
            x->mask &= ~(1u << i);
        }
    }
    return x->owed == 0;
}

/* The next piece of the file: read once, then sent to each backup as its
 * queue takes it. 1 when every backup has it. */
static int send_piece(struct psd_transfer *x, void *sock, const struct psd_backups *set,
                      uint32_t *failed, char *err, size_t errlen)
{
    uint64_t want = x->size - x->off < PSD_SNAP_PIECE ? x->size - x->off : PSD_SNAP_PIECE;
    if (x->owed == 0) { /* a new piece */
        if (zmq_msg_init_size(&x->piece, (size_t)want) != 0)
            return ps_errf(PS_ENOMEM, err, errlen, "out of memory for a piece of %s", x->path);
        ssize_t got = pread(x->fd, zmq_msg_data(&x->piece), (size_t)want, (off_t)x->off);
        if (got != (ssize_t)want) {
            zmq_msg_close(&x->piece);
            return ps_errf(PS_EIO, err, errlen, "cannot read %s at %llu: %s", x->path,
                           (unsigned long long)x->off, got < 0 ? strerror(errno) : "it is shorter");
        }
        x->has_piece = 1;
        x->owed = x->mask;
    }
    Ps__Header h;
    psd_record_header(&h, PS__RECORD__REC_SNAPSHOT, x->epoch, x->seq);
    h.offset = x->off;
    h.count = x->size;
    h.last = x->off + want >= x->size;
    uint8_t hdr[PS_HEADER_BYTES_MAX];
    int64_t len = ps_wire_header_pack(&h, hdr, sizeof hdr);
    if (len < 0)
        return ps_errf(PS_EPROTO, err, errlen, "a state transfer's header does not pack");
    if (!send_owed(x, sock, set, hdr, (size_t)len, &x->piece, 1, failed))
        return 0;
    zmq_msg_close(&x->piece);
    x->has_piece = 0;
    /* what went is freed as it goes (the file's blocks and cached
     * pages): freed all at once when the file was removed, 2 GiB held
     * the loop for 280 ms */
    if (fallocate(x->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)x->off, (off_t)want) !=
        0)
        posix_fadvise(x->fd, (off_t)x->off, (off_t)want, POSIX_FADV_DONTNEED);
    x->off += want;
    return 0;
}

int psd_transfer_step(struct psd_transfer *x, void *sock, const struct psd_backups *set,
                      uint32_t *failed, char *err, size_t errlen)
{
    *failed = 0;
    if (x->child > 0) {
        int rc =
            psd_checkpoint_forked(x->child, x->child_fd, 0, x->path, sizeof x->path, err, errlen);
        if (rc == 1)
            return PSD_TRANSFER_WRITING;
        x->child = 0;
        x->child_fd = -1;
        if (rc != 0 || open_written(x, err, errlen) != 0)
            return PSD_TRANSFER_FAILED;
    }
    if (x->resume && !x->resume_sent) {
        Ps__Header h;
        psd_record_header(&h, PS__RECORD__REC_RESUME, x->epoch, x->seq);
        h.resume_epoch = x->resume_epoch;
        h.resume_seq = x->resume_seq;
        uint8_t hdr[PS_HEADER_BYTES_MAX];
        int64_t len = ps_wire_header_pack(&h, hdr, sizeof hdr);
        if (len < 0) {
            ps_errf(PS_EPROTO, err, errlen, "a resume's header does not pack");
            return PSD_TRANSFER_FAILED;
        }
        if (x->owed == 0)
            x->owed = x->mask;
        if (!send_owed(x, sock, set, hdr, (size_t)len, NULL, 0, failed))
            return PSD_TRANSFER_SENDING;
        x->resume_sent = 1;
    } else if (!x->resume && x->fd < 0) {
        return PSD_TRANSFER_FAILED;
    } else if (!x->resume && x->off < x->size) { /* one piece a step */
        if (send_piece(x, sock, set, failed, err, errlen) != 0)
            return PSD_TRANSFER_FAILED;
        return PSD_TRANSFER_SENDING;
    }
    /* then the records kept, as many as the backups' queues take */
    while (x->kept.head != NULL) {
        struct psd_rec *k = x->kept.head;
        if (x->owed == 0)
            x->owed = x->mask;
        if (!send_owed(x, sock, set, k->hdr, k->hdr_len, k->frames, k->n, failed))
            return PSD_TRANSFER_SENDING;
        x->sent_kept++;
        psd_recq_pop(&x->kept);
    }
    /* done once each backup has loaded the state (it acknowledges seq):
     * until then it reads nothing, its queue fills, and records made
     * meanwhile are kept here rather than refused there */
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++)
        if ((x->mask & (1u << i)) && set->b[i].acked < x->seq)
            return PSD_TRANSFER_SENDING;
    return PSD_TRANSFER_DONE;
}

void psd_transfer_end(struct psd_transfer *x)
{
    if (x->child > 0) {
        kill(x->child, SIGKILL);
        char path[PS_PATH_MAX], err[64];
        if (psd_checkpoint_forked(x->child, x->child_fd, 1, path, sizeof path, err, sizeof err) ==
            0)
            unlink(path);
    }
    x->child = 0;
    x->child_fd = -1;
    if (x->fd >= 0)
        close(x->fd);
    if (x->fd >= 0 || x->path[0] != '\0')
        unlink(x->path);
    x->fd = -1;
    x->path[0] = '\0';
    if (x->has_piece)
        zmq_msg_close(&x->piece);
    x->has_piece = 0;
    psd_recq_clear(&x->kept);
    x->mask = x->owed = 0;
    x->resume = x->resume_sent = 0;
}
