/* The counters every part of a shard adds to (counters.h). */
#include "counters.h"

#include <stdlib.h>

struct psd_counters {
    struct psd_counts n;
};

struct psd_counters *psd_counters_create(void)
{
    return calloc(1, sizeof(struct psd_counters));
}

void psd_counters_destroy(struct psd_counters *c)
{
    free(c);
}

int psd_op_index(const Ps__Header *h)
{
    return h != NULL && h->op > 0 && h->op < PSD_OPS_COUNT ? (int)h->op : PSD_OPS_COUNT;
}

void psd_count_request(struct psd *s, const Ps__Header *h)
{
    s->ctr->n.requests++;
    s->ctr->n.by_op[psd_op_index(h)]++;
}

void psd_count_bytes_in(struct psd *s, uint64_t bytes)
{
    s->ctr->n.bytes_in += bytes;
}

void psd_count_bytes_out(struct psd *s, uint64_t bytes)
{
    s->ctr->n.bytes_out += bytes;
}

uint64_t psd_count_error(struct psd *s, const Ps__Header *req, int code)
{
    struct psd_counts *n = &s->ctr->n;
    n->errors++;
    n->errors_by[psd_op_index(req)][code < 0 && code > -PSD_ERR_CODES ? -code : PSD_ERR_CODES]++;
    return n->errors;
}

void psd_count_change(struct psd *s)
{
    s->ctr->n.changes++;
}

const struct psd_counts *psd_counts(const struct psd *s)
{
    return &s->ctr->n;
}
