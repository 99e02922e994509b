/* Sending: a request's header and frames to a shard, held batches
 * (psc_cork), the shared region, and sending again what went unanswered. */
#include "client_impl.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_half.h"
#include "ps_header.h"
#include "ps_shard.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The fields every request of a ticket to one shard shares. */
static void request_header(const struct psc_client *c, Ps__Header *h, Ps__Op op, uint64_t id,
                           const struct table_h *t, uint32_t shard, uint64_t clock)
{
    ps_wire_header_init(h, op);
    h->request_id = id;
    h->worker_id = c->worker_id;
    h->table_id = t->ids[shard];
    h->clock = clock;
    h->dtype = c->dtype;
}

/* Queues one frame after the header: zero-copy when large (the slot keeps
 * the buffer busy until zmq lets go) and the context is the client's own
 * (a shared one outlives psc_destroy, and could still hold the frame),
 * copied otherwise. Copied too where shards have replicas: a connection
 * the client leaves for another replica may keep a frame that was still
 * queued for it until the socket closes (ZeroMQ does not always free a
 * disconnected endpoint's queue), and the caller's buffer would stay busy
 * with it. */
static int send_payload(struct psc_client *c, void *sock, const void *buf, size_t len, int more,
                        struct slot *sl)
{
    zmq_msg_t m;
    if (len >= PS_ZEROCOPY_BYTES_MIN && c->own_ctx && c->reps == NULL) {
        atomic_fetch_add(&sl->zc_refs, 1u);
        zmq_msg_init_data(&m, (void *)buf, len, psc__zc_release, &sl->zc_refs);
    } else {
        zmq_msg_init_size(&m, len);
        memcpy(zmq_msg_data(&m), buf, len);
    }
    if (zmq_msg_send(&m, sock, (more ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        return PS_EZMQ;
    }
    c->bytes_sent += len;
    return 0;
}

static void sent_to(struct slot *sl, uint32_t shard)
{
    sl->pending++;
    sl->replied[shard / 64] &= ~(UINT64_C(1) << (shard % 64));
    sl->expected[shard / 64] |= UINT64_C(1) << (shard % 64);
}

/* Sends what shard s holds (psc_cork): one request as it is, several as
 * an OP_BATCH. When it cannot go, each request in it fails. */
static void flush_shard(struct psc_client *c, uint32_t s)
{
    struct batch_q *q = &c->batches[s];
    if (q->n == 0)
        return;
    void *sock = c->socks[s];
    int rc;
    size_t bytes = q->len;
    if (q->n == 1) { /* the record's header alone, after its length */
        bytes = q->len - sizeof(uint32_t);
        rc = zmq_send(sock, q->recs + sizeof(uint32_t), bytes, ZMQ_DONTWAIT);
    } else {
        Ps__Header e;
        uint8_t env[PS_HEADER_FIELDS_BYTES_MAX]; /* no strings: the fast path */
        ps_wire_header_init(&e, PS__OP__OP_BATCH);
        e.worker_id = c->worker_id;
        e.count = q->n;
        int64_t elen = ps_wire_header_pack(&e, env, sizeof env);
        /* after the first part is queued the rest of the message is too */
        rc = elen < 0 ? -1 : zmq_send(sock, env, (size_t)elen, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        rc = rc < 0 ? rc : zmq_send(sock, q->recs, q->len, ZMQ_DONTWAIT);
        bytes += elen > 0 ? (size_t)elen : 0;
        c->batches_sent += rc >= 0;
    }
    int e = errno;
    for (uint32_t i = 0; i < q->n && rc < 0; i++) {
        struct slot *sl = psc__slot_lookup(c, q->ids[i]);
        if (sl == NULL || sl->pending == 0)
            continue;
        sl->pending--;
        sl->replied[s / 64] |= UINT64_C(1) << (s % 64);
        psc__slot_fail(sl, PS_EAGAIN, "shard %u (%s): cannot send: %s", s, c->endpoints[s],
                       zmq_strerror(e));
    }
    if (rc >= 0) {
        c->bytes_sent += bytes;
        c->last_send_ms[s] = ps_mono_ms();
    }
    c->held -= q->n;
    q->n = 0;
    q->len = 0;
    q->named = 0;
}

void psc__flush_all(struct psc_client *c)
{
    for (uint32_t s = 0; c->held > 0 && s < c->nshards; s++)
        flush_shard(c, s);
}

/* Holds h (packed in c->hdr_buf, len bytes) for shard s's next batch:
 * it counts as sent. Goes out at once when the batch is full or moves a
 * chunk's worth of values. */
static int hold(struct psc_client *c, uint32_t s, const Ps__Header *h, size_t len, struct slot *sl)
{
    struct batch_q *q = &c->batches[s];
    if (q->n == PS_BATCH_MAX ||
        ps_wire_batch_add(q->recs, sizeof q->recs, &q->len, c->hdr_buf, len) != 0) {
        flush_shard(c, s);
        if (ps_wire_batch_add(q->recs, sizeof q->recs, &q->len, c->hdr_buf, len) != 0)
            return 0; /* cannot be held: sent alone */
    }
    q->ids[q->n++] = sl->seq;
    c->held++;
    q->named += h->count * (c->esize + (h->shm & PS_SHM_KEYS ? sizeof(uint64_t) : 0));
    sent_to(sl, s);
    if (q->named >= PSC_BATCH_FLUSH_BYTES)
        flush_shard(c, s);
    return 1;
}

int psc_cork(struct psc_client *c, int on)
{
    if (on && c->batches == NULL && (c->batches = calloc(c->nshards, sizeof *c->batches)) == NULL)
        return psc__set_error(c, PS_ENOMEM, "cork: no memory for %u batches", c->nshards);
    c->corked = on;
    if (!on)
        psc__flush_all(c);
    return 0;
}

uint64_t psc_batches_sent(const struct psc_client *c)
{
    return c->batches_sent;
}

/* Sends header (+ keys) (+ values) to one shard, or holds a header-only
 * data request for a batch (psc_cork). On failure the slot is failed and
 * nothing is pending for this shard. sl NULL: a header of no ticket's
 * (rebind_region), sent with resend set. */
int psc__send_frames(struct psc_client *c, uint32_t shard, const Ps__Header *h, const void *keys,
                     size_t kbytes, const void *vals, size_t vbytes, struct slot *sl, int resend)
{
    void *sock = c->socks[shard];
    if (sl != NULL && !resend && sl->kind != SUB_SYNC && psc__failing_over(c, shard)) {
        /* it goes when a replica answers as primary (failover.c): queued
         * now for a replica that may be left behind, it could stay in
         * ZeroMQ's queue of that connection, and its buffers with it */
        sent_to(sl, shard);
        return 0;
    }
    int64_t len = ps_wire_header_pack(h, c->hdr_buf, sizeof c->hdr_buf);
    if (len > 0 && c->corked && !resend && keys == NULL && vals == NULL &&
        ps_wire_op_moves_data(h->op) && hold(c, shard, h, (size_t)len, sl))
        return 0;
    if (c->held > 0)
        flush_shard(c, shard); /* whatever this is, it goes after what is held */
    if (len < 0) {
        psc__slot_fail(sl, PS_ELIMIT, "request header too large");
        return PS_ELIMIT;
    }
    if (zmq_send(sock, c->hdr_buf, (size_t)len, (keys || vals ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) <
        0) {
        int e = errno;
        psc__slot_fail(sl, PS_EAGAIN, "shard %u (%s): cannot send: %s", shard, c->endpoints[shard],
                       zmq_strerror(e));
        return PS_EAGAIN;
    }
    /* After the first part is queued the rest of the message is too. */
    if ((keys != NULL && send_payload(c, sock, keys, kbytes, vals != NULL, sl) != 0) ||
        (vals != NULL && send_payload(c, sock, vals, vbytes, 0, sl) != 0)) {
        psc__slot_fail(sl, PS_EZMQ, "shard %u: payload frame not sent: %s", shard,
                       zmq_strerror(errno));
        return PS_EZMQ;
    }
    if (sl != NULL && sl->kind == SUB_SYNC && !resend && c->reps != NULL && keys == NULL &&
        vals == NULL && (sl->sync_hdr != NULL || (sl->sync_hdr = malloc(sizeof c->hdr_buf)))) {
        memcpy(sl->sync_hdr, c->hdr_buf, (size_t)len); /* for another replica (failover.c) */
        sl->sync_len = (size_t)len;
    }
    c->bytes_sent += (uint64_t)len;
    c->last_send_ms[shard] = ps_mono_ms();
    if (!resend)
        sent_to(sl, shard);
    return 0;
}

/* Ends issuing a ticket: when nothing went out and the slot failed, the
 * error is returned and the slot released; otherwise the ticket is handed
 * over (a partial send fails at wait, after the replies that did go out). */
static int issued(struct psc_client *c, struct slot *sl, uint64_t id, uint64_t *ticket)
{
    if (sl->pending == 0 && sl->status != 0) {
        int rc = sl->status;
        psc__set_error(c, rc, "%s", sl->error);
        psc__slot_release(c, sl);
        return rc;
    }
    *ticket = id;
    return 0;
}

/* The values as they go on the wire: the caller's f32 as they are, or a
 * 16-bit copy in the slot's buffer. NULL when that cannot be allocated. */
const unsigned char *psc__wire_values(struct psc_client *c, struct slot *sl, const float *v,
                                      size_t n)
{
    if (v == NULL || c->dtype == PS__DTYPE__DTYPE_F32)
        return (const unsigned char *)v;
    size_t need = n * c->esize;
    if (need > sl->conv_cap) {
        void *p = realloc(sl->conv, need);
        if (p == NULL)
            return NULL;
        sl->conv = p;
        sl->conv_cap = need;
    }
    ps_f32_to_half_n(c->dtype, v, sl->conv, n);
    return sl->conv;
}

/* A request's values (PS_SHM_IN) or keys (PS_SHM_KEYS) at p: when they
 * lie in the region shard s took, h names them there and NULL is
 * returned (nothing to send in a frame); else p. */
static const void *via_region(struct psc_client *c, uint32_t s, Ps__Header *h, uint32_t bit,
                              const void *p, size_t bytes)
{
    if (bit == PS_SHM_KEYS ? !psc__region_has(c, s, p, bytes, sizeof(uint64_t))
                           : !psc__shm_in_region(c, s, p, bytes))
        return p;
    uint64_t off = (uint64_t)((const unsigned char *)p - c->shm.base);
    h->shm |= bit;
    *(bit == PS_SHM_KEYS ? &h->shm_keys : &h->shm_in) = off;
    c->shm_sent += bytes;
    c->bytes_sent += bytes;
    return NULL;
}

/* Whether shard s's last send of the slot named the region (a shard that
 * lost it refuses, and the request goes again in frames). */
static void mark_via_shm(struct slot *sl, uint32_t s, uint32_t shm)
{
    uint64_t bit = UINT64_C(1) << (s % 64);
    sl->via_shm[s / 64] = shm ? sl->via_shm[s / 64] | bit : sl->via_shm[s / 64] & ~bit;
}

/* Shard s's values from element first on (of total), in the dtype that
 * shard takes (psc__shard_dtype), which h and the slot record: the
 * caller's f32, or the 16-bit copy of the whole request, made when a
 * shard first needs it. NULL when the request has no values, or the copy
 * cannot be allocated (then the slot has failed). */
static const unsigned char *part_values(struct psc_client *c, struct slot *sl, uint32_t s,
                                        size_t first, size_t total, Ps__Header *h, size_t *esize)
{
    int f32 = psc__shard_dtype(c, s) == PS__DTYPE__DTYPE_F32;
    uint64_t bit = UINT64_C(1) << (s % 64);
    sl->f32_to[s / 64] = f32 ? sl->f32_to[s / 64] | bit : sl->f32_to[s / 64] & ~bit;
    h->dtype = f32 ? PS__DTYPE__DTYPE_F32 : c->dtype;
    *esize = f32 ? sizeof(float) : c->esize;
    if (sl->src32 == NULL)
        return NULL;
    if (f32)
        return (const unsigned char *)(sl->src32 + first);
    if (sl->src == NULL && (sl->src = psc__wire_values(c, sl, sl->src32, total)) == NULL)
        psc__slot_fail(sl, PS_ENOMEM, "%s: no memory to convert %zu values", ps_op_name(sl->op),
                       total);
    return sl->src ? sl->src + first * c->esize : NULL;
}

/* Shard s's part of a dense range: its slice, the values through the
 * region where they lie in it, and where the shard writes a pull's
 * values when the caller's buffer is in the region. */
static int send_range_part(struct psc_client *c, struct slot *sl, const struct table_h *t,
                           uint32_t s, Ps__Header *h, int resend)
{
    (void)t;
    uint64_t a, b;
    if (!psc__range_part(c, sl, s, &a, &b))
        return PSC_SUB_NONE;
    h->offset = a;
    h->count = b - a;
    h->continues = sl->continues;
    int reads = sl->op == PS__OP__OP_PULL || sl->op == PS__OP__OP_PUSH_PULL;
    h->nonzero_only = c->nonzero_pulls && reads && !sl->view;
    size_t es;
    const void *vals = part_values(c, sl, s, (size_t)(a - sl->offset), (size_t)sl->count, h, &es);
    if (sl->src32 != NULL && vals == NULL)
        return PS_ENOMEM;
    size_t vbytes = (b - a) * es;
    if (sl->op != PS__OP__OP_SET) /* set goes in frames */
        vals = via_region(c, s, h, PS_SHM_IN, vals, vbytes);
    if (psc__shm_out_at(c, sl, s, a, b, &h->shm_out)) {
        h->shm |= PS_SHM_OUT; /* the shard writes the values there; none need masking */
        h->nonzero_only = 0;
    }
    const struct mirror_seg *seg = sl->mirror ? psc__mirror_seg(sl->mirror, a, b) : NULL;
    if (seg != NULL && !(h->shm & PS_SHM_OUT)) { /* through the region, a whole copy is as cheap */
        h->changed = 1;
        h->since = seg->version;
        h->generation = seg->generation;
    }
    mark_via_shm(sl, s, h->shm);
    return psc__send_frames(c, s, h, NULL, 0, vals, vals ? vbytes : 0, sl, resend);
}

/* Shard s's rows of a sparse table: its group of the keys (rows_group).
 * When the group is the whole request (one shard, or every key on this
 * one) and the caller's buffers lie in the region this shard took, the
 * keys, a push's f32 values and a pull's reply go through the region. */
static int send_rows_part(struct psc_client *c, struct slot *sl, const struct table_h *t,
                          uint32_t s, Ps__Header *h, int resend)
{
    uint32_t a = sl->grp[s], b = sl->grp[s + 1];
    if (a == b)
        return PSC_SUB_NONE;
    size_t d = t->dim;
    h->layout = PS__LAYOUT__LAYOUT_KEYS;
    h->count = b - a;
    h->dim = t->dim;
    const void *k = psc__rows_keys(c, sl) + a,
               *v = sl->src ? sl->src + (size_t)a * d * c->esize : NULL;
    size_t kbytes = (size_t)(b - a) * 8, vbytes = (size_t)(b - a) * d * c->esize;
    if (a == 0 && b == sl->nkeys) {
        if (via_region(c, s, h, PS_SHM_KEYS, sl->keys, kbytes) == NULL)
            k = NULL;
        if (c->dtype == PS__DTYPE__DTYPE_F32) {
            v = v ? via_region(c, s, h, PS_SHM_IN, v, vbytes) : NULL;
            if (sl->op != PS__OP__OP_PUSH &&
                psc__shm_out_at(c, sl, s, 0, h->count * d, &h->shm_out))
                h->shm |= PS_SHM_OUT; /* the shard writes the rows there */
        }
    }
    mark_via_shm(sl, s, h->shm);
    return psc__send_frames(c, s, h, k, k ? kbytes : 0, v, v ? vbytes : 0, sl, resend);
}

/* Shard s's part of a keyed push into a dense table: the keys that fall
 * in its range; a single zero entry when none do, so that every shard
 * gets a push each clock (bsp rounds). */
static int send_keys_part(struct psc_client *c, struct slot *sl, const struct table_h *t,
                          uint32_t s, Ps__Header *h, int resend)
{
    uint64_t lo, hi;
    ps_shard_range(t->size, c->nshards, s, &lo, &hi);
    if (lo == hi)
        return PSC_SUB_NONE; /* this shard holds nothing of the table */
    size_t i = ps_keys_below(sl->keys, sl->nkeys, lo), j = ps_keys_below(sl->keys, sl->nkeys, hi);
    /* keys are sent as they lie in memory: uint64 little-endian hosts only */
    uint64_t pad_key = lo;
    unsigned char pad_val[4] = {0};
    h->layout = PS__LAYOUT__LAYOUT_KEYS;
    h->count = j > i ? j - i : 1;
    const void *k = j > i ? (const void *)(sl->keys + i) : &pad_key;
    size_t es;
    const void *v = part_values(c, sl, s, i, sl->nkeys, h, &es);
    if (v == NULL)
        return PS_ENOMEM;
    if (j == i)
        v = pad_val; /* zero in f32 and in 16 bits */
    size_t kbytes = h->count * sizeof(uint64_t), vbytes = h->count * es;
    k = via_region(c, s, h, PS_SHM_KEYS, k, kbytes); /* psd copies them out */
    v = via_region(c, s, h, PS_SHM_IN, v, vbytes);
    mark_via_shm(sl, s, h->shm);
    return psc__send_frames(c, s, h, k, k ? kbytes : 0, v, v ? vbytes : 0, sl, resend);
}

/* How each kind of slot puts shard s's part on the wire. Synchronous
 * requests go whole (psc__call_sync), and a request in pieces sends each
 * piece as a range slot of its own: neither has a part to send. */
typedef int (*send_part_fn)(struct psc_client *c, struct slot *sl, const struct table_h *t,
                            uint32_t s, Ps__Header *h, int resend);
static const send_part_fn send_part[] = {
    [SUB_SYNC] = NULL,           [SUB_RANGE] = send_range_part, [SUB_KEYS] = send_keys_part,
    [SUB_ROWS] = send_rows_part, [SUB_PIECES] = NULL,
};

int psc__send_sub(struct psc_client *c, struct slot *sl, uint32_t s, int resend)
{
    send_part_fn send = send_part[sl->kind];
    if (send == NULL)
        return PSC_SUB_NONE;
    const struct table_h *t = c->tables[sl->table];
    Ps__Header h;
    request_header(c, &h, sl->op, sl->seq, t, s, sl->clock);
    return send(c, sl, t, s, &h, resend);
}

int psc__send_all(struct psc_client *c, struct slot *sl, uint64_t id, uint64_t *ticket)
{
    for (uint32_t s = 0; s < c->nshards; s++)
        if (psc__send_sub(c, sl, s, 0) < 0)
            break;
    sl->sent_ms = ps_mono_ms();
    return issued(c, sl, id, ticket);
}

/* Re-sends, with the same request id, the sub-requests still unanswered
 * after retry_ms: a server that restarted lost them (one that did apply a
 * push answers the copy as a duplicate without applying it again). */
static void resend_due(struct psc_client *c, struct slot *sl, int64_t now)
{
    /* a request waiting for a slow round is re-sent less and less often
     * (the server merges the copies); 4 x retry_ms at most */
    int64_t after = (int64_t)c->retry_ms << (sl->attempts < 2 ? sl->attempts : 2);
    if (sl->kind == SUB_SYNC || sl->canceled || sl->pending == 0 || now - sl->sent_ms < after)
        return;
    for (uint32_t s = 0; s < c->nshards; s++)
        if ((sl->expected[s / 64] >> (s % 64)) & 1u && !psc__shard_replied(sl, s) &&
            !psc__failing_over(c, s) && psc__send_sub(c, sl, s, 1) == PSC_SUB_SENT)
            c->resends++;
    sl->sent_ms = now;
    sl->attempts++;
}

/* Every outstanding request, not only the one being waited for: waits go
 * in ticket order, and the request a restart lost may be a later ticket
 * that an earlier one (a bsp pull) is waiting on. */
void psc__resend_all_due(struct psc_client *c)
{
    int64_t now = ps_mono_ms();
    if (c->retry_ms <= 0 || now - c->swept_ms < (c->retry_ms + 3) / 4)
        return;
    c->swept_ms = now;
    for (uint32_t i = 0; i < PS_CLIENT_TICKETS_MAX; i++)
        if (c->slots[i].seq != 0)
            resend_due(c, &c->slots[i], now);
}

void psc_heartbeat(struct psc_client *c)
{
    if (c->heartbeat_ms <= 0)
        return;
    int64_t now = ps_mono_ms();
    for (uint32_t s = 0; s < c->nshards; s++) {
        if (now - c->last_send_ms[s] < c->heartbeat_ms)
            continue;
        Ps__Header h;
        ps_wire_header_init(&h, PS__OP__OP_HEARTBEAT);
        h.worker_id = c->worker_id;
        int64_t len = ps_wire_header_pack(&h, c->hdr_buf, sizeof c->hdr_buf);
        /* best effort: a full queue means the shard is not reading, and the
         * next turn tries again */
        if (len > 0 && zmq_send(c->socks[s], c->hdr_buf, (size_t)len, ZMQ_DONTWAIT) >= 0) {
            c->bytes_sent += (uint64_t)len;
            c->last_send_ms[s] = now;
        }
    }
}
