/* The data ops (ops.h). */
#include "ops.h"

#include "catalog.h"
#include "counters.h"
#include "dedup.h"
#include "live.h"
#include "regions.h"
#include "reply.h"
#include "waits.h"

#include "ps_err.h"
#include "ps_finite.h"
#include "ps_half.h"
#include "ps_shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct psd_ops {
    float *scratch; /* aligned copy of values when a frame is misaligned */
    size_t scratch_cap;
    uint64_t *keys_scratch; /* aligned copy of a keys frame */
    size_t keys_cap;
    uint64_t nonfinite_refused; /* pushes refused for a NaN or an infinity */
};

struct psd_ops *psd_ops_create(void)
{
    return calloc(1, sizeof(struct psd_ops));
}

void psd_ops_destroy(struct psd_ops *o)
{
    if (o != NULL) {
        free(o->scratch);
        free(o->keys_scratch);
    }
    free(o);
}

uint64_t psd_nonfinite_refused(const struct psd *s)
{
    return s->ops->nonfinite_refused;
}

/* Values as aligned f32: the frame itself when it is aligned f32, else a
 * copy or a conversion into the server's scratch buffer. */
static const float *values_f32(struct psd *s, const struct ps_wire_msg *m)
{
    int f32 = m->hdr->dtype == PS__DTYPE__DTYPE_F32;
    if (f32 && ((uintptr_t)m->vals % _Alignof(float)) == 0)
        return m->vals;
    size_t need = (size_t)m->hdr->count * m->hdr->dim * sizeof(float);
    struct psd_ops *o = s->ops;
    if (need > o->scratch_cap) {
        float *p = realloc(o->scratch, need);
        if (p == NULL)
            return NULL;
        o->scratch = p;
        o->scratch_cap = need;
    }
    if (f32)
        memcpy(o->scratch, m->vals, need);
    else
        ps_half_to_f32_n(m->hdr->dtype, m->vals, o->scratch, need / sizeof(float));
    return o->scratch;
}

/* The answer to a retried push: applied before, not again. */
static void reply_duplicate(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    Ps__Header h;
    psd_reply_init(&h, req);
    h.duplicate = 1;
    psd_reply_header(s, &h, rep);
}

/* Server-state checks shared by pull, push and push-pull. */
static struct psd_table *check_range(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    struct psd_table *t = psd_table_at(s, req->table_id);
    if (t == NULL) {
        psd_reply_errorf(s, req, PS_ENOTABLE, rep, "%s: no table with id %u (this shard has %u)",
                         ps_op_name(req->op), req->table_id, psd_ntables(s));
        return NULL;
    }
    if (t->sparse)
        return t; /* op_rows checks keys and dim */
    if (req->layout == PS__LAYOUT__LAYOUT_KEYS) {
        if (req->op != PS__OP__OP_PUSH || req->dim != 1) {
            psd_reply_errorf(s, req, PS_ENOTSUP, rep,
                             "%s: table '%s' is dense; it takes keyed pushes of dim 1 only (keyed "
                             "pulls need a sparse table)",
                             ps_op_name(req->op), t->name);
            return NULL;
        }
        return t; /* the keys are checked against the shard by op_keys */
    }
    if (req->offset < t->lo || req->offset + req->count > t->hi) {
        psd_reply_errorf(s, req, PS_ERANGE, rep,
                         "%s: [%llu, %llu) is outside shard %u's range [%llu, %llu) of table '%s' "
                         "(size %llu)",
                         ps_op_name(req->op), (unsigned long long)req->offset,
                         (unsigned long long)(req->offset + req->count), s->conf.shard,
                         (unsigned long long)t->lo, (unsigned long long)t->hi, t->name,
                         (unsigned long long)t->size);
        return NULL;
    }
    return t;
}

/* A push's gradient: in the region at shm_in when the request names it
 * there (shm_part), else its values frame as f32 (NULL: out of memory). */
static const float *push_values(struct psd *s, const struct ps_wire_msg *m,
                                const unsigned char *shm_in)
{
    if (shm_in == NULL)
        return values_f32(s, m);
    psd_regions_count_in(s->shm, m->hdr->count * sizeof(float));
    return (const float *)shm_in;
}

