/* Sparse rows: hash index + contiguous row storage. */
#include "sparse.h"

#include "ps_err.h"
#include "ps_init.h"
#include "ps_mem.h"
#include "ps_shard.h"

#include <stdlib.h>
#include <string.h>

#define EMPTY UINT64_MAX

/* Lookups land on random pages: past a huge page, ask for huge pages so the
 * TLB covers the slots (transparent huge pages in "madvise" mode). */
static struct psd_slot *empty_slots(uint64_t n)
{
    size_t bytes = n * sizeof(struct psd_slot);
    struct psd_slot *s = ps_alloc_big(bytes, 0);
    if (s != NULL)
        memset(s, 0xff, bytes); /* row EMPTY */
    return s;
}

int psd_sparse_init(struct psd_sparse *sp, uint32_t dim, uint64_t rows_max, int nstate,
                    int init_kind, float init_scale, uint64_t seed)
{
    memset(sp, 0, sizeof *sp);
    sp->dim = dim;
    sp->rows_max = rows_max < UINT32_MAX ? rows_max : UINT32_MAX - 1;
    sp->nstate = nstate;
    sp->init_kind = init_kind;
    sp->init_scale = init_scale;
    sp->seed = seed;
    sp->slots = 64;
    if ((sp->slot = empty_slots(sp->slots)) == NULL) {
        psd_sparse_fini(sp);
        return PS_ENOMEM;
    }
    return 0;
}

void psd_sparse_fini(struct psd_sparse *sp)
{
    free(sp->slot);
    free(sp->row_key);
    free(sp->w);
    free(sp->s1);
    free(sp->s2);
    free(sp->row_steps);
    memset(sp, 0, sizeof *sp);
}

static uint64_t find_slot(const struct psd_sparse *sp, uint64_t key, uint64_t hash)
{
    uint64_t mask = sp->slots - 1, i = hash & mask;
    while (sp->slot[i].row != EMPTY && sp->slot[i].key != key)
        i = (i + 1) & mask;
    return i;
}

static int grow_slots(struct psd_sparse *sp)
{
    struct psd_slot *old = sp->slot, *grown = empty_slots(sp->slots * 2);
    if (grown == NULL)
        return PS_ENOMEM;
    uint64_t n = sp->slots;
    sp->slot = grown;
    sp->slots = n * 2;
    for (uint64_t i = 0; i < n; i++)
        if (old[i].row != EMPTY)
            sp->slot[find_slot(sp, old[i].key, ps_mix64(old[i].key))] = old[i];
    free(old);
    return 0;
}

/* The row arrays are read at random places too: huge pages past 2 MiB. */
static int grow_rows(struct psd_sparse *sp)
{
    uint64_t cap = sp->rows_cap ? sp->rows_cap * 2 : 64;
    if (cap > sp->rows_max)
        cap = sp->rows_max;
    size_t n = sp->nrows, row = (size_t)sp->dim * sizeof(float);
    float **arr[3] = {&sp->w, &sp->s1, &sp->s2};
    for (int a = 0; a < 1 + sp->nstate; a++) {
        float *p = ps_grow_big(*arr[a], n * row, cap * row);
        if (p == NULL)
            return PS_ENOMEM;
        *arr[a] = p;
    }
    uint32_t *st = ps_grow_big(sp->row_steps, n * sizeof *st, cap * sizeof *st);
    if (st == NULL)
        return PS_ENOMEM;
    sp->row_steps = st;
    uint64_t *rk = ps_grow_big(sp->row_key, n * sizeof *rk, cap * sizeof *rk);
    if (rk == NULL)
        return PS_ENOMEM;
    sp->row_key = rk;
    sp->rows_cap = cap;
    return 0;
}

int64_t psd_sparse_row(struct psd_sparse *sp, uint64_t key, int create)
{
    return psd_sparse_row_hashed(sp, key, ps_mix64(key), create);
}

int64_t psd_sparse_row_hashed(struct psd_sparse *sp, uint64_t key, uint64_t hash, int create)
{
    uint64_t i = find_slot(sp, key, hash);
    if (sp->slot[i].row != EMPTY)
        return (int64_t)sp->slot[i].row;
    if (!create)
        return -1;
    if (sp->nrows >= sp->rows_max)
        return PS_ELIMIT;
    if (sp->nrows == sp->rows_cap && grow_rows(sp) != 0)
        return PS_ENOMEM;
    if (2 * (sp->nrows + 1) > sp->slots) {
        if (grow_slots(sp) != 0)
            return PS_ENOMEM;
        i = find_slot(sp, key, hash);
    }
    uint64_t r = sp->nrows++;
    sp->slot[i].key = key;
    sp->slot[i].row = r;
    float *w = sp->w + r * sp->dim;
    ps_init_fill(w, sp->dim, (enum ps_init_kind)sp->init_kind, sp->init_scale,
                 sp->seed ^ ps_mix64(key), 0);
    for (int a = 0; a < sp->nstate; a++)
        memset((a == 0 ? sp->s1 : sp->s2) + r * sp->dim, 0, sp->dim * sizeof(float));
    sp->row_steps[r] = 0;
    sp->row_key[r] = key;
    return (int64_t)r;
}
