/* What repl.c (the primary's side) and follow.c (the backup's) share. */
#ifndef PSD_REPL_IMPL_H
#define PSD_REPL_IMPL_H

#include "repl.h"

#define PARTS_MAX             (PS_FRAMES_MAX + 2u)
#define TICK_MS               25u    /* the replicas' timer */
#define BEAT_MS               50u    /* a primary's beat to its backups */
#define VIEW_MS               50u    /* how often a replica without a primary asks etcd */
#define VIEW_DOWN_MS          500u   /* ...while etcd does not answer */
#define CATCH_UP_MS           30000u /* a backup not yet in sync may be silent this long (loading) */
#define ACK_EVERY             64u    /* records a backup applies at most before it acknowledges */
#define LAST_RECORD_LINGER_MS 200    /* a stopping primary's last records may take this to go */
#define PSD_REPL_ARENA_BYTES  (4u * PS_HEADER_BYTES_MAX) /* as psd's own arena */

/* follow.c */
void psd__repl_send_follow(struct psd_repl *r);
/* Follows the primary at endpoint (epoch): asks for its state, which
 * replaces this replica's. */
void psd__repl_follow(struct psd_repl *r, const char *endpoint, uint64_t epoch);
/* The follow socket's reader (ps_zsock_read_cb). */
int psd__repl_on_record(struct ps_zsock *zs, void *arg);
/* One message from the primary, as received (kept of total frames):
 * a record to apply, a piece of a state transfer, a beat, or a refusal. */
void psd__repl_message(struct psd_repl *r, zmq_msg_t *parts, size_t kept, size_t total);
/* A replica without a working primary asks etcd what to do: follow the
 * primary it names, or take over. */
void psd__repl_consult(struct psd_repl *r, uint64_t now);
/* OP_RECOVER (psctl recover): answered here. */
void psd__repl_recover(struct psd_repl *r, const struct ps_frame *route, const char *user,
                       const Ps__Header *req);

/* resume.c */
/* A backup waiting for its state whose follow names a state of its own
 * that the backlog can bring up to date gets a resume instead of a state
 * transfer (one at a time); one whose state cannot be is told why in the
 * log and gets a transfer. 1 when a resume began. */
int psd__repl_try_resume(struct psd_repl *r);

#endif
