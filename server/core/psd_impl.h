/* What the files of psd's core share and nothing outside them uses: one
 * section per file (psd.h is the core's interface to main.c, net.c,
 * checkpoint.c and the tests). */
#ifndef PSD_IMPL_H
#define PSD_IMPL_H

#include "psd.h"

/* reply.c */
void psd_reply_header(struct psd *s, const Ps__Header *h, struct psd_reply *rep);
void psd_reply_init(Ps__Header *out, const Ps__Header *req);
void psd_reply_error(struct psd *s, const Ps__Header *req, int code, const char *text,
                     struct psd_reply *rep);
void psd_reply_errorf(struct psd *s, const Ps__Header *req, int code, struct psd_reply *rep,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void psd_fit_unread(struct psd *s, const void *route, size_t route_len, const Ps__Header *req,
                    struct psd_reply *rep);
const float *psd_values_f32(struct psd *s, const struct ps_wire_msg *m);
void psd_reply_values(struct psd *s, const Ps__Header *req, struct psd_table *t, uint64_t offset,
                      uint64_t count, int duplicate, int stale, unsigned char *dst,
                      struct psd_reply *rep);

/* dedup.c */
struct psd_peer *psd_peer_of(struct psd *s, uint32_t worker_id, int create);
int psd_seen_push(struct psd *s, const Ps__Header *req);
void psd_applied_push(struct psd *s, const Ps__Header *req);
void psd_peer_reset(struct psd_peer *p, uint64_t session, uint64_t last_applied);
void psd_reply_duplicate(struct psd *s, const Ps__Header *req, struct psd_reply *rep);

/* live.c */
void psd_worker_heard(struct psd *s, const Ps__Header *req);
void psd_drop_silent(struct psd *s, uint64_t now);
void psd_note_stale(struct psd *s, const Ps__Header *req, const struct psd_table *t);
int psd_hello_refused(struct psd *s, const struct ps_frame *route, const char *user,
                      const Ps__Header *req, struct psd_reply *rep);
void psd_op_hello(struct psd *s, const struct ps_frame *route, const char *user,
                  const Ps__Header *req, struct psd_reply *rep);

/* waits.c */
void psd_answer_pull(struct psd *s, const Ps__Header *req, struct psd_table *t, uint64_t clock,
                     uint64_t offset, uint64_t count, int duplicate, int stale, unsigned char *dst,
                     struct psd_reply *rep);
void psd_wait_header(const struct psd_wait *w, Ps__Header *h);
int psd_shm_part(struct psd *s, const struct ps_frame *route, const Ps__Header *req, uint32_t shm,
                 uint32_t bit, uint64_t off, unsigned char **p, struct psd_reply *rep);
void psd_send_now(struct psd *s, const void *route, size_t route_len, struct psd_reply *rep);
void psd_release_waits(struct psd *s);
enum psd_answer psd_defer(struct psd *s, const struct ps_frame *route, const Ps__Header *req,
                          uint64_t clock, struct psd_reply *rep);

/* tables.c */
void psd_op_create(struct psd *s, const Ps__Header *req, struct psd_reply *rep);

/* ops.c */
void psd_op_set(struct psd *s, const struct ps_wire_msg *m, struct psd_reply *rep);
enum psd_answer psd_op_data(struct psd *s, const struct ps_frame *route,
                            const struct ps_wire_msg *m, struct psd_reply *rep);

/* autosave.c */
void psd_checkpoint_if_due(struct psd *s);
void psd_op_checkpoint(struct psd *s, const Ps__Header *req, struct psd_reply *rep);

/* admin.c */
void psd_op_stats(struct psd *s, const Ps__Header *req, struct psd_reply *rep);
void psd_op_list_rows(struct psd *s, const Ps__Header *req, struct psd_reply *rep);

#endif
