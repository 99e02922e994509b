/* --standalone: the optimizer a run applies in this process instead of on
 * psd's shards, with the same code psd runs (psk_optim.h), and its state
 * per table. Owned by local.c: opaque outside it. */
#ifndef PSW_LOCAL_H
#define PSW_LOCAL_H

#include "trainer.h"

#include <stddef.h>
#include <stdint.h>

/* The optimizer the flags name (kind: psk_optim's), with the run's
 * schedule over decay_steps. NULL: out of memory. */
struct psw_local *psw_local_create(const struct config *cfg, int kind, uint64_t decay_steps);
void psw_local_destroy(struct psw_local *l);
/* Table k of n elements: its optimizer state. 0 or PS_ENOMEM. */
int psw_local_table(struct psw_local *l, int k, size_t n);
/* The step to the next clock of table k: its host gradient into its host
 * weights (tr->hg[k], tr->hw[k]). */
void psw_local_apply(struct trainer *tr, int k);
/* The same for n selected entries (--topk). */
void psw_local_apply_sparse(struct trainer *tr, int k, const uint64_t *idx, const float *val,
                            size_t n);

#endif
