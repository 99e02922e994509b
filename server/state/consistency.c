/* BSP rounds, SSP bounds, ASP pass-through. */
#include "consistency.h"

#include "ps_err.h"
#include "ps_opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int psd_cons_parse(const char *s, struct psd_cons *out)
{
    out->staleness = 0;
    if (strcmp(s, "asp") == 0) {
        out->mode = PSD_ASP;
        return 0;
    }
    if (strcmp(s, "bsp") == 0) {
        out->mode = PSD_BSP;
        return 0;
    }
    uint64_t k = 0;
    if (strncmp(s, "ssp:", 4) == 0 && ps_parse_u64(s + 4, 0, 1000000, &k) == 0) {
        out->mode = PSD_SSP;
        out->staleness = (uint32_t)k;
        return 0;
    }
    return PS_EINVAL;
}

void psd_cons_name(const struct psd_cons *c, char *buf, size_t len)
{
    if (c->mode == PSD_SSP)
        snprintf(buf, len, "ssp:%u", c->staleness);
    else
        snprintf(buf, len, "%s", c->mode == PSD_BSP ? "bsp" : "asp");
}

int psd_cons_table_init(const struct psd_cons *c, struct psd_table *t)
{
    /* bsp applies once per clock; asp/ssp once per worker push */
    t->sched_div = c->mode == PSD_BSP ? 1 : c->workers;
    t->completed = calloc(c->workers, sizeof *t->completed);
    t->next = calloc(c->workers, sizeof *t->next);
    t->pass_end = calloc(c->workers, sizeof *t->pass_end);
    t->wgrad = calloc(c->workers, sizeof *t->wgrad);
    t->member = malloc(c->workers ? c->workers : 1);
    t->slowest = calloc(1, sizeof *t->slowest);
    if (!t->completed || !t->next || !t->pass_end || !t->wgrad || !t->member || !t->slowest)
        return PS_ENOMEM;
    for (uint32_t w = 0; w < c->workers; w++) {
        t->member[w] = (uint8_t)psd_table_pushed_by(t, w); /* only its pushers make rounds */
        t->next[w] = t->lo;
    }
    t->watermark = t->lo;
    return 0;
}

void psd_cons_table_fini(const struct psd_cons *c, struct psd_table *t)
{
    for (uint32_t w = 0; t->wgrad != NULL && w < c->workers; w++)
        free(t->wgrad[w]);
    free(t->wgrad);
    free(t->next);
    free(t->pass_end);
    free(t->completed);
    free(t->member);
    free(t->slowest);
    t->slowest = NULL;
    t->member = NULL;
    t->wgrad = NULL;
    t->next = NULL;
    t->pass_end = NULL;
    t->completed = NULL;
}

/* The furthest clock any worker pushed. */
static uint64_t max_completed(const struct psd_cons *c, const struct psd_table *t)
{
    uint64_t m = 0;
    for (uint32_t w = 0; w < c->workers; w++)
        m = t->completed[w] > m ? t->completed[w] : m;
    return m;
}

/* The slowest member's clock; with no members, the furthest clock pushed
 * (*none set: nobody to wait for). A scan of every worker, kept in
 * t->slowest until something changes what it found: asp and ssp answer
 * every request with it, and a thousand workers made the scan a third
 * of a request's cost. */
static uint64_t slowest_member(const struct psd_cons *c, const struct psd_table *t, int *none)
{
    struct psd_slowest *sl = t->slowest;
    if (sl != NULL && sl->ok) {
        *none = 0;
        return sl->clock;
    }
    uint64_t m = UINT64_MAX;
    uint32_t at = 0;
    for (uint32_t w = 0; w < c->workers; w++)
        if (t->member[w] && t->completed[w] <= m) {
            at = t->completed[w] == m ? at + 1 : 1;
            m = t->completed[w];
        }
    *none = m == UINT64_MAX;
    if (sl != NULL && !*none)
        *sl = (struct psd_slowest){.clock = m, .at = at, .ok = 1};
    return *none ? max_completed(c, t) : m;
}

void psd_cons_touched(struct psd_table *t)
{
    if (t->slowest != NULL)
        t->slowest->ok = 0;
}

