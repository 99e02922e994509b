/* What repl.c (the primary's side) and follow.c (the backup's) share. */
#ifndef PSD_REPL_IMPL_H
#define PSD_REPL_IMPL_H

#include "repl.h"

#define PARTS_MAX            (PS_FRAMES_MAX + 2u)
#define TICK_MS              25u    /* the replicas' timer */
#define BEAT_MS              50u    /* a primary's beat to its backups */
#define VIEW_MS              50u    /* how often a replica without a primary asks etcd */
#define VIEW_DOWN_MS         500u   /* ...while etcd does not answer */
#define CATCH_UP_MS          30000u /* a backup not yet in sync may be silent this long (loading) */
#define ACK_EVERY            64u    /* records a backup applies at most before it acknowledges */
#define PSD_REPL_ARENA_BYTES (4u * PS_HEADER_BYTES_MAX) /* as psd's own arena */

/* The header frame (at most PS_HEADER_BYTES_MAX bytes) unpacked into
 * arena, which is reset first; NULL when it is not a ps.Header. */
Ps__Header *psd__repl_unpack(struct ps_arena *arena, const zmq_msg_t *frame);

/* repl.c */
int psd__repl_send_hdr(void *sock, const Ps__Header *h, int more);
void psd__repl_record_header(const struct psd_repl *r, Ps__Header *h, Ps__Record kind);
/* This process stops answering as primary (it lost its lease, or etcd
 * names another): held replies are dropped, the clients send again. */
void psd__repl_step_down(struct psd_repl *r, const char *why);

/* follow.c */
void psd__repl_send_follow(struct psd_repl *r);
/* Follows the primary at endpoint (epoch): asks for its state, which
 * replaces this replica's. */
void psd__repl_follow(struct psd_repl *r, const char *endpoint, uint64_t epoch);
/* The follow socket's reader (ps_zsock_read_cb). */
int psd__repl_on_record(struct ps_zsock *zs, void *arg);
/* A replica without a working primary asks etcd what to do: follow the
 * primary it names, or take over. */
void psd__repl_consult(struct psd_repl *r, uint64_t now);

#endif
