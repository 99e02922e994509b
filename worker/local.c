/* --standalone's optimizer (local.h). */
#include "local.h"

#include "model.h"

#include "ps_err.h"

#include <stdlib.h>
#include <string.h>

struct psw_local {
    struct psk_optim opt;
    float *s1[TABLES_MAX], *s2[TABLES_MAX]; /* its state arrays per table */
};

struct psw_local *psw_local_create(const struct config *cfg, int kind, uint64_t decay_steps)
{
    struct psw_local *l = calloc(1, sizeof *l);
    if (l == NULL)
        return NULL;
    l->opt = (struct psk_optim){.kind = kind,
                                .lr = (float)cfg->lr,
                                .weight_decay = (float)cfg->weight_decay,
                                .momentum = (float)cfg->momentum,
                                .beta1 = 0.9f,
                                .beta2 = 0.999f,
                                .eps = 1e-8f,
                                .schedule = strcmp(cfg->lr_schedule, "cosine") == 0,
                                .decay_steps = decay_steps};
    return l;
}

void psw_local_destroy(struct psw_local *l)
{
    for (int k = 0; l != NULL && k < TABLES_MAX; k++) {
        free(l->s1[k]);
        free(l->s2[k]);
    }
    free(l);
}

int psw_local_table(struct psw_local *l, int k, size_t n)
{
    l->s1[k] = calloc(n, 4);
    l->s2[k] = calloc(n, 4);
    return l->s1[k] && l->s2[k] ? 0 : PS_ENOMEM;
}

void psw_local_apply(struct trainer *tr, int k)
{
    struct psw_local *l = tr->local;
    psk_optim_apply(&l->opt, tr->clock + 1, tr->hw[k], l->s1[k], l->s2[k], tr->hg[k],
                    (size_t)psw_table_size(tr, k));
}

void psw_local_apply_sparse(struct trainer *tr, int k, const uint64_t *idx, const float *val,
                            size_t n)
{
    struct psw_local *l = tr->local;
    psk_optim_apply_sparse(&l->opt, tr->clock + 1, tr->hw[k], l->s1[k], l->s2[k], idx, 0, val, n);
}
