/* A shard's counters: requests, error replies by op and code, bytes in
 * and out, and the changes a checkpoint saves (the state version). Each
 * part keeps the counters of its own job (dedup.h, live.h, waits.h...);
 * these are the ones every part adds to. Owned by counters.c: opaque
 * outside it, read through psd_counts. */
#ifndef PSD_COUNTERS_H
#define PSD_COUNTERS_H

#include "psd.h"

#include <stdint.h>

/* What the counters say now (a view into the part: valid while s is). */
struct psd_counts {
    uint64_t requests;
    uint64_t errors;
    uint64_t bytes_in;
    uint64_t bytes_out;
    /* requests and error replies by op (psd_op_index) and, for errors,
     * by -code (PSD_ERR_CODES: outside the known codes) */
    uint64_t by_op[PSD_OPS_COUNT + 1];
    uint64_t errors_by[PSD_OPS_COUNT + 1][PSD_ERR_CODES + 1];
    /* bumped by every change a checkpoint saves that a table's steps and
     * clock do not show (checkpoint.h, psd_state_version) */
    uint64_t changes;
};

struct psd_counters *psd_counters_create(void);
void psd_counters_destroy(struct psd_counters *c);

/* A request came, of op h (NULL: it did not decode), bytes long. */
void psd_count_request(struct psd *s, const Ps__Header *h);
void psd_count_bytes_in(struct psd *s, uint64_t bytes);
void psd_count_bytes_out(struct psd *s, uint64_t bytes);
/* An error reply with code to a request of op req (NULL: undecoded).
 * Returns the error replies so far. */
uint64_t psd_count_error(struct psd *s, const Ps__Header *req, int code);
/* Something a checkpoint saves changed. */
void psd_count_change(struct psd *s);

const struct psd_counts *psd_counts(const struct psd *s);

#endif