void psd_cons_completed(struct psd_table *t, uint32_t w, uint64_t clock)
{
    uint64_t old = t->completed[w];
    int was = t->member[w];
    t->member[w] = 1;
    if (clock + 1 > old)
        t->completed[w] = clock + 1;
    struct psd_slowest *sl = t->slowest;
    if (sl == NULL || !sl->ok)
        return;
    uint64_t now = t->completed[w];
    if (was && old == sl->clock && now != old && --sl->at == 0)
        sl->ok = 0; /* the last at the slowest clock moved on: scan again */
    else if (!was && now < sl->clock)
        *sl = (struct psd_slowest){.clock = now, .at = 1, .ok = 1};
    else if (!was && now == sl->clock)
        sl->at++;
}

uint64_t psd_cons_clock(const struct psd_cons *c, const struct psd_table *t)
{
    if (c->mode == PSD_BSP)
        return t->clock;
    int none;
    return slowest_member(c, t, &none);
}

int psd_cons_reachable(const struct psd_cons *c, const struct psd_table *t, uint64_t clock)
{
    if (c->mode == PSD_ASP || t->restored || t->recovering)
        return 1;
    uint64_t now = psd_cons_clock(c, t),
             reach = c->mode == PSD_BSP ? 2 : (uint64_t)c->staleness + 2;
    return clock <= now || clock - now <= reach;
}

uint64_t psd_cons_join_clock(const struct psd_cons *c, const struct psd_table *t, uint32_t w)
{
    if (c->mode == PSD_ASP)
        return w < c->workers ? t->completed[w] : 0;
    if (c->mode == PSD_BSP && w < c->workers && !t->member[w]) {
        int none = 0;
        (void)slowest_member(c, t, &none);
        /* with no member left nobody closes the rounds in between: it
         * joins at the table's clock, whose pull is answered at once */
        return none ? t->clock : t->clock + 2;
    }
    return psd_cons_clock(c, t);
}

int psd_cons_ready(const struct psd_cons *c, const struct psd_table *t, uint64_t clock,
                   uint64_t offset, uint64_t count)
{
    if (t->await_set && t->set_next < t->hi)
        return 0; /* the initial values are not all there yet (OP_SET) */
    switch (c->mode) {
    case PSD_BSP:
        return t->clock >= clock || (t->clock + 1 == clock && t->watermark >= offset + count);
    case PSD_SSP: {
        int none;
        uint64_t low = slowest_member(c, t, &none);
        return none || low + c->staleness >= clock;
    }
    case PSD_ASP:
    default:
        return 1;
    }
}

void psd_cons_missing(const struct psd_cons *c, const struct psd_table *t, uint64_t clock,
                      char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t w = 0; w < c->workers && used + 12 < len; w++) {
        int missing = t->member[w] && (c->mode == PSD_BSP ? t->next[w] < t->hi && t->clock < clock
                                                          : t->completed[w] + c->staleness < clock);
        if (missing)
            used += (size_t)snprintf(buf + used, len - used, "%s%u", used ? ", " : "", w);
    }
}

/* Applies [watermark, upto) of the round: the gradients of every member,
 * summed in worker order, averaged. */
static void bsp_advance(const struct psd_cons *c, struct psd_table *t, uint64_t upto)
{
    size_t a = (size_t)(t->watermark - t->lo), n = (size_t)(upto - t->watermark);
    float *acc = NULL;
    uint32_t members = 0;
    for (uint32_t w = 0; w < c->workers; w++) {
        if (!t->member[w])
            continue;
        members++;
        const float *g = t->wgrad[w] + a;
        if (acc == NULL) {
            acc = t->wgrad[w] + a;
            continue;
        }
        for (size_t i = 0; i < n; i++)
            acc[i] += g[i];
    }
    float inv = 1.0f / (float)members;
    for (size_t i = 0; i < n; i++)
        acc[i] *= inv;
    psd_table_apply(t, t->watermark, n, acc, t->clock + 1);
    t->watermark = upto;
}

/* Before a round's first update: the mask for this step, so that every
 * chunk answered for the next clock shows the same mask. */
static void round_begin(const struct psd_cons *c, struct psd_table *t)
{
    (void)c;
    if (t->round_begun != t->clock + 1) {
        t->round_begun = t->clock + 1;
        psd_table_prune_step(t, t->clock);
    }
}

static void bsp_close_round(const struct psd_cons *c, struct psd_table *t)
{
    t->recovering = 0;
    t->clock++;
    t->steps = t->clock;
    t->watermark = t->lo;
    for (uint32_t w = 0; w < c->workers; w++)
        t->next[w] = t->lo;
}

