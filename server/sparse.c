/* Sparse rows: hash index + contiguous row storage. */
#include "sparse.h"

#include "ps_err.h"
#include "ps_init.h"
#include "ps_shard.h"

#include <stdlib.h>
#include <string.h>

#define EMPTY UINT32_MAX

int psd_sparse_init(struct psd_sparse *sp, uint32_t dim, uint64_t rows_max, int nstate,
                    int init_kind, float init_scale, uint64_t seed)
{
    memset(sp, 0, sizeof *sp);
    sp->dim = dim;
    sp->rows_max = rows_max < EMPTY ? rows_max : EMPTY - 1;
    sp->nstate = nstate;
    sp->init_kind = init_kind;
    sp->init_scale = init_scale;
    sp->seed = seed;
    sp->slots = 64;
    sp->slot_key = malloc(sp->slots * sizeof *sp->slot_key);
    sp->slot_row = malloc(sp->slots * sizeof *sp->slot_row);
    if (sp->slot_key == NULL || sp->slot_row == NULL) {
        psd_sparse_fini(sp);
        return PS_ENOMEM;
    }
    memset(sp->slot_row, 0xff, sp->slots * sizeof *sp->slot_row);
    return 0;
}

void psd_sparse_fini(struct psd_sparse *sp)
{
    free(sp->slot_key);
    free(sp->slot_row);
    free(sp->row_key);
    free(sp->w);
    free(sp->s1);
    free(sp->s2);
    free(sp->row_steps);
    memset(sp, 0, sizeof *sp);
}

static uint64_t find_slot(const struct psd_sparse *sp, uint64_t key)
{
    uint64_t mask = sp->slots - 1, i = ps_mix64(key) & mask;
    while (sp->slot_row[i] != EMPTY && sp->slot_key[i] != key)
        i = (i + 1) & mask;
    return i;
}

void psd_sparse_prefetch(const struct psd_sparse *sp, uint64_t key)
{
    uint64_t i = ps_mix64(key) & (sp->slots - 1);
    __builtin_prefetch(&sp->slot_row[i]);
    __builtin_prefetch(&sp->slot_key[i]);
}

static int grow_slots(struct psd_sparse *sp)
{
    uint64_t old = sp->slots;
    uint64_t *okey = sp->slot_key;
    uint32_t *orow = sp->slot_row;
    sp->slots = old * 2;
    sp->slot_key = malloc(sp->slots * sizeof *sp->slot_key);
    sp->slot_row = malloc(sp->slots * sizeof *sp->slot_row);
    if (sp->slot_key == NULL || sp->slot_row == NULL) {
        free(sp->slot_key);
        free(sp->slot_row);
        sp->slots = old;
        sp->slot_key = okey;
        sp->slot_row = orow;
        return PS_ENOMEM;
    }
    memset(sp->slot_row, 0xff, sp->slots * sizeof *sp->slot_row);
    for (uint64_t i = 0; i < old; i++) {
        if (orow[i] == EMPTY)
            continue;
        uint64_t j = find_slot(sp, okey[i]);
        sp->slot_key[j] = okey[i];
        sp->slot_row[j] = orow[i];
    }
    free(okey);
    free(orow);
    return 0;
}

static int grow_rows(struct psd_sparse *sp)
{
    uint64_t cap = sp->rows_cap ? sp->rows_cap * 2 : 64;
    if (cap > sp->rows_max)
        cap = sp->rows_max;
    size_t bytes = (size_t)cap * sp->dim * sizeof(float);
    float **arr[3] = {&sp->w, &sp->s1, &sp->s2};
    for (int a = 0; a < 1 + sp->nstate; a++) {
        float *p = realloc(*arr[a], bytes);
        if (p == NULL)
            return PS_ENOMEM;
        *arr[a] = p;
    }
    uint32_t *st = realloc(sp->row_steps, (size_t)cap * sizeof *st);
    if (st == NULL)
        return PS_ENOMEM;
    sp->row_steps = st;
    uint64_t *rk = realloc(sp->row_key, (size_t)cap * sizeof *rk);
    if (rk == NULL)
        return PS_ENOMEM;
    sp->row_key = rk;
    sp->rows_cap = cap;
    return 0;
}

int64_t psd_sparse_row(struct psd_sparse *sp, uint64_t key, int create)
{
    uint64_t i = find_slot(sp, key);
    if (sp->slot_row[i] != EMPTY)
        return sp->slot_row[i];
    if (!create)
        return -1;
    if (sp->nrows >= sp->rows_max)
        return PS_ELIMIT;
    if (sp->nrows == sp->rows_cap && grow_rows(sp) != 0)
        return PS_ENOMEM;
    if (2 * (sp->nrows + 1) > sp->slots) {
        if (grow_slots(sp) != 0)
            return PS_ENOMEM;
        i = find_slot(sp, key);
    }
    uint64_t r = sp->nrows++;
    sp->slot_key[i] = key;
    sp->slot_row[i] = (uint32_t)r;
    float *w = sp->w + r * sp->dim;
    ps_init_fill(w, sp->dim, (enum ps_init_kind)sp->init_kind, sp->init_scale,
                 sp->seed ^ ps_mix64(key), 0);
    for (int a = 0; a < sp->nstate; a++)
        memset((a == 0 ? sp->s1 : sp->s2) + r * sp->dim, 0, sp->dim * sizeof(float));
    sp->row_steps[r] = 0;
    sp->row_key[r] = key;
    return (int64_t)r;
}