/* A push's gradient must be finite unless psd --allow-nonfinite: one NaN
 * or infinity would poison the weights for good (and in bsp the round's
 * average). n values; keys, when not NULL, name each row of dim values
 * (else they are elements from req's offset). 1 with an error reply
 * naming the table and the first bad element, 0 when it may be applied. */
static int refuse_nonfinite(struct psd *s, const Ps__Header *req, const struct psd_table *t,
                            const float *g, size_t n, const uint64_t *keys, uint32_t dim,
                            struct psd_reply *rep)
{
    size_t i = s->conf.allow_nonfinite ? n : ps_first_nonfinite(g, n);
    if (i == n)
        return 0;
    s->ops->nonfinite_refused++;
    char at[64];
    if (keys == NULL)
        snprintf(at, sizeof at, "element %llu", (unsigned long long)(req->offset + i));
    else if (dim == 1)
        snprintf(at, sizeof at, "key %llu", (unsigned long long)keys[i]);
    else
        snprintf(at, sizeof at, "key %llu, column %u", (unsigned long long)keys[i / dim],
                 (unsigned)(i % dim));
    psd_reply_errorf(s, req, PS_EINVAL, rep,
                     "%s: the gradient of '%s' holds %g at %s: refused, nothing applied (psd "
                     "--allow-nonfinite takes such pushes)",
                     ps_op_name(req->op), t->name, (double)g[i], at);
    return 1;
}

/* n keys into the scratch array (NULL when it cannot grow). */
static uint64_t *keys_scratch(struct psd *s, size_t n)
{
    struct psd_ops *o = s->ops;
    if (n > o->keys_cap) {
        uint64_t *p = realloc(o->keys_scratch, n * sizeof *p);
        if (p == NULL)
            return NULL;
        o->keys_scratch = p;
        o->keys_cap = n;
    }
    return o->keys_scratch;
}

/* The keys frame as aligned uint64s: the frame itself where it is aligned
 * on a little-endian host (zmq's large messages are), else a copy. */
static const uint64_t *keys_u64(struct psd *s, const struct ps_wire_msg *m)
{
    size_t n = (size_t)m->hdr->count;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (((uintptr_t)m->keys % _Alignof(uint64_t)) == 0)
        return m->keys;
#endif
    uint64_t *k = keys_scratch(s, n);
    for (size_t i = 0; k != NULL && i < n; i++)
        k[i] = ps_wire_key(m->keys, i);
    return k;
}

/* A keyed push's keys that lie in the client's region (PS_SHM_KEYS): copied
 * out first, since the client may write the region at any time, then
 * checked as the decoder checks a keys frame. NULL with an error reply. */
static const uint64_t *keys_from_region(struct psd *s, const struct ps_frame *route,
                                        const Ps__Header *req, struct psd_reply *rep)
{
    unsigned char *p = NULL;
    if (psd_region_part(s, route, req, req->shm, PS_SHM_KEYS, req->shm_keys, &p, rep) != 0)
        return NULL;
    size_t n = (size_t)req->count;
    uint64_t *k = keys_scratch(s, n);
    if (k == NULL) {
        psd_reply_errorf(s, req, PS_ENOMEM, rep, "%s: out of memory for %zu keys",
                         ps_op_name(req->op), n);
        return NULL;
    }
    /* copied and checked a block at a time, while the block is in L1 */
    enum { BLOCK = 2048 };
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i += BLOCK) {
        size_t m = n - i < BLOCK ? n - i : BLOCK, from = i > 0 ? i - 1 : 0;
        memcpy(k + i, p + i * sizeof *k, m * sizeof *k);
        size_t b = ps_wire_keys_unordered(k + from, i + m - from); /* reads little-endian */
        if (b < i + m - from)
            bad = from + b;
    }
    if (bad < n) {
        psd_reply_errorf(s, req, PS_EPROTO, rep,
                         "%s: keys in shared memory must be strictly increasing: key[%zu]=%llu "
                         "after %llu",
                         ps_op_name(req->op), bad, (unsigned long long)ps_wire_key(k, bad),
                         (unsigned long long)ps_wire_key(k, bad - 1));
        return NULL;
    }
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    for (size_t i = 0; i < n; i++)
        k[i] = le64toh(k[i]);
#endif
    psd_regions_count_in(s->shm, n * sizeof *k);
    return k;
}

