/* Votes: every worker of a bsp round says whether something happened to
 * it, and all learn whether it happened to any (psclient.h). A vote table
 * holds one float. It runs SGD with lr 1 and weight decay 1, so a round
 * sets it to w - (mean(g) + w) = -mean(g), whatever it held: each worker
 * pushes -1 or 0, and the value pulled back after the round is the share
 * of workers that said yes, exactly 0 when none did. Those values survive
 * any wire dtype. */
#include "client_impl.h"

#include "ps_limits.h"

#include <stdlib.h>
#include <string.h>

static int vote_open(struct psc_client *c, const char *name, int timeout_ms, struct psc_vote *v)
{
    char full[PSC_TABLE_NAME_MAX + 1];
    if (name == NULL || name[0] == '\0' ||
        strlen(name) + strlen(PS_TABLE_RESERVED_PREFIX) > PSC_TABLE_NAME_MAX)
        return psc__set_error(c, PS_EINVAL, "vote: a name of 1..%zu characters is needed",
                              (size_t)PSC_TABLE_NAME_MAX - strlen(PS_TABLE_RESERVED_PREFIX));
    snprintf(full, sizeof full, PS_TABLE_RESERVED_PREFIX "%s", name);
    struct psc_table_spec s;
    psc_table_spec_init(&s, full, 1);
    s.optimizer = PSC_SGD;
    s.lr = 1.0f;
    s.weight_decay = 1.0f;
    s.momentum = 0.0f;
    int rc = psc_table_create(c, &s, timeout_ms, &v->table);
    if (rc != 0)
        return rc;
    /* the next round: the table's clock (a worker restarted mid-run joins
     * where the others are), and whether the servers hold rounds at all */
    struct psc_table_stats *list = calloc(PS_TABLES_MAX, sizeof *list);
    if (list == NULL)
        return psc__set_error(c, PS_ENOMEM, "vote: out of memory");
    list[0].struct_size = sizeof *list;
    for (uint32_t sh = 0; sh < c->nshards && rc == 0; sh++) {
        struct psc_shard_stats st = {.struct_size = sizeof st};
        rc = psc_stats_tables(c, sh, timeout_ms, &st, list, PS_TABLES_MAX);
        v->bsp = rc == 0 && strcmp(st.consistency, "bsp") == 0;
        for (uint32_t i = 0; rc == 0 && i < st.tables && i < PS_TABLES_MAX; i++)
            if (strcmp(list[i].name, full) == 0 && list[i].clock > v->clock)
                v->clock = list[i].clock;
    }
    free(list);
    return rc;
}

int psc_vote_open(struct psc_client *c, const char *name, int timeout_ms, struct psc_vote *v)
{
    char why[PS_ERROR_TEXT_MAX];
    if (psc__sized_check_out(v, sizeof *v, PSC__VOTE_V1, "psc_vote", why, sizeof why) != 0)
        return psc__set_error(c, PS_EINVAL, "vote: %s", why);
    struct psc_vote own = {0};
    int rc = vote_open(c, name, timeout_ms, &own);
    psc__sized_out(v, &own, sizeof own);
    return rc;
}

/* Reads and writes only the first version's fields of *v, which every
 * caller's struct has. */
int psc_vote(struct psc_client *c, struct psc_vote *v, int flag, int timeout_ms, int *any)
{
    *any = flag != 0;
    char why[PS_ERROR_TEXT_MAX];
    if (psc__sized_check_out(v, sizeof *v, PSC__VOTE_V1, "psc_vote", why, sizeof why) != 0)
        return psc__set_error(c, PS_EINVAL, "vote: %s", why);
    if (!v->bsp)
        return 0; /* no rounds to agree in: this worker's own answer */
    v->grad = flag ? -1.0f : 0.0f;
    uint64_t ticket;
    int rc = psc_push_pull(c, v->table, 0, 1, &v->grad, &v->share, v->clock, &ticket);
    if (rc == 0 && (rc = psc_wait(c, ticket, timeout_ms)) == PS_ETIMEDOUT) {
        /* grad and share live in *v, which outlives the call: a cancel the
         * library cannot finish yet (PS_EBUSY) leaves nothing dangling */
        (void)psc_cancel(c, ticket);
        psc__set_error(c, rc, "vote at round %llu: no answer within %d ms",
                       (unsigned long long)v->clock, timeout_ms);
    }
    if (rc != 0)
        return rc;
    v->clock++;
    *any = v->share != 0.0f;
    return 0;
}
