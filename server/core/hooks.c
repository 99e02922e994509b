/* Replication's hooks into a shard (hooks.h). */
#include "hooks.h"

#include <stdlib.h>

struct psd_hooks {
    psd_drop_hook on_drop;
    psd_stats_hook on_stats;
    psd_floor_hook on_floor;
    void *ctx;
};

struct psd_hooks *psd_hooks_create(void)
{
    return calloc(1, sizeof(struct psd_hooks));
}

void psd_hooks_destroy(struct psd_hooks *h)
{
    free(h);
}

void psd_set_hooks(struct psd *s, psd_drop_hook on_drop, psd_stats_hook on_stats,
                   psd_floor_hook on_floor, void *ctx)
{
    s->hooks->on_drop = on_drop;
    s->hooks->on_stats = on_stats;
    s->hooks->on_floor = on_floor;
    s->hooks->ctx = ctx;
}

void psd_hooks_drop(const struct psd *s, uint32_t w)
{
    if (s->hooks->on_drop != NULL)
        s->hooks->on_drop(s->hooks->ctx, w);
}

void psd_hooks_stats(const struct psd *s, Ps__Stats *st)
{
    if (s->hooks->on_stats != NULL)
        s->hooks->on_stats(s->hooks->ctx, st);
}

int psd_hooks_floor(const struct psd *s, uint32_t table, uint64_t floor)
{
    return s->hooks->on_floor == NULL || s->hooks->on_floor(s->hooks->ctx, table, floor);
}