/* Worker w's gradient buffer for the round, allocated once. */
static float *round_buffer(struct psd_table *t, uint32_t w)
{
    if (t->wgrad[w] == NULL) {
        size_t len = (size_t)(t->hi - t->lo);
        t->wgrad[w] = malloc(len ? len * sizeof(float) : sizeof(float));
    }
    return t->wgrad[w];
}

/* After worker pushes: applies the prefix every worker has pushed, and
 * closes the round at the shard's end. Sets *applied when weights moved. */
static void bsp_settle(const struct psd_cons *c, struct psd_table *t, int *applied)
{
    uint64_t low = t->hi;
    int members = 0;
    for (uint32_t i = 0; i < c->workers; i++) {
        if (t->member[i]) {
            members = 1;
            low = t->next[i] < low ? t->next[i] : low;
        }
    }
    if (!members || low <= t->watermark)
        return;
    if (c->workers > 1)
        bsp_advance(c, t, low);
    t->watermark = low;
    *applied = 1;
    if (t->watermark == t->hi)
        bsp_close_round(c, t);
}

/* A table restored from a checkpoint is behind workers that went on with
 * the other shards. The rounds in between cannot be replayed consistently
 * (the other shards applied them), so its first push of a later clock
 * moves it there; the rounds skipped are counted (and logged by psd). */
static void skip_to(const struct psd_cons *c, struct psd_table *t, uint64_t clock)
{
    t->rounds_lost += clock - t->clock;
    t->clock = clock;
    t->steps = clock;
    t->watermark = t->lo;
    for (uint32_t w = 0; w < c->workers; w++)
        t->next[w] = t->lo;
}

static void catch_up(const struct psd_cons *c, struct psd_table *t, uint64_t clock)
{
    if (!t->restored)
        return;
    t->restored = 0;
    if (clock > t->clock && t->watermark == t->lo)
        skip_to(c, t, clock);
}

/* A push from a non-member joins the round when nothing of the round has
 * been applied yet and it is the start of the worker's range for it. */
static int bsp_join(struct psd_table *t, uint32_t w, uint64_t clock, uint64_t offset)
{
    if (t->member[w])
        return 1;
    if (!psd_table_pushed_by(t, w) || clock != t->clock || offset != t->lo || t->watermark != t->lo)
        return 0;
    t->member[w] = 1;
    psd_cons_touched(t);
    t->next[w] = t->lo;
    return 1;
}

/* A chunk that came before the chunks it follows: a restarted shard lost
 * those, and the worker re-sends them. Retryable, not applied. */
static int bsp_later(const struct psd_table *t, uint32_t w, uint64_t offset, uint64_t count,
                     uint64_t first, char *err, size_t errlen)
{
    snprintf(err, errlen,
             "bsp: worker %u pushed [%llu, %llu) of '%s' before [%llu, %llu) of clock %llu: "
             "send it again after those",
             w, (unsigned long long)offset, (unsigned long long)(offset + count), t->name,
             (unsigned long long)first, (unsigned long long)offset, (unsigned long long)t->clock);
    return PS_EAGAIN;
}

void psd_cons_pulled(const struct psd_cons *c, struct psd_table *t, uint32_t w, uint64_t clock)
{
    if (c->mode == PSD_BSP && w < c->workers)
        (void)bsp_join(t, w, clock, t->lo); /* as its push of the round's start would */
}