/* Where a push that applies on arrival (asp/ssp) may be answered before
 * its optimizer step: its values are in the message, which stays psd's
 * until the dispatch returns, and not in the client's region, which the
 * client may write again once answered. The step then runs while the
 * answer crosses the wire and the client's next request comes in; no
 * request sees the table before it is done, since the loop runs one at a
 * time. */
static int ack_first(const struct psd *s, const Ps__Header *req)
{
    return psd_can_send(s) && !(req->shm & PS_SHM_IN);
}

/* A push's reply: its clock, and whether it was dropped as stale. */
static void push_reply(struct psd *s, const Ps__Header *req, struct psd_table *t, int stale,
                       struct psd_reply *rep)
{
    Ps__Header h;
    psd_reply_init(&h, req);
    h.stale = stale != 0;
    h.clock = psd_cons_clock(&s->conf.cons, t);
    psd_reply_header(s, &h, rep);
}

/* Answers a push taken for later (never stale) through the sender, then
 * runs its optimizer step (see ack_first). The caller releases waits
 * after it and returns 0: nothing is left for the dispatch to send. */
static void answer_first(struct psd *s, const struct ps_frame *route, const Ps__Header *req,
                         struct psd_table *t, const struct psd_cons_later *later,
                         struct psd_reply *rep)
{
    push_reply(s, req, t, 0, rep);
    psd_reply_send(s, route->data, route->size, rep);
    psd_cons_apply_later(later);
}

/* A sparse push into a dense table: element indices as keys. Returns
 * psd_dispatch's "reply now". */
static enum psd_answer op_keys(struct psd *s, struct psd_table *t, const struct ps_frame *route,
                               const struct ps_wire_msg *m, struct psd_reply *rep)
{
    const Ps__Header *req = m->hdr;
    if (psd_dedup_seen(s, req)) {
        reply_duplicate(s, req, rep);
        return PSD_ANSWER_NOW;
    }
    unsigned char *shm_in = NULL;
    if (psd_region_part(s, route, req, req->shm, PS_SHM_IN, req->shm_in, &shm_in, rep) != 0)
        return PSD_ANSWER_NOW;
    const uint64_t *keys = NULL;
    if (req->shm & PS_SHM_KEYS) {
        if ((keys = keys_from_region(s, route, req, rep)) == NULL)
            return PSD_ANSWER_NOW;
    } else {
        keys = keys_u64(s, m);
    }
    const float *g = push_values(s, m, shm_in);
    if (keys == NULL || g == NULL) {
        psd_reply_errorf(s, req, PS_ENOMEM, rep, "push: out of memory for %llu keys",
                         (unsigned long long)req->count);
        return PSD_ANSWER_NOW;
    }
    if (refuse_nonfinite(s, req, t, g, (size_t)req->count, keys, 1, rep))
        return PSD_ANSWER_NOW;
    uint64_t first = keys[0], last = keys[req->count - 1];
    if (first < t->lo || last >= t->hi) {
        psd_reply_errorf(s, req, PS_ERANGE, rep,
                         "push: keys %llu..%llu are outside shard %u's range [%llu, %llu) of '%s'",
                         (unsigned long long)first, (unsigned long long)last, s->conf.shard,
                         (unsigned long long)t->lo, (unsigned long long)t->hi, t->name);
        return PSD_ANSWER_NOW;
    }
    int applied = 0;
    char err[PS_ERROR_TEXT_MAX];
    struct psd_cons_later later = {0};
    const struct psd_cons_push push = {
        .worker = req->worker_id, .clock = req->clock, .keys = keys, .count = req->count, .g = g};
    int rc = psd_cons_push(&s->conf.cons, t, &push, &applied, ack_first(s, req) ? &later : NULL,
                           err, sizeof err);
    if (rc < 0) {
        psd_reply_error(s, req, rc, err, rep);
        return PSD_ANSWER_NOW;
    }
    t->pushes++;
    if (rc == PSD_CONS_STALE)
        psd_live_stale(s, req, t);
    else
        psd_dedup_applied(s, req);
    if (later.t != NULL)
        answer_first(s, route, req, t, &later, rep);
    if (applied)
        psd_release_waits(s); /* before this reply's header: both are packed in one buffer */
    if (later.t != NULL)
        return PSD_ANSWER_LATER;
    push_reply(s, req, t, rc == PSD_CONS_STALE, rep);
    return PSD_ANSWER_NOW;
}

