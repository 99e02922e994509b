/* Moving weights and gradients: the tables a model needs, pulls for a
 * clock, pushes (whole, in chunks as backward produces them, or top-k),
 * the passes overlapped with them, and loading a batch. */
#ifndef PSW_EXCHANGE_H
#define PSW_EXCHANGE_H

#include "trainer.h"

#include <stddef.h>
#include <stdint.h>

/* The distributed exchange's part of the trainer (opaque outside
 * exchange.c). NULL: out of memory. */
struct psw_exchange *psw_exchange_create(void);
void psw_exchange_destroy(struct psw_exchange *x);
/* Puts the gradients and two sets of weights in the client's shared
 * region when shards took one: their values then move without sockets,
 * and pulled weights are used where they land. */
void psw_use_region(struct trainer *tr);
int psw_setup_tables(struct trainer *tr, char *err, size_t errlen);
void psw_next_weights(struct trainer *tr);
void psw_cork(struct trainer *tr, int on);
int psw_pull_all(struct trainer *tr, uint64_t clock);
int psw_sync_weights(struct trainer *tr);
int psw_weights_ready(void *arg, int l, int r0, int r1);
int psw_send_topk(struct trainer *tr, int k);
int psw_on_chunk(void *arg, int l, int r0, int r1);
int psw_on_conv_grads(void *arg, int k);
int psw_wait_table(struct trainer *tr, int k);
int psw_load_batch(struct trainer *tr, const struct psw_split *d, const uint32_t *idx, int rows);
int psw_forward_ready(struct trainer *tr, int rows);
int psw_backward_sending(struct trainer *tr, int rows);
int psw_send_all_grads(struct trainer *tr);

#endif