static int bsp_push(const struct psd_cons *c, struct psd_table *t, uint32_t w, uint64_t clock,
                    uint64_t offset, uint64_t count, const float *g, int *applied, char *err,
                    size_t errlen)
{
    catch_up(c, t, clock);
    if (t->recovering && clock > t->clock && t->member[w] && t->next[w] == t->lo &&
        t->watermark == t->lo) {
        /* The first push after the restore set the clock, but w is past it:
         * the round closed before the restart (this shard applied w's
         * pushes of it, then lost them), and w will not push it again. Move
         * on to w's clock, the round lost with what other workers pushed of
         * it here (their next push of it is stale, and they rejoin). */
        skip_to(c, t, clock);
        *applied = 1; /* pulls of the new clock can be answered */
    }
    if (t->recovering && clock < t->clock)
        return PSD_CONS_STALE; /* a round skipped above: not applied */
    if (!bsp_join(t, w, clock, offset)) {
        /* the start of its range for this round may still be on its way
         * (lost in a restart, re-sent later): not stale yet */
        if (clock == t->clock && t->watermark == t->lo && offset > t->lo)
            return bsp_later(t, w, offset, count, t->lo, err, errlen);
        return PSD_CONS_STALE;
    }
    if (clock != t->clock) {
        snprintf(err, errlen, "bsp: push for clock %llu, but '%s' is at clock %llu",
                 (unsigned long long)clock, t->name, (unsigned long long)t->clock);
        return PS_ESTATE;
    }
    if (offset > t->next[w])
        return bsp_later(t, w, offset, count, t->next[w], err, errlen);
    if (offset != t->next[w]) {
        snprintf(err, errlen,
                 "bsp: worker %u pushed [%llu, %llu) of '%s', but [%llu, ...) comes next in "
                 "clock %llu (pushes go in order, each element once)",
                 w, (unsigned long long)offset, (unsigned long long)(offset + count), t->name,
                 (unsigned long long)t->next[w], (unsigned long long)clock);
        return PS_ESTATE;
    }
    if (t->watermark == t->lo) /* at most once per round, see round_begin */
        round_begin(c, t);
    t->next[w] += count;
    if (t->next[w] == t->hi) {
        t->completed[w] = clock + 1;
        psd_cons_touched(t);
    }
    if (c->workers == 1) { /* a round of one: apply straight from the frame */
        psd_table_apply(t, offset, count, g, clock + 1);
    } else {
        float *buf = round_buffer(t, w);
        if (buf == NULL) {
            t->next[w] -= count;
            snprintf(err, errlen, "bsp: out of memory for worker %u's gradient", w);
            return PS_ENOMEM;
        }
        memcpy(buf + (offset - t->lo), g, (size_t)count * sizeof(float));
    }
    bsp_settle(c, t, applied);
    return 0;
}

void psd_cons_apply_later(const struct psd_cons_later *l)
{
    if (l->t == NULL)
        return;
    if (l->keys != NULL)
        psd_table_apply_keys(l->t, l->keys, l->g, (size_t)l->count, l->step);
    else
        psd_table_apply(l->t, l->offset, l->count, l->g, l->step);
    if (l->prune_step != 0)
        psd_table_prune_step(l->t, l->prune_step);
}

/* An asp/ssp push's step: handed to the caller to apply after its reply,
 * or applied now. */
static void take(const struct psd_cons_later *l, struct psd_cons_later *later)
{
    if (later != NULL)
        *later = *l;
    else
        psd_cons_apply_later(l);
}

static int push_range(const struct psd_cons *c, struct psd_table *t, const struct psd_cons_push *p,
                      int *applied, struct psd_cons_later *later, char *err, size_t errlen)
{
    const uint32_t worker = p->worker;
    const uint64_t clock = p->clock, offset = p->offset, count = p->count;
    const float *g = p->g;
    const int continues = p->continues;
    if (worker >= c->workers) {
        if (c->mode != PSD_ASP) {
            snprintf(err, errlen, "worker id %u is not in [0, %u) (psd --workers %u)", worker,
                     c->workers, c->workers);
            return PS_EINVAL;
        }
    } else if (c->mode == PSD_BSP) {
        return bsp_push(c, t, worker, clock, offset, count, g, applied, err, errlen);
    } else {
        psd_cons_completed(t, worker, clock);
    }
    /* The optimizer's step (Adam's bias correction, the lr schedule, the
     * pruning schedule) counts passes over the table, not requests: a
     * worker sending its gradient in chunks, in order, takes one step, as
     * it would in one push. A chunk starts the worker's next pass when it
     * does not lie past the end of its last one. A table at step 0 always
     * starts a pass: pass_end is only set after one, so this adds nothing
     * today, but no later change can then hand the optimizer step 0 (Adam
     * divides by 1 - beta^step). A piece that continues a request (the
     * client says so) never starts one, even out of order (a piece sent
     * again after a restart) or from an untracked worker. */
    int pass = t->steps == 0 || (!continues && (worker >= c->workers || t->pass_end[worker] == 0 ||
                                                offset < t->pass_end[worker]));
    if (worker < c->workers)
        t->pass_end[worker] = offset + count;
    if (pass)
        t->steps++;
    struct psd_cons_later l = {
        .t = t,
        .g = g,
        .offset = offset,
        .count = count,
        .step = t->steps,
        /* a clock's worth of passes */
        .prune_step = pass && t->steps % t->sched_div == 0 ? t->steps / t->sched_div : 0};
    take(&l, later);
    *applied = 1;
    return 0;
}