/* Pull, push or push-pull of rows of a sparse table. Sparse tables apply
 * pushes on arrival and answer pulls at once, whatever the mode. */
/* Rows of a sparse table: keys in a frame or the client's region, a
 * push's values and a pull's reply in frames or in the region (f32). */
static void op_rows(struct psd *s, struct psd_table *t, const struct ps_frame *route,
                    const struct ps_wire_msg *m, struct psd_reply *rep)
{
    const Ps__Header *req = m->hdr;
    if (req->layout != PS__LAYOUT__LAYOUT_KEYS || req->dim != t->dim) {
        psd_reply_errorf(s, req, PS_EINVAL, rep,
                         "%s: table '%s' is sparse: send keys with dim %u (got layout %d, dim %u)",
                         ps_op_name(req->op), t->name, t->dim, (int)req->layout, req->dim);
        return;
    }
    size_t n = (size_t)req->count;
    /* count and dim are bounded by the decoder: the product fits */
    uint64_t vbytes = (uint64_t)n * t->dim * sizeof(float);
    unsigned char *shm_in = NULL, *shm_out = NULL;
    uint32_t shm = req->shm;
    if (psd_region_bytes(s, route, req, shm, PS_SHM_IN, req->shm_in, vbytes, &shm_in, rep) ||
        psd_region_bytes(s, route, req, shm, PS_SHM_OUT, req->shm_out, vbytes, &shm_out, rep))
        return;
    const uint64_t *keys = NULL;
    if (req->shm & PS_SHM_KEYS) {
        if ((keys = keys_from_region(s, route, req, rep)) == NULL)
            return;
    } else if ((keys = keys_u64(s, m)) == NULL) {
        psd_reply_errorf(s, req, PS_ENOMEM, rep, "%s: out of memory for keys", ps_op_name(req->op));
        return;
    }
    /* (with one shard every key is its own: a call a key took 3% of a
     * 64k-key request's time) */
    for (size_t i = 0; s->conf.shards > 1 && i < n; i++) {
        uint32_t owner = ps_shard_of_key(keys[i], s->conf.shards);
        if (owner != s->conf.shard) {
            psd_reply_errorf(
                s, req, PS_ERANGE, rep, "%s: key %llu of '%s' belongs to shard %u, not %u",
                ps_op_name(req->op), (unsigned long long)keys[i], t->name, owner, s->conf.shard);
            return;
        }
    }
    char err[PS_ERROR_TEXT_MAX];
    int dup = req->op != PS__OP__OP_PULL && psd_dedup_seen(s, req);
    if (dup && req->op == PS__OP__OP_PUSH) {
        reply_duplicate(s, req, rep);
        return;
    }
    if (req->op != PS__OP__OP_PULL && !dup) {
        const float *g = shm_in != NULL ? (const float *)shm_in : values_f32(s, m);
        if (shm_in != NULL)
            psd_regions_count_in(s->shm, vbytes);
        if (g != NULL && refuse_nonfinite(s, req, t, g, (size_t)n * t->dim, keys, t->dim, rep))
            return;
        int rc = g == NULL ? PS_ENOMEM : psd_table_push_rows(t, keys, g, n, err, sizeof err);
        if (rc != 0) {
            psd_reply_error(s, req, rc, g == NULL ? "out of memory" : err, rep);
            return;
        }
        t->pushes++;
        psd_dedup_applied(s, req);
        if (req->worker_id < s->conf.cons.workers &&
            req->clock + 1 > t->completed[req->worker_id]) {
            t->completed[req->worker_id] = req->clock + 1;
            psd_cons_touched(t);
        }
    }
    Ps__Header h;
    psd_reply_init(&h, req);
    h.duplicate = dup;
    if (req->op != PS__OP__OP_PUSH && shm_out != NULL) { /* written where the client reads */
        int rc = psd_table_pull_rows(t, keys, n, (float *)shm_out, err, sizeof err);
        if (rc != 0) {
            psd_reply_error(s, req, rc, err, rep);
            return;
        }
        psd_regions_count_out(s->shm, vbytes);
        t->pulls++;
        h.layout = PS__LAYOUT__LAYOUT_KEYS;
        h.count = req->count;
        h.dim = t->dim;
        h.shm = PS_SHM_OUT;
        h.shm_out = req->shm_out;
    } else if (req->op != PS__OP__OP_PUSH) {
        size_t elems = n * t->dim, esize = ps_dtype_size(req->dtype);
        /* f32 rows go straight into the reply; halves through a buffer */
        int f32 = req->dtype == PS__DTYPE__DTYPE_F32;
        void *out = aligned_alloc(64, (elems * esize + 63u) & ~(size_t)63u);
        float *rows = f32 ? out : malloc(elems * sizeof(float));
        int rc = rows && out ? psd_table_pull_rows(t, keys, n, rows, err, sizeof err) : PS_ENOMEM;
        if (rc == 0 && !f32)
            ps_f32_to_half_n(req->dtype, rows, out, elems);
        if (!f32)
            free(rows);
        if (rc != 0) {
            free(out);
            psd_reply_error(s, req, rc, rc == PS_ENOMEM && !(rows && out) ? "out of memory" : err,
                            rep);
            return;
        }
        t->pulls++;
        h.layout = PS__LAYOUT__LAYOUT_KEYS;
        h.count = req->count;
        h.dim = t->dim;
        h.dtype = req->dtype;
        rep->vals = out;
        rep->vals_bytes = elems * esize;
    }
    psd_reply_header(s, &h, rep);
}

