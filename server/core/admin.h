/* The admin ops: stats (psctl status; /metrics reads the same parts) and
 * the rows listing of a sparse table. No state of their own. */
#ifndef PSD_ADMIN_H
#define PSD_ADMIN_H

#include "psd.h"

/* OP_STATS. */
void psd_op_stats(struct psd *s, const Ps__Header *req, struct psd_reply *rep);
/* Entries a delta page of rows or tombstones (OP_ROWS with changed or
 * tombstones) looks at, at most: a page of a table where little changed
 * may hold none, and says where to go on (Header.next). */
#define PSD_ROWS_SCAN_MAX (UINT64_C(1) << 16)
/* OP_ROWS: a page of a sparse table's rows. */
void psd_op_list_rows(struct psd *s, const Ps__Header *req, struct psd_reply *rep);

#endif
