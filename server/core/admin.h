/* The admin ops: stats (psctl status; /metrics reads the same parts) and
 * the rows listing of a sparse table. No state of their own. */
#ifndef PSD_ADMIN_H
#define PSD_ADMIN_H

#include "psd.h"

/* OP_STATS. */
void psd_op_stats(struct psd *s, const Ps__Header *req, struct psd_reply *rep);
/* OP_ROWS: a page of a sparse table's rows. */
void psd_op_list_rows(struct psd *s, const Ps__Header *req, struct psd_reply *rep);

#endif