/* What a dense push did beyond its update, for the log: rounds a restored
 * table lost catching up, a pruning step. */
static void log_push(struct psd *s, const struct psd_table *t, uint64_t prune_updates,
                     uint64_t lost)
{
    if (t->rounds_lost != lost)
        PS_LOG(s->conf.log, PS_LOG_WARN, S0620,
               "'%s' restored at an older clock caught up with its workers at clock %llu: %llu "
               "round(s) of its updates were lost",
               t->name, (unsigned long long)t->clock, (unsigned long long)(t->rounds_lost - lost));
    if (t->prune_updates != prune_updates)
        PS_LOG(s->conf.log, PS_LOG_INFO, S0320,
               "pruned '%s' at step %llu: %llu of %llu weights (target now %.4f)", t->name,
               (unsigned long long)t->steps, (unsigned long long)t->npruned,
               (unsigned long long)(t->hi - t->lo), t->prune_target_now);
}

enum psd_answer psd_op_data(struct psd *s, const struct ps_frame *route,
                            const struct ps_wire_msg *m, struct psd_reply *rep)
{
    const Ps__Header *req = m->hdr;
    struct psd_table *t = check_range(s, req, rep);
    if (t == NULL)
        return PSD_ANSWER_NOW;
    if (t->sparse) {
        op_rows(s, t, route, m, rep);
        return PSD_ANSWER_NOW;
    }
    if (req->layout == PS__LAYOUT__LAYOUT_KEYS)
        return op_keys(s, t, route, m, rep);
    unsigned char *shm_in, *shm_out;
    if (psd_region_part(s, route, req, req->shm, PS_SHM_IN, req->shm_in, &shm_in, rep) != 0 ||
        psd_region_part(s, route, req, req->shm, PS_SHM_OUT, req->shm_out, &shm_out, rep) != 0)
        return PSD_ANSWER_NOW;
    int applied = 0;
    uint64_t prune_updates = t->prune_updates, lost = t->rounds_lost;
    /* a retried push is acknowledged; a retried push-pull is answered again;
     * neither is applied twice */
    int dup = req->op != PS__OP__OP_PULL && psd_dedup_seen(s, req);
    if (dup && req->op == PS__OP__OP_PUSH) {
        reply_duplicate(s, req, rep);
        return PSD_ANSWER_NOW;
    }
    int stale = 0;
    struct psd_cons_later later = {0};
    if (req->op != PS__OP__OP_PULL && !dup) {
        const float *g = push_values(s, m, shm_in);
        if (g != NULL && refuse_nonfinite(s, req, t, g, (size_t)req->count, NULL, 1, rep))
            return PSD_ANSWER_NOW;
        char err[PS_ERROR_TEXT_MAX];
        const struct psd_cons_push push = {.worker = req->worker_id,
                                           .clock = req->clock,
                                           .offset = req->offset,
                                           .count = req->count,
                                           .g = g,
                                           .continues = req->continues};
        struct psd_cons_later *lp = req->op == PS__OP__OP_PUSH && ack_first(s, req) ? &later : NULL;
        int rc = g == NULL ? PS_ENOMEM
                           : psd_cons_push(&s->conf.cons, t, &push, &applied, lp, err, sizeof err);
        if (rc < 0) {
            psd_reply_error(s, req, rc, g == NULL ? "out of memory" : err, rep);
            return PSD_ANSWER_NOW;
        }
        t->pushes++;
        stale = rc == PSD_CONS_STALE;
        if (stale)
            psd_live_stale(s, req, t);
        else
            psd_dedup_applied(s, req);
    }
    if (later.t != NULL)
        answer_first(s, route, req, t, &later, rep);
    log_push(s, t, prune_updates, lost);
    if (applied)
        psd_release_waits(s); /* before this reply's header: both are packed in one buffer */
    if (later.t != NULL)
        return PSD_ANSWER_LATER;
    if (req->op == PS__OP__OP_PUSH) {
        push_reply(s, req, t, stale, rep);
        return PSD_ANSWER_NOW;
    }
    /* push-pull asks for the weights after its own clock's update */
    uint64_t clock = req->op == PS__OP__OP_PUSH_PULL ? req->clock + 1 : req->clock;
    if (!psd_cons_ready(&s->conf.cons, t, clock, req->offset, req->count))
        return psd_defer(s, route, req, clock, rep);
    psd_answer_pull(s, req, t, clock, req->offset, req->count, dup, stale, shm_out, rep);
    return PSD_ANSWER_NOW;
}