static int check_worker(const struct psd_cons *c, uint32_t worker, char *err, size_t errlen)
{
    if (worker < c->workers || c->mode == PSD_ASP)
        return 0;
    snprintf(err, errlen, "worker id %u is not in [0, %u) (psd --workers %u)", worker, c->workers,
             c->workers);
    return PS_EINVAL;
}

static int push_keys(const struct psd_cons *c, struct psd_table *t, const struct psd_cons_push *p,
                     int *applied, struct psd_cons_later *later, char *err, size_t errlen)
{
    const uint32_t worker = p->worker;
    const uint64_t clock = p->clock;
    const uint64_t *keys = p->keys;
    const float *g = p->g;
    const size_t n = (size_t)p->count;
    int rc = check_worker(c, worker, err, errlen);
    if (rc != 0)
        return rc;
    if (c->mode == PSD_BSP)
        catch_up(c, t, clock);
    if (c->mode != PSD_BSP) {
        if (worker < c->workers) {
            psd_cons_completed(t, worker, clock);
            t->pass_end[worker] = 0; /* a pass of its own (push_range) */
        }
        t->steps++;
        struct psd_cons_later l = {.t = t,
                                   .keys = keys,
                                   .g = g,
                                   .count = n,
                                   .step = t->steps,
                                   .prune_step =
                                       t->steps % t->sched_div == 0 ? t->steps / t->sched_div : 0};
        take(&l, later);
        *applied = 1;
        return 0;
    }
    if (!bsp_join(t, worker, clock, t->lo))
        return PSD_CONS_STALE;
    if (clock != t->clock || t->next[worker] != t->lo) {
        snprintf(err, errlen,
                 "bsp: sparse push of '%s' for clock %llu, but the table is at clock %llu and "
                 "worker %u has pushed up to %llu of it",
                 t->name, (unsigned long long)clock, (unsigned long long)t->clock, worker,
                 (unsigned long long)t->next[worker]);
        return PS_ESTATE;
    }
    if (t->watermark == t->lo)
        round_begin(c, t);
    t->next[worker] = t->hi;
    t->completed[worker] = clock + 1;
    psd_cons_touched(t);
    if (c->workers == 1) {
        psd_table_apply_keys(t, keys, g, n, clock + 1);
    } else {
        float *buf = round_buffer(t, worker);
        if (buf == NULL) {
            t->next[worker] = t->lo;
            snprintf(err, errlen, "bsp: out of memory for worker %u's gradient", worker);
            return PS_ENOMEM;
        }
        memset(buf, 0, (size_t)(t->hi - t->lo) * sizeof(float));
        for (size_t i = 0; i < n; i++)
            buf[keys[i] - t->lo] = g[i];
    }
    bsp_settle(c, t, applied);
    return 0;
}

int psd_cons_push(const struct psd_cons *c, struct psd_table *t, const struct psd_cons_push *p,
                  int *applied, struct psd_cons_later *later, char *err, size_t errlen)
{
    *applied = 0;
    if (!psd_table_pushed_by(t, p->worker)) {
        snprintf(err, errlen,
                 "worker %u does not push '%s': its spec names the %u workers that do (the first "
                 "is %u)",
                 p->worker, t->name, t->npushers, t->pushers[0]);
        return PS_EINVAL;
    }
    return p->keys != NULL ? push_keys(c, t, p, applied, later, err, errlen)
                           : push_range(c, t, p, applied, later, err, errlen);
}

int psd_cons_check_pushers(const struct psd_cons *c, const Ps__TableSpec *spec, char *err,
                           size_t errlen)
{
    for (size_t i = 0; i < spec->n_pushers; i++)
        if (spec->pushers[i] >= c->workers) {
            snprintf(err, errlen,
                     "table '%s': pusher %u is not one of the %u workers of the rounds (psd "
                     "--workers)",
                     spec->name, spec->pushers[i], c->workers);
            return PS_EINVAL;
        }
    return 0;
}

void psd_cons_leave(const struct psd_cons *c, struct psd_table *t, uint32_t w, int *applied)
{
    *applied = 0;
    if (w >= c->workers || !t->member[w])
        return;
    t->member[w] = 0;
    psd_cons_touched(t);
    if (c->mode == PSD_BSP)
        bsp_settle(c, t, applied);
    else
        *applied = 1; /* the slowest member may have changed */
}
