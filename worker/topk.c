/* --topk (topk.h). */
#include "topk.h"

#include "model.h"

#include "ps_err.h"

#include <stdlib.h>

struct psw_topk {
    float *resid[TABLES_MAX], *vel[TABLES_MAX]; /* on the device */
    uint64_t *sel_idx[TABLES_MAX];
    float *sel_val[TABLES_MAX];
    int sel_shm[TABLES_MAX]; /* sel_idx and sel_val lie in the shared region */
    size_t sel_k[TABLES_MAX];
};

size_t psw_topk_count(const struct config *cfg, size_t n)
{
    return (size_t)psc_topk_count(n, cfg->topk);
}

int psw_topk_momentum(const struct config *cfg)
{
    return cfg->topk > 0 && psk_optim_parse(cfg->optimizer) == PSK_OPT_MOMENTUM;
}

struct psw_topk *psw_topk_create(void)
{
    return calloc(1, sizeof(struct psw_topk));
}

void psw_topk_destroy(struct trainer *tr)
{
    struct psw_topk *t = tr->topk;
    for (int k = 0; t != NULL && k < TABLES_MAX; k++) {
        psk_free(tr->be, t->resid[k]);
        psk_free(tr->be, t->vel[k]);
        if (!t->sel_shm[k]) {
            free(t->sel_idx[k]);
            free(t->sel_val[k]);
        }
    }
    free(t);
    tr->topk = NULL;
}

int psw_topk_table(struct trainer *tr, int k, size_t n)
{
    struct psw_topk *t = tr->topk;
    size_t kk = t->sel_k[k] = psw_topk_count(&tr->cfg, n);
    float *zeros = calloc(n, sizeof *zeros);
    /* in the shared region when shards took it: the keys and values of
     * the keyed push then move without sockets */
    t->sel_shm[k] = tr->c != NULL && psc_shm_shards(tr->c) > 0 &&
                    (t->sel_idx[k] = psc_shm_alloc(tr->c, kk * sizeof(uint64_t))) != NULL &&
                    (t->sel_val[k] = psc_shm_alloc(tr->c, kk * sizeof(float))) != NULL;
    if (!t->sel_shm[k]) {
        t->sel_idx[k] = malloc(kk * sizeof *t->sel_idx[k]);
        t->sel_val[k] = malloc(kk * sizeof *t->sel_val[k]);
    }
    int rc = zeros == NULL || t->sel_idx[k] == NULL || t->sel_val[k] == NULL ||
             psk_alloc(tr->be, n * 4, (void **)&t->resid[k]) ||
             psk_upload(tr->be, t->resid[k], zeros, n * 4);
    if (rc == 0 && psw_topk_momentum(&tr->cfg))
        rc = psk_alloc(tr->be, n * 4, (void **)&t->vel[k]) ||
             psk_upload(tr->be, t->vel[k], zeros, n * 4);
    free(zeros);
    return rc ? PS_ENOMEM : 0;
}

int psw_topk_select(struct trainer *tr, int k, const float *g, const uint64_t **idx,
                    const float **val, size_t *n)
{
    struct psw_topk *t = tr->topk;
    size_t len = (size_t)psw_table_size(tr, k);
    float *v = t->resid[k], *u = t->vel[k];
    if (psk_topk_accum(tr->be, len, g, (float)tr->cfg.momentum, u, v, t->sel_k[k], t->sel_idx[k],
                       t->sel_val[k]))
        return PS_EDEVICE;
    *idx = t->sel_idx[k];
    *val = t->sel_val[k];
    *n = t->sel_k[k];
    return 0;
}