/* OP_SET: a dense range's values written as they are, before the table's
 * first optimizer step (a model's own initial weights, psc_set). With the
 * spec's await_set, pulls wait until the writes from the shard's start
 * have reached its end; a piece written again (a resend) is taken, one
 * that leaves a gap is refused as not yet (PS_EAGAIN: a client that
 * resends sends it again after the pieces before it). */
void psd_op_set(struct psd *s, const struct ps_wire_msg *m, struct psd_reply *rep)
{
    const Ps__Header *req = m->hdr;
    struct psd_table *t = check_range(s, req, rep);
    if (t == NULL)
        return;
    if (t->sparse) {
        psd_reply_errorf(s, req, PS_ENOTSUP, rep,
                         "set: table '%s' is sparse; set takes dense tables", t->name);
        return;
    }
    if (t->steps > 0) {
        psd_reply_errorf(s, req, PS_ESTATE, rep,
                         "set: table '%s' has taken %llu optimizer steps; its weights are the "
                         "servers' now",
                         t->name, (unsigned long long)t->steps);
        return;
    }
    if (t->await_set && req->offset > t->set_next) { /* "not yet", as a bsp chunk ahead */
        psd_reply_errorf(s, req, PS_EAGAIN, rep,
                         "set: table '%s' has its values set up to %llu; [%llu, %llu) would leave "
                         "a gap",
                         t->name, (unsigned long long)t->set_next, (unsigned long long)req->offset,
                         (unsigned long long)(req->offset + req->count));
        return;
    }
    const float *v = values_f32(s, m);
    if (v == NULL) {
        psd_reply_error(s, req, PS_ENOMEM, "set: out of memory", rep);
        return;
    }
    if (refuse_nonfinite(s, req, t, v, (size_t)req->count, NULL, 1, rep))
        return;
    psd_table_own(t, req->offset, req->offset + req->count);
    psd_table_wrote(t, req->offset, req->offset + req->count);
    memcpy(t->w + (req->offset - t->lo), v, (size_t)req->count * sizeof(float));
    psd_count_change(s);
    int became_set = 0;
    if (req->offset + req->count > t->set_next) {
        became_set = t->await_set && t->set_next < t->hi && req->offset + req->count == t->hi;
        t->set_next = req->offset + req->count;
    }
    if (became_set)
        psd_release_waits(s); /* before this reply's header: both are packed in one buffer */
    Ps__Header h;
    psd_reply_init(&h, req);
    psd_reply_header(s, &h, rep);
}
