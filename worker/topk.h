/* --topk: gradient sparsification with error feedback. Each step's
 * gradient is added to a residual (through a local velocity when momentum
 * is corrected, as in Deep Gradient Compression), the largest entries are
 * taken out of it and sent as a sparse push; what is not sent stays for
 * the next step. Its state per table (the residual and velocity on the
 * device, the selection on the host or in the shared region) is owned by
 * topk.c: opaque outside it. */
#ifndef PSW_TOPK_H
#define PSW_TOPK_H

#include "trainer.h"

#include <stddef.h>
#include <stdint.h>

/* Elements --topk sends of a table of n. */
size_t psw_topk_count(const struct config *cfg, size_t n);
/* With --topk and momentum, momentum runs on the worker (the correction)
 * and the optimizer that applies the selection is plain SGD. */
int psw_topk_momentum(const struct config *cfg);

/* NULL: out of memory. */
struct psw_topk *psw_topk_create(void);
/* Frees its buffers (on tr's backend; the selection's, unless they lie in
 * the client's region). */
void psw_topk_destroy(struct trainer *tr);
/* Table k of n elements: its residual (and velocity), zero, and its
 * selection's room, in the client's shared region when shards took one.
 * 0 or PS_ENOMEM. */
int psw_topk_table(struct trainer *tr, int k, size_t n);
/* Adds gradient g of table k to its residual and selects: *idx and *val
 * hold *n entries until the next selection. 0 or PS_EDEVICE. */
int psw_topk_select(struct trainer *tr, int k, const float *g, const uint64_t **idx,
                    const float **val, size_t *n);

#endif
