/* The data ops: push, pull and push-pull of dense ranges, rows and keys,
 * and set, with the range checks, the non-finite check and the early
 * answer. Its state is the scratch the values and keys of a request are
 * aligned or converted into: owned by ops.c, opaque outside it. */
#ifndef PSD_OPS_H
#define PSD_OPS_H

#include "psd.h"

#include <stdint.h>

struct psd_ops *psd_ops_create(void);
void psd_ops_destroy(struct psd_ops *o);

/* OP_PULL, OP_PUSH, OP_PUSH_PULL. */
enum psd_answer psd_op_data(struct psd *s, const struct ps_frame *route,
                            const struct ps_wire_msg *m, struct psd_reply *rep);
/* OP_SET. */
void psd_op_set(struct psd *s, const struct ps_wire_msg *m, struct psd_reply *rep);

/* Pushes refused for a NaN or an infinity so far. */
uint64_t psd_nonfinite_refused(const struct psd *s);

#endif
