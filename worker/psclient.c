/* libpsclient implementation: DEALER per shard, ticket slots, reply
 * matching by (request id, socket), zero-copy gradient sends. */
#include "psclient.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_half.h"
#include "ps_header.h"
#include "ps_limits.h"
#include "ps_local.h"
#include "ps_shard.h"
#include "ps_shm.h"
#include "ps_wire.h"
#include "ps_zsock.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

/* Request ids are consecutive (a server remembers a window of them per
 * worker, see psd's exactly-once rule); id_map finds an id's slot. */
#define ID_MAP             (4u * PS_CLIENT_TICKETS_MAX)
#define REPLY_PARTS_MAX    (PS_FRAMES_MAX + 1u)
#define CLIENT_ARENA_BYTES (4u * PS_HEADER_BYTES_MAX)

struct table_h {
    char name[PS_TABLE_NAME_MAX + 1];
    uint64_t size;
    int sparse;
    uint32_t dim;
    uint32_t ids[]; /* table id on each shard */
};

enum sub_kind {
    SUB_SYNC = 0,   /* hello, create, stats: never re-sent */
    SUB_RANGE = 1,  /* pull / push / push-pull of a dense range */
    SUB_KEYS = 2,   /* keyed push into a dense table */
    SUB_ROWS = 3,   /* rows of a sparse table */
    SUB_PIECES = 4, /* a dense range sent as pieces: the tickets in kids */
};

struct slot {
    uint64_t seq; /* 0 when free */
    Ps__Op op;
    uint32_t table;
    uint64_t offset, count;
    float *out;
    void *ctx; /* result of a synchronous op */
    uint32_t pending;
    uint64_t replied[PS_SHARDS_MAX / 64];
    int status;
    int remote; /* with status PS_EREMOTE: the shard's own code */
    int canceled;
    atomic_uint zc_refs; /* zero-copy frames zmq still holds */
    void *conv;          /* 16-bit copy of a push's values (grows, reused) */
    size_t conv_cap;
    /* what it takes to send (and re-send) each shard's sub-request */
    int kind; /* enum sub_kind */
    uint64_t clock;
    const unsigned char *src; /* values as they go on the wire, or NULL */
    const uint64_t *keys;     /* SUB_KEYS: the caller's keys */
    size_t nkeys;
    uint64_t expected[PS_SHARDS_MAX / 64]; /* shards sent a sub-request */
    uint64_t via_shm[PS_SHARDS_MAX / 64];  /* ...whose last one named the shared region */
    int64_t sent_ms;
    uint32_t attempts;
    /* row requests: keys grouped by shard, and where each came from */
    int rows;
    uint32_t *order; /* grouped position -> index in the caller's keys */
    uint64_t *skeys; /* keys grouped by shard */
    float *svals;    /* push values grouped like skeys */
    size_t rows_cap; /* entries order/skeys hold; svals holds rows_cap x dim */
    size_t vals_cap;
    uint32_t *grp; /* shard s holds grouped positions [grp[s], grp[s+1]) */
    /* psc_pull_view: each shard's reply message, kept (NULL until the
     * slot's first view; messages are empty when not held) */
    int view;
    int held; /* waited for: values readable until psc_view_release */
    zmq_msg_t *vmsg;
    /* SUB_PIECES: the pieces' tickets, 0 once waited for or canceled */
    uint64_t *kids;
    int continues; /* a push piece after one to the same shard (Header.continues) */
    uint32_t nkids, kids_cap;
    char error[PS_ERROR_TEXT_MAX + 64];
};

/* psc_cork: a shard's header-only data requests held for one message. */
struct batch_q {
    uint32_t n;
    size_t len;     /* bytes of recs used */
    uint64_t named; /* bytes the held requests move through the region (values, keys) */
    uint64_t ids[PS_BATCH_MAX];
    uint8_t recs[PS_BATCH_BYTES_MAX];
};

/* What a stats call fills. */
struct stats_out {
    struct psc_shard_stats *st;
    struct psc_table_stats *list;
    uint32_t cap;
};

struct psc_client {
    uint32_t nshards;
    uint32_t worker_id;
    Ps__DType dtype; /* on the wire */
    size_t piece_bytes;
    int retry_ms;
    int heartbeat_ms;      /* <= 0: never */
    int64_t *last_send_ms; /* per shard */
    uint64_t start_clock;
    uint64_t stale_pushes;
    int outside; /* a stale push reply since the last hello */
    int nonzero_pulls;
    size_t esize;
    void *ctx;
    void **socks;
    char **endpoints; /* in use: as given, or the shard's same-host one */
    /* per shard, from its last hello reply: the same-host endpoint it
     * offers ("" none) and its process instance */
    struct offer {
        char local[PS_ENDPOINT_MAX];
        uint64_t instance;
    } * offers;
    uint64_t session;
    /* the region shared with shards on this host (fd -1: none), what of
     * it psc_shm_alloc handed out, the token it was handed over with, and
     * per shard whether the shard took it */
    struct ps_shm shm;
    size_t shm_used;
    uint64_t shm_token;
    unsigned char *shm_on;
    /* per shard, the hello that binds the region again after the shard
     * lost it (0: none under way), and when it went */
    struct rebind {
        uint64_t id;
        int64_t sent_ms;
    } * rebind;
    uint64_t shm_sent, shm_received;
    struct pollfd *pfds; /* the sockets' ZMQ_FDs, for waiting on several */
    struct slot slots[PS_CLIENT_TICKETS_MAX];
    uint16_t free_stack[PS_CLIENT_TICKETS_MAX];
    uint16_t id_map[ID_MAP]; /* id % ID_MAP -> slot index + 1; 0: none */
    uint32_t nfree;
    uint64_t next_seq;
    struct table_h *tables[PS_CLIENT_TABLES_MAX];
    uint32_t ntables;
    uint64_t bytes_sent, bytes_received;
    uint64_t bad_replies;
    uint64_t resends; /* sub-requests sent again */
    int64_t swept_ms; /* last look for requests due a re-send */
    struct ps_arena arena;
    unsigned char *arena_buf;
    /* psc_cork: held requests per shard (NULL until first corked) */
    int corked;
    uint32_t held;
    struct batch_q *batches;
    uint64_t batches_sent;
    uint8_t hdr_buf[2048]; /* requests carry at most a table spec */
    char last_error[512];
    int last_remote; /* the shard's code behind the last PS_EREMOTE, else 0 */
};

_Static_assert(PS_CLIENT_TICKETS_MAX < UINT16_MAX && (ID_MAP & (ID_MAP - 1)) == 0,
               "slot index + 1 fits in id_map; ID_MAP is a power of 2");

/* ---- helpers ------------------------------------------------------------ */

static int set_error(struct psc_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int set_error(struct psc_client *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->last_error, sizeof c->last_error, fmt, ap);
    va_end(ap);
    return code;
}

static void slot_fail(struct slot *sl, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void slot_fail(struct slot *sl, int code, const char *fmt, ...)
{
    if (sl == NULL || sl->status != 0)
        return; /* no ticket's (send_frames), or keep the first error */
    sl->status = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sl->error, sizeof sl->error, fmt, ap);
    va_end(ap);
}

static void zc_release(void *data, void *hint)
{
    (void)data;
    atomic_fetch_sub((atomic_uint *)hint, 1u);
}

static struct slot *slot_alloc(struct psc_client *c, Ps__Op op, uint64_t *id)
{
    if (c->nfree == 0)
        return NULL;
    uint16_t idx = c->free_stack[--c->nfree];
    struct slot *sl = &c->slots[idx];
    /* the next id whose map entry is free: at most PS_CLIENT_TICKETS_MAX
     * are taken, so this skips few ids, and rarely */
    uint64_t seq;
    do
        seq = ++c->next_seq;
    while (c->id_map[seq & (ID_MAP - 1)] != 0);
    c->id_map[seq & (ID_MAP - 1)] = (uint16_t)(idx + 1);
    memset(sl->replied, 0, sizeof sl->replied);
    sl->seq = seq;
    sl->op = op;
    sl->out = NULL;
    sl->ctx = NULL;
    sl->pending = 0;
    sl->status = 0;
    sl->remote = 0;
    sl->canceled = 0;
    sl->rows = 0;
    sl->view = 0;
    sl->kind = SUB_SYNC;
    sl->nkids = 0;
    sl->continues = 0;
    sl->src = NULL;
    sl->keys = NULL;
    sl->attempts = 0;
    memset(sl->expected, 0, sizeof sl->expected);
    memset(sl->via_shm, 0, sizeof sl->via_shm);
    sl->error[0] = '\0';
    *id = seq;
    return sl;
}

/* Lets go of a view's messages (they stay initialised, empty). */
static void view_drop(struct psc_client *c, struct slot *sl)
{
    for (uint32_t s = 0; sl->vmsg != NULL && s < c->nshards; s++) {
        zmq_msg_close(&sl->vmsg[s]);
        zmq_msg_init(&sl->vmsg[s]);
    }
    sl->held = 0;
}

static void slot_release(struct psc_client *c, struct slot *sl)
{
    view_drop(c, sl);
    c->id_map[sl->seq & (ID_MAP - 1)] = 0;
    sl->seq = 0;
    c->free_stack[c->nfree++] = (uint16_t)(sl - c->slots);
}

static struct slot *slot_lookup(struct psc_client *c, uint64_t id)
{
    uint16_t e = c->id_map[id & (ID_MAP - 1)];
    if (e == 0)
        return NULL;
    struct slot *sl = &c->slots[e - 1];
    return sl->seq == id ? sl : NULL;
}

/* ---- sending ------------------------------------------------------------- */

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
 * the buffer busy until zmq lets go), copied when small. */
static int send_payload(struct psc_client *c, void *sock, const void *buf, size_t len, int more,
                        struct slot *sl)
{
    zmq_msg_t m;
    if (len >= PS_ZEROCOPY_BYTES_MIN) {
        atomic_fetch_add(&sl->zc_refs, 1u);
        zmq_msg_init_data(&m, (void *)buf, len, zc_release, &sl->zc_refs);
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
        struct slot *sl = slot_lookup(c, q->ids[i]);
        if (sl == NULL || sl->pending == 0)
            continue;
        sl->pending--;
        sl->replied[s / 64] |= UINT64_C(1) << (s % 64);
        slot_fail(sl, PS_EAGAIN, "shard %u (%s): cannot send: %s", s, c->endpoints[s],
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

static void flush_all(struct psc_client *c)
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
        return set_error(c, PS_ENOMEM, "cork: no memory for %u batches", c->nshards);
    c->corked = on;
    if (!on)
        flush_all(c);
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
static int send_frames(struct psc_client *c, uint32_t shard, const Ps__Header *h, const void *keys,
                       size_t kbytes, const void *vals, size_t vbytes, struct slot *sl, int resend)
{
    void *sock = c->socks[shard];
    int64_t len = ps_wire_header_pack(h, c->hdr_buf, sizeof c->hdr_buf);
    if (len > 0 && c->corked && !resend && keys == NULL && vals == NULL &&
        ps_wire_op_moves_data(h->op) && hold(c, shard, h, (size_t)len, sl))
        return 0;
    if (c->held > 0)
        flush_shard(c, shard); /* whatever this is, it goes after what is held */
    if (len < 0) {
        slot_fail(sl, PS_ELIMIT, "request header too large");
        return PS_ELIMIT;
    }
    if (zmq_send(sock, c->hdr_buf, (size_t)len, (keys || vals ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) <
        0) {
        int e = errno;
        slot_fail(sl, PS_EAGAIN, "shard %u (%s): cannot send: %s", shard, c->endpoints[shard],
                  zmq_strerror(e));
        return PS_EAGAIN;
    }
    /* After the first part is queued the rest of the message is too. */
    if ((keys != NULL && send_payload(c, sock, keys, kbytes, vals != NULL, sl) != 0) ||
        (vals != NULL && send_payload(c, sock, vals, vbytes, 0, sl) != 0)) {
        slot_fail(sl, PS_EZMQ, "shard %u: payload frame not sent: %s", shard, zmq_strerror(errno));
        return PS_EZMQ;
    }
    c->bytes_sent += (uint64_t)len;
    c->last_send_ms[shard] = ps_mono_ms();
    if (!resend)
        sent_to(sl, shard);
    return 0;
}

/* ---- receiving ----------------------------------------------------------- */

static int shard_replied(const struct slot *sl, uint32_t shard)
{
    return (sl->replied[shard / 64] >> (shard % 64)) & 1u;
}

/* out[i] = the next value for each set bit of the mask, 0 elsewhere. The
 * decoder checked that the values frame holds exactly the set bits. */
static void expand_masked(const struct psc_client *c, const struct ps_wire_msg *m, float *out,
                          size_t n)
{
    const unsigned char *v = m->vals;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if ((m->mask[i / 8] >> (i % 8)) & 1u) {
            if (c->dtype == PS__DTYPE__DTYPE_F32)
                memcpy(&out[i], v + 4 * k, 4);
            else
                ps_half_to_f32_n(c->dtype, v + 2 * k, &out[i], 1);
            k++;
        } else {
            out[i] = 0.0f;
        }
    }
}

/* Scatters the rows of shard s's reply back to the caller's order. */
static void handle_rows_reply(struct psc_client *c, uint32_t shard, struct slot *sl,
                              const struct ps_wire_msg *m)
{
    const Ps__Header *h = m->hdr;
    const struct table_h *t = c->tables[sl->table];
    uint32_t a = sl->grp[shard], b = sl->grp[shard + 1];
    if (h->layout != PS__LAYOUT__LAYOUT_KEYS || h->count != b - a || h->dim != t->dim ||
        h->dtype != c->dtype || m->vals_bytes != (size_t)(b - a) * t->dim * c->esize) {
        slot_fail(sl, PS_EPROTO, "shard %u answered %llu rows of dim %u, expected %u of dim %u",
                  shard, (unsigned long long)h->count, h->dim, b - a, t->dim);
        return;
    }
    if (sl->canceled)
        return;
    const unsigned char *v = m->vals;
    size_t d = t->dim, rowb = d * c->esize;
    if (c->nshards == 1) { /* in the caller's order already (rows_group) */
        if (c->dtype == PS__DTYPE__DTYPE_F32)
            memcpy(sl->out, v, (size_t)(b - a) * rowb);
        else
            ps_half_to_f32_n(c->dtype, v, sl->out, (size_t)(b - a) * d);
        return;
    }
    for (uint32_t i = a; i < b; i++) {
        float *dst = sl->out + (size_t)sl->order[i] * d;
        if (c->dtype == PS__DTYPE__DTYPE_F32)
            memcpy(dst, v + (i - a) * rowb, rowb);
        else
            ps_half_to_f32_n(c->dtype, v + (i - a) * rowb, dst, d);
    }
}

/* The part [*a, *b) of a range ticket's elements that shard s holds;
 * 0 when it holds none of them. */
static int range_part(const struct psc_client *c, const struct slot *sl, uint32_t s, uint64_t *a,
                      uint64_t *b)
{
    uint64_t lo, hi;
    ps_shard_range(c->tables[sl->table]->size, c->nshards, s, &lo, &hi);
    *a = sl->offset > lo ? sl->offset : lo;
    *b = sl->offset + sl->count < hi ? sl->offset + sl->count : hi;
    return *a < *b;
}

/* Whether [p, p+bytes) lies in the shared region. */
static int in_region(const struct psc_client *c, const void *p, size_t bytes)
{
    const unsigned char *q = p;
    return q != NULL && c->shm.base != NULL && q >= c->shm.base && bytes <= c->shm.size &&
           q - c->shm.base <= (ptrdiff_t)(c->shm.size - bytes);
}

/* Whether [p, p+bytes) lies in the region, a multiple of align bytes in,
 * and shard s took the region. */
static int region_has(const struct psc_client *c, uint32_t s, const void *p, size_t bytes,
                      size_t align)
{
    return c->shm_on != NULL && c->shm_on[s] && in_region(c, p, bytes) &&
           (size_t)((const unsigned char *)p - c->shm.base) % align == 0;
}

/* Whether values [p, p+bytes) may move through the region (f32 only). */
static int shm_in_region(const struct psc_client *c, uint32_t s, const void *p, size_t bytes)
{
    return c->dtype == PS__DTYPE__DTYPE_F32 && region_has(c, s, p, bytes, sizeof(float));
}

/* Where shard s's part [a, b) of a pull's output lies in the region (*off
 * bytes in), when it does and the shard took the region: the shard writes
 * those values there itself. */
static int shm_out_at(const struct psc_client *c, const struct slot *sl, uint32_t s, uint64_t a,
                      uint64_t b, uint64_t *off)
{
    float *out = sl->out != NULL && !sl->view ? sl->out + (a - sl->offset) : NULL;
    if (!shm_in_region(c, s, out, (b - a) * sizeof(float)))
        return 0;
    *off = (uint64_t)((unsigned char *)out - c->shm.base);
    return 1;
}

/* A view's reply: its values message is kept in the slot, or a copy of
 * it where the values are not float-aligned in the message. */
static void view_keep(struct slot *sl, uint32_t shard, const struct ps_wire_msg *m,
                      zmq_msg_t *vals_msg)
{
    zmq_msg_t *dst = &sl->vmsg[shard];
    if (vals_msg != NULL && zmq_msg_data(vals_msg) == m->vals &&
        (uintptr_t)m->vals % _Alignof(float) == 0) {
        zmq_msg_move(dst, vals_msg);
        return;
    }
    zmq_msg_close(dst);
    if (zmq_msg_init_size(dst, m->vals_bytes) != 0) {
        zmq_msg_init(dst);
        slot_fail(sl, PS_ENOMEM, "no memory for %zu bytes of shard %u's values", m->vals_bytes,
                  shard);
        return;
    }
    memcpy(zmq_msg_data(dst), m->vals, m->vals_bytes);
}

static void handle_data_reply(struct psc_client *c, uint32_t shard, struct slot *sl,
                              const struct ps_wire_msg *m, zmq_msg_t *vals_msg)
{
    const Ps__Header *h = m->hdr;
    c->stale_pushes += h->stale;
    c->outside |= h->stale;
    if (sl->op == PS__OP__OP_PUSH)
        return;
    if (sl->rows) {
        handle_rows_reply(c, shard, sl, m);
        return;
    }
    uint64_t a, b;
    int asked = range_part(c, sl, shard, &a, &b);
    int masked = m->mask != NULL;
    uint64_t off;
    if (asked && h->shm == PS_SHM_OUT && h->offset == a && h->count == b - a &&
        shm_out_at(c, sl, shard, a, b, &off) && h->shm_out == off) {
        /* the shard wrote the values where they belong */
        c->shm_received += (b - a) * sizeof(float);
        c->bytes_received += (b - a) * sizeof(float);
        return;
    }
    if (!asked || h->offset != a || h->count != b - a || h->dtype != c->dtype || h->shm != 0 ||
        (masked && (!c->nonzero_pulls || sl->view)) ||
        (!masked && m->vals_bytes != (b - a) * c->esize)) {
        slot_fail(sl, PS_EPROTO, "shard %u answered [%llu, +%llu), expected [%llu, +%llu)", shard,
                  (unsigned long long)h->offset, (unsigned long long)h->count,
                  (unsigned long long)a, (unsigned long long)(asked ? b - a : 0));
        return;
    }
    if (sl->canceled)
        return;
    if (masked) {
        expand_masked(c, m, sl->out + (a - sl->offset), (size_t)(b - a));
        return;
    }
    if (sl->view) {
        view_keep(sl, shard, m, vals_msg);
        return;
    }
    if (c->dtype == PS__DTYPE__DTYPE_F32)
        memcpy(sl->out + (a - sl->offset), m->vals, m->vals_bytes);
    else
        ps_half_to_f32_n(c->dtype, m->vals, sl->out + (a - sl->offset), (size_t)(b - a));
}

/* What a rows call fills. */
struct rows_out {
    uint64_t offset, max;
    uint32_t dim;
    uint64_t *keys;
    float *vals;
    uint64_t got, total;
};

static void handle_rows_page(uint32_t shard, struct slot *sl, const struct ps_wire_msg *m)
{
    const Ps__Header *h = m->hdr;
    struct rows_out *ro = sl->ctx;
    if (h->offset != ro->offset || h->count > ro->max || h->dim != ro->dim ||
        h->rows < h->offset + h->count) {
        slot_fail(sl, PS_EPROTO,
                  "shard %u answered rows [%llu, +%llu) of dim %u (of %llu), asked for [%llu, "
                  "+%llu) of dim %u",
                  shard, (unsigned long long)h->offset, (unsigned long long)h->count, h->dim,
                  (unsigned long long)h->rows, (unsigned long long)ro->offset,
                  (unsigned long long)ro->max, ro->dim);
        return;
    }
    for (uint64_t i = 0; i < h->count; i++)
        ro->keys[i] = ps_wire_key(m->keys, i);
    memcpy(ro->vals, m->vals, m->vals_bytes);
    ro->got = h->count;
    ro->total = h->rows;
}

static void handle_sync_reply(struct psc_client *c, uint32_t shard, struct slot *sl,
                              const struct ps_wire_msg *m)
{
    const Ps__Header *h = m->hdr;
    if (sl->op == PS__OP__OP_ROWS) {
        handle_rows_page(shard, sl, m);
    } else if (sl->op == PS__OP__OP_HELLO) {
        if (h->shard != shard || h->shards != c->nshards)
            slot_fail(sl, PS_ESTATE,
                      "server %u (%s) says it is shard %u of %u, but was listed as %u of %u: "
                      "check the order of the server list",
                      shard, c->endpoints[shard], h->shard, h->shards, shard, c->nshards);
        if (h->clock > c->start_clock)
            c->start_clock = h->clock;
        /* only a hint: one that is malformed or out of reach leaves tcp */
        snprintf(c->offers[shard].local, sizeof c->offers[shard].local, "%s",
                 h->local_endpoint != NULL && strlen(h->local_endpoint) < PS_ENDPOINT_MAX
                     ? h->local_endpoint
                     : "");
        c->offers[shard].instance = h->instance;
        if (c->shm_on != NULL && h->shm_token != 0)
            c->shm_on[shard] = h->shm_token == c->shm_token;
    } else if (sl->op == PS__OP__OP_CREATE_TABLE) {
        struct table_h *t = sl->ctx;
        uint64_t lo, hi;
        ps_shard_range(t->size, c->nshards, shard, &lo, &hi);
        if (h->offset != lo || h->count != hi - lo)
            slot_fail(sl, PS_ESTATE, "shard %u holds [%llu, %llu) of '%s', expected [%llu, %llu)",
                      shard, (unsigned long long)h->offset,
                      (unsigned long long)(h->offset + h->count), t->name, (unsigned long long)lo,
                      (unsigned long long)hi);
        t->ids[shard] = h->table_id;
    } else if (sl->op == PS__OP__OP_CHECKPOINT) {
        snprintf(sl->ctx, PS_ERROR_TEXT_MAX, "%s", h->detail);
    } else if (sl->op == PS__OP__OP_STATS) {
        const struct stats_out *so = sl->ctx;
        struct psc_shard_stats *st = so->st;
        if (h->stats == NULL) {
            slot_fail(sl, PS_EPROTO, "shard %u: stats reply without stats", shard);
            return;
        }
        st->shard = h->stats->shard;
        st->shards = h->stats->shards;
        st->requests = h->stats->requests;
        st->errors = h->stats->errors;
        st->bytes_in = h->stats->bytes_in;
        st->bytes_out = h->stats->bytes_out;
        st->tables = (uint32_t)h->stats->n_tables;
        st->uptime_s = h->stats->uptime_s;
        snprintf(st->consistency, sizeof st->consistency, "%s", h->stats->consistency);
        st->workers = h->stats->workers;
        st->waiting = h->stats->waiting;
        st->deferred_total = h->stats->deferred_total;
        st->max_staleness = h->stats->max_staleness;
        st->wait_timeouts = h->stats->wait_timeouts;
        st->duplicates_dropped = h->stats->duplicates_dropped;
        st->live_workers = h->stats->live_workers;
        st->nmissing = (uint32_t)h->stats->n_missing_workers;
        for (size_t i = 0; i < h->stats->n_missing_workers && i < 64; i++)
            st->missing[i] = h->stats->missing_workers[i];
        st->workers_dropped = h->stats->workers_dropped;
        st->workers_rejoined = h->stats->workers_rejoined;
        st->stale_pushes = h->stats->stale_pushes;
        st->worker_timeout_ms = h->stats->worker_timeout_ms;
        st->checkpoints_written = h->stats->checkpoints_written;
        st->checkpoint_age_s = h->stats->checkpoint_age_s;
        st->bytes_held = h->stats->bytes_held;
        for (size_t i = 0; i < h->stats->n_tables && i < so->cap; i++) {
            const Ps__TableStats *t = h->stats->tables[i];
            struct psc_table_stats *o = &so->list[i];
            snprintf(o->name, sizeof o->name, "%s", t->name);
            snprintf(o->optimizer, sizeof o->optimizer, "%s", t->optimizer);
            o->id = t->id;
            o->sparse = t->sparse;
            o->dim = t->dim;
            o->size = t->size;
            o->lo = t->lo;
            o->hi = t->hi;
            o->rows = t->rows;
            o->rows_max = t->rows_max;
            o->pushes = t->pushes;
            o->pulls = t->pulls;
            o->updates = t->updates;
            o->clock = t->clock;
            o->rounds_lost = t->rounds_lost;
            o->sparsity = t->sparsity;
        }
        st->nworker_clocks = (uint32_t)h->stats->n_worker_clocks;
        for (size_t i = 0; i < h->stats->n_worker_clocks && i < 64; i++)
            st->worker_clocks[i] = h->stats->worker_clocks[i];
    }
}

static int send_sub(struct psc_client *c, struct slot *sl, uint32_t s, int resend);

enum { REBIND_WAIT_MS = 1000 };

/* Hands the region again to shard s, which refused it (it restarted, or
 * dropped this worker), and sends a hello in this session that binds it
 * to the connection; the hello's reply (rebound) turns it back on. No slot
 * of the caller's: the hello's id is kept in c->rebind. One at a time per
 * shard; anything that fails leaves the shard on frames. */
static void rebind_region(struct psc_client *c, uint32_t s)
{
    struct rebind *rb = &c->rebind[s];
    int64_t now = ps_mono_ms();
    if (rb->id != 0 && now - rb->sent_ms < REBIND_WAIT_MS)
        return;
    rb->id = 0;
    char err[256];
    if (ps_shm_hand(c->endpoints[s], c->shm.fd, c->shm_token, REBIND_WAIT_MS, err, sizeof err) != 0)
        return;
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_HELLO);
    h.request_id = ++c->next_seq; /* an id no slot will have */
    h.worker_id = c->worker_id;
    h.session = c->session;
    h.shm_token = c->shm_token;
    if (send_frames(c, s, &h, NULL, 0, NULL, 0, NULL, 1) == 0) {
        rb->id = h.request_id;
        rb->sent_ms = now;
    }
}

/* Whether h answers shard s's rebind hello; if so, the region is on again
 * when the shard took it. */
static int rebound(struct psc_client *c, uint32_t s, const Ps__Header *h)
{
    if (c->rebind == NULL || c->rebind[s].id == 0 || h->request_id != c->rebind[s].id ||
        h->op != PS__OP__OP_HELLO)
        return 0;
    c->rebind[s].id = 0;
    c->shm_on[s] = h->status == 0 && h->shm_token == c->shm_token;
    return 1;
}

static void handle_reply(struct psc_client *c, uint32_t shard, const struct ps_frame *frames,
                         size_t nframes, zmq_msg_t *last)
{
    struct ps_wire_msg m;
    char err[PS_ERROR_TEXT_MAX];
    int rc = ps_wire_decode(&c->arena, frames, nframes, PS_WIRE_REPLY, PS_MESSAGE_BYTES_MAX, &m,
                            err, sizeof err);
    struct slot *sl = m.hdr ? slot_lookup(c, m.hdr->request_id) : NULL;
    if (sl == NULL && rc == 0 && rebound(c, shard, m.hdr))
        return;
    if (sl == NULL || shard_replied(sl, shard) || sl->pending == 0) {
        c->bad_replies++; /* stale, duplicate or unattributable: dropped */
        return;
    }
    if (rc == 0 && m.hdr->op == sl->op && m.hdr->status == PS_EAGAIN && sl->kind != SUB_SYNC &&
        c->retry_ms > 0) {
        /* "not yet" (a bsp chunk ahead of one a restart lost): still
         * unanswered, sent again after retry_ms */
        sl->sent_ms = ps_mono_ms();
        return;
    }
    if (rc == 0 && m.hdr->op == sl->op && m.hdr->status == PS_ESHM && sl->kind != SUB_SYNC) {
        if (!((sl->via_shm[shard / 64] >> (shard % 64)) & 1u)) {
            /* the refusal of a copy sent before the one in frames (copies
             * queue up while a shard is down): that one will answer */
            c->bad_replies++;
            return;
        }
        /* the shard lost the region (it restarted): frames until it
         * takes the region again */
        c->shm_on[shard] = 0;
        int sent = send_sub(c, sl, shard, 1) == 0;
        rebind_region(c, shard);
        if (sent)
            return;
    }
    sl->replied[shard / 64] |= UINT64_C(1) << (shard % 64);
    sl->pending--;
    if (rc != 0) {
        slot_fail(sl, PS_EPROTO, "shard %u sent a malformed reply: %s", shard, err);
        return;
    }
    const Ps__Header *h = m.hdr;
    if (h->op != sl->op) {
        slot_fail(sl, PS_EPROTO, "shard %u answered %s to a %s request", shard, ps_op_name(h->op),
                  ps_op_name(sl->op));
        return;
    }
    if (h->status != 0) {
        if (sl->status == 0)
            sl->remote = h->status; /* what the shard said, kept with the first error */
        slot_fail(sl, PS_EREMOTE, "shard %u (%s): %s [%s]", shard, c->endpoints[shard], h->error,
                  ps_err_name(h->status));
        return;
    }
    if (ps_wire_op_moves_data(sl->op))
        handle_data_reply(c, shard, sl, &m, last);
    else
        handle_sync_reply(c, shard, sl, &m);
}

/* Reads one message from a shard's socket. 0: handled one; <0: none. */
static int recv_one(struct psc_client *c, uint32_t shard, int flags)
{
    zmq_msg_t parts[REPLY_PARTS_MAX];
    size_t kept = 0, total = 0;
    if (ps_zsock_recv(c->socks[shard], flags, parts, REPLY_PARTS_MAX, &kept, &total,
                      &c->bytes_received) != 0)
        return -1;
    struct ps_frame frames[REPLY_PARTS_MAX];
    for (size_t i = 0; i < kept; i++) {
        frames[i].data = zmq_msg_data(&parts[i]);
        frames[i].size = zmq_msg_size(&parts[i]);
    }
    handle_reply(c, shard, frames, total, kept == total && kept > 0 ? &parts[kept - 1] : NULL);
    for (size_t i = 0; i < kept; i++)
        zmq_msg_close(&parts[i]);
    return 0;
}

/* Receives replies: what is waiting, or else the first to come within
 * wait_ms (-1: no limit). Returns how many it received. Waiting costs what
 * a plain zmq client's costs:
 * - one shard: a blocking receive with ZMQ_RCVTIMEO (setting it costs
 *   about 14 ns), as a raw zmq client does: a poll and an eventfd read a
 *   wake-up, where zmq_poll took five polls and an EAGAIN receive;
 * - several: each socket is read until EAGAIN, which leaves its commands
 *   processed and its ZMQ_FD armed (zmq's rule for polling ZMQ_FD), then
 *   one poll() on those fds. Nothing may touch a socket between its EAGAIN
 *   and the poll: a send can swallow the fd's edge. */
static unsigned await_replies(struct psc_client *c, const struct slot *sl, int wait_ms)
{
    if (c->nshards == 1 && zmq_setsockopt(c->socks[0], ZMQ_RCVTIMEO, &wait_ms, sizeof wait_ms) == 0)
        return recv_one(c, 0, 0) == 0;
    enum { DRAIN_MAX = 4 * PS_DRAIN_BATCH_MAX };
    int armed = 1;
    unsigned got = 0;
    for (uint32_t s = 0; s < c->nshards; s++) {
        unsigned i = 0;
        while (i < DRAIN_MAX && recv_one(c, s, ZMQ_DONTWAIT) == 0)
            i++;
        got += i;
        size_t len = sizeof c->pfds[s].fd;
        if (i == DRAIN_MAX || zmq_getsockopt(c->socks[s], ZMQ_FD, &c->pfds[s].fd, &len) != 0)
            armed = 0; /* more may be waiting, or no fd: come back without sleeping */
        c->pfds[s].events = POLLIN;
    }
    if (armed && sl->pending != 0 && wait_ms != 0)
        poll(c->pfds, c->nshards, wait_ms);
    return got;
}

/* Adds the shards sl was sent to and has no reply from to the mask m. */
static void add_missing(const struct slot *sl, uint64_t *m)
{
    for (uint32_t i = 0; i < PS_SHARDS_MAX / 64; i++)
        m[i] |= sl->expected[i] & ~sl->replied[i];
}

/* The shards of mask m, with their endpoints, into buf. */
static void describe_missing(struct psc_client *c, const uint64_t *m, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t s = 0; s < c->nshards && used + 1 < len; s++) {
        if (!((m[s / 64] >> (s % 64)) & 1u))
            continue;
        int n = snprintf(buf + used, len - used, "%s%u (%s)", used ? ", " : "", s, c->endpoints[s]);
        if (n < 0)
            break;
        used += (size_t)n;
    }
}

/* ---- public: waiting ----------------------------------------------------- */

static void resend_all_due(struct psc_client *c);

static int finish(struct psc_client *c, struct slot *sl)
{
    int rc = sl->status;
    c->last_remote = rc == PS_EREMOTE ? sl->remote : 0;
    if (rc != 0)
        set_error(c, rc, "%s", sl->error);
    if (rc == 0 && sl->view && !sl->canceled) {
        sl->held = 1; /* the caller reads it, then psc_view_release */
        return 0;
    }
    slot_release(c, sl);
    return rc;
}

/* The error of a wait for an op that ran out (the caller's timeout_ms),
 * naming the shards of mask m that did not answer (none: zmq still holds
 * a zero-copy buffer). */
static int timed_out(struct psc_client *c, const uint64_t *m, Ps__Op op, int timeout_ms)
{
    char missing[256];
    describe_missing(c, m, missing, sizeof missing);
    return set_error(c, PS_ETIMEDOUT, "%s: no reply within %d ms from shard %s", ps_op_name(op),
                     timeout_ms, missing[0] ? missing : "(zero-copy buffer still held)");
}

/* psc_wait for a request sent as pieces: each piece in turn, within the
 * one deadline. A failed piece fails the ticket, once every piece is in
 * (until then the library still owns the caller's buffers). */
static int wait_pieces(struct psc_client *c, struct slot *sl, int timeout_ms)
{
    int64_t deadline = ps_mono_ms() + (timeout_ms < 0 ? 0 : timeout_ms);
    for (uint32_t i = 0; i < sl->nkids; i++) {
        if (sl->kids[i] == 0)
            continue;
        int64_t left = deadline - ps_mono_ms();
        int rc = psc_wait(c, sl->kids[i], timeout_ms < 0 ? -1 : left > 0 ? (int)left : 0);
        if (rc == PS_ETIMEDOUT) { /* every shard a piece still waits for */
            uint64_t m[PS_SHARDS_MAX / 64] = {0};
            for (uint32_t j = i; j < sl->nkids; j++) {
                const struct slot *k = sl->kids[j] ? slot_lookup(c, sl->kids[j]) : NULL;
                if (k != NULL)
                    add_missing(k, m);
            }
            return timed_out(c, m, sl->op, timeout_ms);
        }
        sl->kids[i] = 0;
        if (rc != 0)
            slot_fail(sl, rc, "%s", c->last_error);
    }
    return finish(c, sl);
}

int psc_wait(struct psc_client *c, uint64_t ticket, int timeout_ms)
{
    struct slot *sl = slot_lookup(c, ticket);
    if (sl == NULL || sl->canceled || sl->held)
        return set_error(c, PS_EINVAL, "ticket %llu is not outstanding",
                         (unsigned long long)ticket);
    flush_all(c);
    if (sl->kind == SUB_PIECES)
        return wait_pieces(c, sl, timeout_ms);
    int64_t deadline = ps_mono_ms() + (timeout_ms < 0 ? 0 : timeout_ms);
    for (unsigned got = 1;;) {
        int64_t left = timeout_ms < 0 ? -1 : deadline - ps_mono_ms();
        if (sl->pending == 0) {
            if (atomic_load(&sl->zc_refs) == 0)
                return finish(c, sl);
            /* Reply came before zmq's I/O thread let go of our buffer: the
             * release is imminent; wait for it without busy-burning much. */
            if (timeout_ms >= 0 && left <= 0)
                break;
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (got == 0 && timeout_ms >= 0 && left <= 0)
            break; /* time is up only once nothing more is waiting (so 0 takes what came) */
        resend_all_due(c);
        psc_heartbeat(c);
        int wait = timeout_ms < 0 ? -1 : left > 0 ? (int)left : 0; /* left <= timeout_ms */
        if (c->retry_ms > 0 && (wait < 0 || wait > c->retry_ms))
            wait = c->retry_ms;
        if (c->heartbeat_ms > 0 && (wait < 0 || wait > c->heartbeat_ms))
            wait = c->heartbeat_ms;
        got = await_replies(c, sl, wait);
    }
    uint64_t m[PS_SHARDS_MAX / 64] = {0};
    add_missing(sl, m);
    return timed_out(c, m, sl->op, timeout_ms);
}

int psc_cancel(struct psc_client *c, uint64_t ticket)
{
    struct slot *sl = slot_lookup(c, ticket);
    if (sl == NULL)
        return set_error(c, PS_EINVAL, "ticket %llu is not outstanding",
                         (unsigned long long)ticket);
    flush_all(c); /* held requests count as sent: they go, as they would uncorked */
    sl->canceled = 1;
    sl->out = NULL;
    int busy = atomic_load(&sl->zc_refs) != 0;
    for (uint32_t i = 0; i < sl->nkids; i++) {
        if (sl->kids[i] != 0 && psc_cancel(c, sl->kids[i]) != PS_EBUSY)
            sl->kids[i] = 0;
        busy |= sl->kids[i] != 0;
    }
    if (busy)
        return set_error(c, PS_EBUSY, "ticket %llu: zmq still holds its gradient buffer",
                         (unsigned long long)ticket);
    slot_release(c, sl);
    return 0;
}

/* ---- public: range ops --------------------------------------------------- */

/* Ends issuing a ticket: when nothing went out and the slot failed, the
 * error is returned and the slot released; otherwise the ticket is handed
 * over (a partial send fails at wait, after the replies that did go out). */
static int issued(struct psc_client *c, struct slot *sl, uint64_t id, uint64_t *ticket)
{
    if (sl->pending == 0 && sl->status != 0) {
        int rc = sl->status;
        set_error(c, rc, "%s", sl->error);
        slot_release(c, sl);
        return rc;
    }
    *ticket = id;
    return 0;
}

/* The values as they go on the wire: the caller's f32 as they are, or a
 * 16-bit copy in the slot's buffer. NULL when that cannot be allocated. */
static const unsigned char *wire_values(struct psc_client *c, struct slot *sl, const float *v,
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
    if (bit == PS_SHM_KEYS ? !region_has(c, s, p, bytes, sizeof(uint64_t))
                           : !shm_in_region(c, s, p, bytes))
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

/* Sends shard s's part of the ticket's request (again, when resend).
 * Returns 0 sent, 1 nothing of it is on s, <0 an error (slot failed). */
static int send_sub(struct psc_client *c, struct slot *sl, uint32_t s, int resend)
{
    const struct table_h *t = c->tables[sl->table];
    uint64_t id = sl->seq;
    Ps__Header h;
    request_header(c, &h, sl->op, id, t, s, sl->clock);
    if (sl->kind == SUB_RANGE) {
        uint64_t a, b;
        if (!range_part(c, sl, s, &a, &b))
            return 1;
        h.offset = a;
        h.count = b - a;
        h.continues = sl->continues;
        h.nonzero_only = c->nonzero_pulls && sl->op != PS__OP__OP_PUSH && !sl->view;
        size_t vbytes = (b - a) * c->esize;
        const void *vals = sl->src ? sl->src + (a - sl->offset) * c->esize : NULL;
        vals = via_region(c, s, &h, PS_SHM_IN, vals, vbytes);
        if (shm_out_at(c, sl, s, a, b, &h.shm_out)) {
            h.shm |= PS_SHM_OUT; /* the shard writes the values there; none need masking */
            h.nonzero_only = 0;
        }
        mark_via_shm(sl, s, h.shm);
        return send_frames(c, s, &h, NULL, 0, vals, vals ? vbytes : 0, sl, resend);
    }
    h.layout = PS__LAYOUT__LAYOUT_KEYS;
    if (sl->kind == SUB_ROWS) {
        uint32_t a = sl->grp[s], b = sl->grp[s + 1];
        if (a == b)
            return 1;
        size_t d = t->dim;
        h.count = b - a;
        h.dim = t->dim;
        const void *v = sl->src ? sl->src + (size_t)a * d * c->esize : NULL;
        return send_frames(c, s, &h, sl->skeys + a, (size_t)(b - a) * 8, v,
                           v ? (size_t)(b - a) * d * c->esize : 0, sl, resend);
    }
    /* SUB_KEYS: the keys that fall in s's range; a single zero entry when
     * none do, so that every shard gets a push each clock (bsp rounds) */
    uint64_t lo, hi;
    ps_shard_range(t->size, c->nshards, s, &lo, &hi);
    if (lo == hi)
        return 1; /* this shard holds nothing of the table */
    size_t i = ps_keys_below(sl->keys, sl->nkeys, lo), j = ps_keys_below(sl->keys, sl->nkeys, hi);
    /* keys are sent as they lie in memory: uint64 little-endian hosts only */
    uint64_t pad_key = lo;
    unsigned char pad_val[4] = {0};
    h.count = j > i ? j - i : 1;
    const void *k = j > i ? (const void *)(sl->keys + i) : &pad_key;
    const void *v = j > i ? (const void *)(sl->src + i * c->esize) : pad_val;
    size_t kbytes = h.count * sizeof(uint64_t), vbytes = h.count * c->esize;
    k = via_region(c, s, &h, PS_SHM_KEYS, k, kbytes); /* psd copies them out */
    v = via_region(c, s, &h, PS_SHM_IN, v, vbytes);
    mark_via_shm(sl, s, h.shm);
    return send_frames(c, s, &h, k, k ? kbytes : 0, v, v ? vbytes : 0, sl, resend);
}

static int send_all(struct psc_client *c, struct slot *sl, uint64_t id, uint64_t *ticket)
{
    for (uint32_t s = 0; s < c->nshards; s++)
        if (send_sub(c, sl, s, 0) < 0)
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
        if ((sl->expected[s / 64] >> (s % 64)) & 1u && !shard_replied(sl, s) &&
            send_sub(c, sl, s, 1) == 0)
            c->resends++;
    sl->sent_ms = now;
    sl->attempts++;
}

/* Every outstanding request, not only the one being waited for: waits go
 * in ticket order, and the request a restart lost may be a later ticket
 * that an earlier one (a bsp pull) is waiting on. */
static void resend_all_due(struct psc_client *c)
{
    int64_t now = ps_mono_ms();
    if (c->retry_ms <= 0 || now - c->swept_ms < (c->retry_ms + 3) / 4)
        return;
    c->swept_ms = now;
    for (uint32_t i = 0; i < PS_CLIENT_TICKETS_MAX; i++)
        if (c->slots[i].seq != 0)
            resend_due(c, &c->slots[i], now);
}

/* Sends a checked range request as one ticket (continues: see
 * Header.continues). */
static int range_ticket(struct psc_client *c, Ps__Op op, uint32_t table, uint64_t offset,
                        uint64_t count, const float *grad, float *out, int view, int continues,
                        uint64_t clock, uint64_t *ticket);

/* Elements a piece of a count-element request holds: 0 when it goes whole
 * (see PSC_PIECE_BYTES_DEFAULT). */
static uint64_t piece_elems(const struct psc_client *c, uint64_t count, const float *grad,
                            const float *out, int view)
{
    if (view || count <= c->piece_bytes / c->esize || in_region(c, grad, count * sizeof(float)) ||
        in_region(c, out, count * sizeof(float)))
        return 0;
    uint64_t per = c->piece_bytes / c->esize, least = (count + PSC_PIECES_MAX - 1) / PSC_PIECES_MAX;
    return per > least ? per : least;
}

/* Where the piece that starts at a ends: per elements on, or sooner at the
 * end of a's shard or at end. *shard_start: a is where a's shard begins. */
static uint64_t piece_end(const struct psc_client *c, const struct table_h *t, uint64_t a,
                          uint64_t end, uint64_t per, int *shard_start)
{
    uint64_t lo, hi;
    ps_shard_range(t->size, c->nshards, ps_shard_of_index(t->size, c->nshards, a), &lo, &hi);
    *shard_start = a == lo;
    uint64_t b = end - a > per ? a + per : end;
    return b < hi ? b : hi;
}

/* Sends a checked range request as pieces of per elements, each its own
 * ticket, under one more. Sends it whole when the tickets or the memory to
 * list them are short. */
static int start_pieces(struct psc_client *c, Ps__Op op, uint32_t table, uint64_t offset,
                        uint64_t count, const float *grad, float *out, uint64_t clock, uint64_t per,
                        uint64_t *ticket)
{
    const struct table_h *t = c->tables[table];
    uint64_t end = offset + count;
    uint32_t n = 0;
    int shard_start;
    for (uint64_t a = offset; a < end; n++)
        a = piece_end(c, t, a, end, per, &shard_start);
    uint64_t id = 0;
    struct slot *sl = c->nfree > n ? slot_alloc(c, op, &id) : NULL;
    if (sl != NULL && sl->kids_cap < n) {
        uint64_t *k = realloc(sl->kids, n * sizeof *k);
        if (k != NULL) {
            sl->kids = k;
            sl->kids_cap = n;
        }
    }
    if (sl == NULL || sl->kids_cap < n) {
        if (sl != NULL)
            slot_release(c, sl);
        return range_ticket(c, op, table, offset, count, grad, out, 0, 0, clock, ticket);
    }
    sl->kind = SUB_PIECES;
    for (uint64_t a = offset, b; a < end; a = b) {
        b = piece_end(c, t, a, end, per, &shard_start);
        uint64_t kid = 0;
        /* the first piece to each shard starts the request's pass there
         * (pieces end at shard ends, so a later one starts its shard) */
        int continues = op != PS__OP__OP_PULL && a != offset && !shard_start;
        int rc = range_ticket(c, op, table, a, b - a, grad ? grad + (a - offset) : NULL,
                              out ? out + (a - offset) : NULL, 0, continues, clock, &kid);
        if (rc != 0 && sl->nkids == 0) {
            slot_release(c, sl);
            return rc; /* nothing went: as a request sent whole */
        }
        if (rc != 0) { /* fails at wait, after the pieces that went */
            slot_fail(sl, rc, "%s", c->last_error);
            break;
        }
        sl->kids[sl->nkids++] = kid;
    }
    *ticket = id;
    return 0;
}

static int start_range(struct psc_client *c, Ps__Op op, uint32_t table, uint64_t offset,
                       uint64_t count, const float *grad, float *out, int view, uint64_t clock,
                       uint64_t *ticket)
{
    if (table >= c->ntables)
        return set_error(c, PS_ENOTABLE, "%s: no table handle %u", ps_op_name(op), table);
    const struct table_h *t = c->tables[table];
    if (t->sparse)
        return set_error(c, PS_EINVAL, "%s: '%s' is sparse: use the _rows calls", ps_op_name(op),
                         t->name);
    if (count == 0 || offset >= t->size || count > t->size - offset)
        return set_error(c, PS_ERANGE, "%s: [%llu, +%llu) is outside table '%s' of %llu",
                         ps_op_name(op), (unsigned long long)offset, (unsigned long long)count,
                         t->name, (unsigned long long)t->size);
    if ((op != PS__OP__OP_PULL && grad == NULL) || (op != PS__OP__OP_PUSH && out == NULL && !view))
        return set_error(c, PS_EINVAL, "%s: NULL buffer", ps_op_name(op));
    if (view && c->dtype != PS__DTYPE__DTYPE_F32)
        return set_error(c, PS_EINVAL, "pull view: the values must be f32 on the wire");
    uint64_t per = piece_elems(c, count, grad, out, view);
    if (per != 0)
        return start_pieces(c, op, table, offset, count, grad, out, clock, per, ticket);
    return range_ticket(c, op, table, offset, count, grad, out, view, 0, clock, ticket);
}

static int range_ticket(struct psc_client *c, Ps__Op op, uint32_t table, uint64_t offset,
                        uint64_t count, const float *grad, float *out, int view, int continues,
                        uint64_t clock, uint64_t *ticket)
{
    uint64_t id = 0;
    struct slot *sl = slot_alloc(c, op, &id);
    if (sl == NULL)
        return set_error(c, PS_EBUSY, "%s: %u requests already outstanding", ps_op_name(op),
                         PS_CLIENT_TICKETS_MAX);
    if (view && sl->vmsg == NULL) {
        if ((sl->vmsg = malloc(c->nshards * sizeof *sl->vmsg)) == NULL) {
            slot_release(c, sl);
            return set_error(c, PS_ENOMEM, "pull view: no memory");
        }
        for (uint32_t s = 0; s < c->nshards; s++)
            zmq_msg_init(&sl->vmsg[s]);
    }
    sl->view = view;
    sl->table = table;
    sl->offset = offset;
    sl->count = count;
    sl->out = out;
    const unsigned char *src = wire_values(c, sl, grad, (size_t)count);
    if (grad != NULL && src == NULL) {
        slot_release(c, sl);
        return set_error(c, PS_ENOMEM, "%s: no memory to convert %llu values", ps_op_name(op),
                         (unsigned long long)count);
    }
    sl->kind = SUB_RANGE;
    sl->continues = continues;
    sl->clock = clock;
    sl->src = src;
    return send_all(c, sl, id, ticket);
}

int psc_push_keys(struct psc_client *c, uint32_t table, const uint64_t *keys, const float *vals,
                  size_t n, uint64_t clock, uint64_t *ticket)
{
    if (table >= c->ntables)
        return set_error(c, PS_ENOTABLE, "push: no table handle %u", table);
    const struct table_h *t = c->tables[table];
    if (t->sparse)
        return set_error(c, PS_EINVAL, "push: '%s' is sparse: use psc_push_rows", t->name);
    if (n == 0 || keys == NULL || vals == NULL)
        return set_error(c, PS_EINVAL, "push: no keys");
    size_t bad = ps_wire_keys_unordered(keys, n); /* increasing: only the last can be too big */
    if (bad == n && keys[n - 1] >= t->size)
        bad = n - 1;
    if (bad < n)
        return set_error(c, PS_EINVAL,
                         "push: key[%zu]=%llu must be below %llu and above the one before", bad,
                         (unsigned long long)keys[bad], (unsigned long long)t->size);
    uint64_t id = 0;
    struct slot *sl = slot_alloc(c, PS__OP__OP_PUSH, &id);
    if (sl == NULL)
        return set_error(c, PS_EBUSY, "push: %u requests already outstanding",
                         PS_CLIENT_TICKETS_MAX);
    sl->table = table;
    const unsigned char *src = wire_values(c, sl, vals, n);
    if (src == NULL) {
        slot_release(c, sl);
        return set_error(c, PS_ENOMEM, "push: no memory to convert %zu values", n);
    }
    sl->kind = SUB_KEYS;
    sl->clock = clock;
    sl->src = src;
    sl->keys = keys;
    sl->nkeys = n;
    return send_all(c, sl, id, ticket);
}

/* Grows the slot's row buffers to n keys of dim floats. */
static int rows_reserve(struct psc_client *c, struct slot *sl, size_t n, size_t dim)
{
    if (sl->grp == NULL && (sl->grp = malloc(2 * (c->nshards + 1) * sizeof *sl->grp)) == NULL)
        return PS_ENOMEM;
    if (n > sl->rows_cap) {
        uint32_t *o = realloc(sl->order, n * sizeof *o);
        if (o != NULL)
            sl->order = o;
        uint64_t *k = realloc(sl->skeys, n * sizeof *k);
        if (k != NULL)
            sl->skeys = k;
        if (o == NULL || k == NULL)
            return PS_ENOMEM;
        sl->rows_cap = n;
    }
    if (n * dim > sl->vals_cap) {
        float *v = realloc(sl->svals, n * dim * sizeof *v);
        if (v == NULL)
            return PS_ENOMEM;
        sl->svals = v;
        sl->vals_cap = n * dim;
    }
    return 0;
}

/* Groups keys (and values) by owning shard, stably, with each grouped
 * row's place in the caller's order. With one shard the group is the
 * caller's order: the keys are copied at once, the values are sent from
 * the caller's buffer (vals NULL here), and a reply lands as it comes
 * (order is not filled). */
static void rows_group(struct psc_client *c, struct slot *sl, const uint64_t *keys,
                       const float *vals, size_t n, size_t dim)
{
    if (c->nshards == 1) {
        sl->grp[0] = 0;
        sl->grp[1] = (uint32_t)n;
        memcpy(sl->skeys, keys, n * sizeof *keys);
        return;
    }
    uint32_t *cursor = sl->grp + c->nshards + 1;
    memset(sl->grp, 0, (c->nshards + 1) * sizeof *sl->grp);
    for (size_t i = 0; i < n; i++)
        sl->grp[ps_shard_of_key(keys[i], c->nshards) + 1]++;
    for (uint32_t s = 0; s < c->nshards; s++) {
        sl->grp[s + 1] += sl->grp[s];
        cursor[s] = sl->grp[s];
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t pos = cursor[ps_shard_of_key(keys[i], c->nshards)]++;
        sl->order[pos] = (uint32_t)i;
        sl->skeys[pos] = keys[i];
        if (vals != NULL)
            memcpy(sl->svals + (size_t)pos * dim, vals + i * dim, dim * sizeof(float));
    }
}

static int start_rows(struct psc_client *c, Ps__Op op, uint32_t table, const uint64_t *keys,
                      size_t n, const float *grads, float *out, uint64_t clock, uint64_t *ticket)
{
    if (table >= c->ntables || !c->tables[table]->sparse)
        return set_error(c, PS_ENOTABLE, "%s: handle %u is not a sparse table", ps_op_name(op),
                         table);
    const struct table_h *t = c->tables[table];
    if (n == 0 || n > UINT32_MAX || keys == NULL)
        return set_error(c, PS_EINVAL, "%s: need 1..%u keys", ps_op_name(op), UINT32_MAX);
    size_t bad = ps_wire_keys_unordered(keys, n);
    if (bad < n)
        return set_error(c, PS_EINVAL, "%s: key[%zu]=%llu is not above key[%zu]", ps_op_name(op),
                         bad, (unsigned long long)keys[bad], bad - 1);
    uint64_t id = 0;
    struct slot *sl = slot_alloc(c, op, &id);
    if (sl == NULL)
        return set_error(c, PS_EBUSY, "%s: too many requests outstanding", ps_op_name(op));
    size_t d = t->dim;
    const unsigned char *src = NULL;
    int grouped = c->nshards > 1; /* else the gradients go from grads (buffer rules) */
    if (rows_reserve(c, sl, n, grads && grouped ? d : 0) != 0 ||
        (rows_group(c, sl, keys, grouped ? grads : NULL, n, d),
         grads && (src = wire_values(c, sl, grouped ? sl->svals : grads, n * d)) == NULL)) {
        slot_release(c, sl);
        return set_error(c, PS_ENOMEM, "%s: out of memory for %zu rows", ps_op_name(op), n);
    }
    sl->rows = 1;
    sl->table = table;
    sl->out = out;
    sl->kind = SUB_ROWS;
    sl->clock = clock;
    sl->src = src;
    return send_all(c, sl, id, ticket);
}

int psc_pull_rows(struct psc_client *c, uint32_t table, const uint64_t *keys, size_t n, float *out,
                  uint64_t clock, uint64_t *ticket)
{
    if (out == NULL)
        return set_error(c, PS_EINVAL, "pull: NULL output");
    return start_rows(c, PS__OP__OP_PULL, table, keys, n, NULL, out, clock, ticket);
}

int psc_push_rows(struct psc_client *c, uint32_t table, const uint64_t *keys, size_t n,
                  const float *grads, uint64_t clock, uint64_t *ticket)
{
    if (grads == NULL)
        return set_error(c, PS_EINVAL, "push: NULL gradients");
    return start_rows(c, PS__OP__OP_PUSH, table, keys, n, grads, NULL, clock, ticket);
}

int psc_push_pull_rows(struct psc_client *c, uint32_t table, const uint64_t *keys, size_t n,
                       const float *grads, float *out, uint64_t clock, uint64_t *ticket)
{
    if (grads == NULL || out == NULL)
        return set_error(c, PS_EINVAL, "push_pull: NULL buffer");
    return start_rows(c, PS__OP__OP_PUSH_PULL, table, keys, n, grads, out, clock, ticket);
}

int psc_pull(struct psc_client *c, uint32_t table, uint64_t offset, uint64_t count, float *out,
             uint64_t clock, uint64_t *ticket)
{
    return start_range(c, PS__OP__OP_PULL, table, offset, count, NULL, out, 0, clock, ticket);
}

int psc_push(struct psc_client *c, uint32_t table, uint64_t offset, uint64_t count,
             const float *grad, uint64_t clock, uint64_t *ticket)
{
    return start_range(c, PS__OP__OP_PUSH, table, offset, count, grad, NULL, 0, clock, ticket);
}

int psc_push_pull(struct psc_client *c, uint32_t table, uint64_t offset, uint64_t count,
                  const float *grad, float *out, uint64_t clock, uint64_t *ticket)
{
    return start_range(c, PS__OP__OP_PUSH_PULL, table, offset, count, grad, out, 0, clock, ticket);
}

int psc_pull_view(struct psc_client *c, uint32_t table, uint64_t offset, uint64_t count,
                  uint64_t clock, uint64_t *ticket)
{
    return start_range(c, PS__OP__OP_PULL, table, offset, count, NULL, NULL, 1, clock, ticket);
}

/* The held view of ticket, or NULL (error set). */
static struct slot *held_view(struct psc_client *c, uint64_t ticket)
{
    struct slot *sl = slot_lookup(c, ticket);
    if (sl == NULL || !sl->view || !sl->held) {
        set_error(c, PS_EINVAL, "ticket %llu is not a pull view that was waited for",
                  (unsigned long long)ticket);
        return NULL;
    }
    return sl;
}

int psc_view_part(struct psc_client *c, uint64_t ticket, uint32_t i, const float **vals,
                  uint64_t *offset, uint64_t *count)
{
    struct slot *sl = held_view(c, ticket);
    if (sl == NULL)
        return PS_EINVAL;
    for (uint32_t s = 0, k = 0; s < c->nshards; s++) {
        uint64_t a, b;
        if (!range_part(c, sl, s, &a, &b) || k++ != i)
            continue;
        *vals = zmq_msg_data(&sl->vmsg[s]);
        *offset = a;
        *count = b - a;
        return 0;
    }
    return set_error(c, PS_ERANGE, "pull view %llu has no part %u", (unsigned long long)ticket, i);
}

int psc_view_release(struct psc_client *c, uint64_t ticket)
{
    struct slot *sl = held_view(c, ticket);
    if (sl == NULL)
        return PS_EINVAL;
    slot_release(c, sl);
    return 0;
}

/* ---- public: synchronous ops --------------------------------------------- */

/* Sends h to shards [s0, s1] and waits for all. */
static int call_sync(struct psc_client *c, Ps__Header *h, uint32_t s0, uint32_t s1, void *ctx,
                     int timeout_ms)
{
    uint64_t id = 0;
    struct slot *sl = slot_alloc(c, h->op, &id);
    if (sl == NULL)
        return set_error(c, PS_EBUSY, "%s: too many requests outstanding", ps_op_name(h->op));
    sl->ctx = ctx;
    h->request_id = id;
    h->worker_id = c->worker_id;
    for (uint32_t s = s0; s <= s1; s++)
        if (send_frames(c, s, h, NULL, 0, NULL, 0, sl, 0) != 0)
            break;
    int rc = psc_wait(c, id, timeout_ms);
    if (rc == PS_ETIMEDOUT)
        psc_cancel(c, id); /* no zero-copy frames: always releases */
    return rc;
}

void psc_table_spec_init(struct psc_table_spec *s, const char *name, uint64_t size)
{
    memset(s, 0, sizeof *s);
    s->name = name;
    s->size = size;
    s->optimizer = PSC_SGD;
    s->lr = 0.01f;
    s->momentum = 0.9f;
    s->beta1 = 0.9f;
    s->beta2 = 0.999f;
    s->eps = 1e-8f;
    s->init = PSC_INIT_ZEROS;
}

int psc_table_create(struct psc_client *c, const struct psc_table_spec *spec, int timeout_ms,
                     uint32_t *table)
{
    Ps__TableSpec ts;
    ps__table_spec__init(&ts);
    ts.name = (char *)(spec->name ? spec->name : "");
    ts.size = spec->size;
    ts.optimizer = (Ps__OptimizerKind)spec->optimizer;
    ts.lr = spec->lr;
    ts.weight_decay = spec->weight_decay;
    ts.momentum = spec->momentum;
    ts.nesterov = spec->nesterov != 0;
    ts.beta1 = spec->beta1;
    ts.beta2 = spec->beta2;
    ts.eps = spec->eps;
    ts.init = (Ps__InitKind)spec->init;
    ts.init_scale = spec->init_scale;
    ts.seed = spec->seed;
    ts.lr_schedule = (Ps__LrSchedule)spec->lr_schedule;
    ts.lr_decay_steps = spec->lr_decay_steps;
    ts.sparse = spec->sparse != 0;
    ts.dim = spec->sparse ? spec->dim : 0;
    ts.rows_max = spec->rows_max;
    ts.l1 = spec->l1;
    ts.l2 = spec->l2;
    char err[PS_ERROR_TEXT_MAX];
    int rc = ps_wire_check_spec(&ts, err, sizeof err);
    if (rc != 0)
        return set_error(c, rc, "create_table: %s", err);
    int64_t existing = -1; /* created before: the servers still check the spec */
    for (uint32_t i = 0; i < c->ntables && existing < 0; i++)
        if (strcmp(c->tables[i]->name, ts.name) == 0)
            existing = i;
    if (existing < 0 && c->ntables >= PS_CLIENT_TABLES_MAX)
        return set_error(c, PS_ELIMIT, "create_table: %u tables already", c->ntables);
    struct table_h *t = calloc(1, sizeof *t + c->nshards * sizeof t->ids[0]);
    if (t == NULL)
        return set_error(c, PS_ENOMEM, "create_table: out of memory");
    snprintf(t->name, sizeof t->name, "%s", ts.name);
    t->size = ts.size;
    t->sparse = ts.sparse;
    t->dim = ts.dim;
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &ts;
    rc = call_sync(c, &h, 0, c->nshards - 1, t, timeout_ms);
    if (rc != 0 || existing >= 0) {
        free(t);
        if (rc == 0)
            *table = (uint32_t)existing;
        return rc;
    }
    c->tables[c->ntables] = t;
    *table = c->ntables++;
    return 0;
}

int psc_stats_tables(struct psc_client *c, uint32_t shard, int timeout_ms,
                     struct psc_shard_stats *out, struct psc_table_stats *list, uint32_t cap)
{
    if (shard >= c->nshards)
        return set_error(c, PS_EINVAL, "stats: shard %u of %u", shard, c->nshards);
    memset(out, 0, sizeof *out);
    struct stats_out so = {out, list, list ? cap : 0};
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_STATS);
    return call_sync(c, &h, shard, shard, &so, timeout_ms);
}

int psc_stats(struct psc_client *c, uint32_t shard, int timeout_ms, struct psc_shard_stats *out)
{
    return psc_stats_tables(c, shard, timeout_ms, out, NULL, 0);
}

int psc_checkpoint(struct psc_client *c, uint32_t shard, int timeout_ms, char *detail, size_t len)
{
    if (shard >= c->nshards)
        return set_error(c, PS_EINVAL, "checkpoint: shard %u of %u", shard, c->nshards);
    char buf[PS_ERROR_TEXT_MAX] = "";
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_CHECKPOINT);
    int rc = call_sync(c, &h, shard, shard, buf, timeout_ms);
    if (detail != NULL && len > 0)
        snprintf(detail, len, "%s", buf);
    return rc;
}

int psc_rows(struct psc_client *c, uint32_t table, uint32_t shard, uint64_t offset, uint32_t max,
             uint64_t *keys, float *vals, uint64_t *got, uint64_t *total, int timeout_ms)
{
    if (table >= c->ntables)
        return set_error(c, PS_ENOTABLE, "rows: no table handle %u", table);
    const struct table_h *t = c->tables[table];
    if (!t->sparse)
        return set_error(c, PS_ENOTABLE, "rows: '%s' is not a sparse table", t->name);
    if (shard >= c->nshards)
        return set_error(c, PS_EINVAL, "rows: shard %u of %u", shard, c->nshards);
    if (max == 0 || max > PS_ROWS_PAGE_MAX)
        return set_error(c, PS_EINVAL, "rows: page of %u rows, expected 1..%u", max,
                         PS_ROWS_PAGE_MAX);
    struct rows_out ro = {.offset = offset, .max = max, .dim = t->dim, .keys = keys, .vals = vals};
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_ROWS);
    h.table_id = t->ids[shard];
    h.offset = offset;
    h.count = max;
    int rc = call_sync(c, &h, shard, shard, &ro, timeout_ms);
    *got = ro.got;
    *total = ro.total;
    return rc;
}

int psc_table_open(struct psc_client *c, const char *name, int timeout_ms, uint32_t *table)
{
    for (uint32_t i = 0; i < c->ntables; i++) {
        if (strcmp(c->tables[i]->name, name) == 0) {
            *table = i;
            return 0;
        }
    }
    if (c->ntables >= PS_CLIENT_TABLES_MAX)
        return set_error(c, PS_ELIMIT, "open: %u tables already", c->ntables);
    struct table_h *t = calloc(1, sizeof *t + c->nshards * sizeof t->ids[0]);
    struct psc_table_stats *list = calloc(PS_TABLES_MAX, sizeof *list);
    int rc = t && list ? 0 : set_error(c, PS_ENOMEM, "open: out of memory");
    for (uint32_t s = 0; s < c->nshards && rc == 0; s++) {
        struct psc_shard_stats st;
        if ((rc = psc_stats_tables(c, s, timeout_ms, &st, list, PS_TABLES_MAX)) != 0)
            break;
        uint32_t i = 0;
        while (i < st.tables && i < PS_TABLES_MAX && strcmp(list[i].name, name) != 0)
            i++;
        if (i == st.tables || i == PS_TABLES_MAX) {
            rc = set_error(c, PS_ENOTABLE, "open: shard %u (%s) has no table '%s'", s,
                           c->endpoints[s], name);
            break;
        }
        uint64_t lo, hi;
        ps_shard_range(list[i].size, c->nshards, s, &lo, &hi);
        if (!list[i].sparse && (list[i].lo != lo || list[i].hi != hi)) {
            rc = set_error(c, PS_ESTATE,
                           "open: shard %u holds [%llu, %llu) of '%s', expected "
                           "[%llu, %llu)",
                           s, (unsigned long long)list[i].lo, (unsigned long long)list[i].hi, name,
                           (unsigned long long)lo, (unsigned long long)hi);
            break;
        }
        snprintf(t->name, sizeof t->name, "%s", name);
        t->size = list[i].size;
        t->sparse = list[i].sparse;
        t->dim = list[i].dim;
        t->ids[s] = list[i].id;
    }
    free(list);
    if (rc != 0) {
        free(t);
        return rc;
    }
    c->tables[c->ntables] = t;
    *table = c->ntables++;
    return 0;
}

void psc_bytes(const struct psc_client *c, uint64_t *sent, uint64_t *received)
{
    *sent = c->bytes_sent;
    *received = c->bytes_received;
}

void *psc_shm_alloc(struct psc_client *c, size_t bytes)
{
    size_t at = (c->shm_used + 63u) & ~(size_t)63u;
    if (c->shm.base == NULL || at > c->shm.size || bytes > c->shm.size - at)
        return NULL;
    c->shm_used = at + bytes;
    return c->shm.base + at;
}

uint32_t psc_shm_shards(const struct psc_client *c)
{
    uint32_t n = 0;
    for (uint32_t s = 0; c->shm_on != NULL && s < c->nshards; s++)
        n += c->shm_on[s];
    return n;
}

void psc_shm_bytes(const struct psc_client *c, uint64_t *sent, uint64_t *received)
{
    *sent = c->shm_sent;
    *received = c->shm_received;
}

uint32_t psc_shards(const struct psc_client *c)
{
    return c->nshards;
}

int psc_shard_answered(const struct psc_client *c, uint32_t shard)
{
    return shard < c->nshards && c->offers[shard].instance != 0;
}

const char *psc_last_error(const struct psc_client *c)
{
    return c->last_error;
}

/* ---- public: lifetime ------------------------------------------------------ */

/* A DEALER connected to ep for shard s, in *out; closed again on failure. */
static int open_socket(struct psc_client *c, const struct psc_config *cfg, uint32_t s,
                       const char *ep, void **out, char *err, size_t errlen)
{
    void *sock = *out = zmq_socket(c->ctx, ZMQ_DEALER);
    int linger = 0, buf = PS_SOCKET_BUFFER_BYTES, hwm = PS_SOCKET_HWM, rc = 0;
    if (sock == NULL || zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(sock, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(sock, ZMQ_SNDBUF, &buf, sizeof buf) != 0 ||
        zmq_setsockopt(sock, ZMQ_RCVBUF, &buf, sizeof buf) != 0) {
        snprintf(err, errlen, "server %u: cannot create socket: %s", s, zmq_strerror(errno));
        rc = PS_EZMQ;
    } else if (cfg->curve_server_key != NULL &&
               (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, cfg->curve_server_key, 41) != 0 ||
                zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, cfg->curve_public, 41) != 0 ||
                zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, cfg->curve_secret, 41) != 0)) {
        snprintf(err, errlen, "server %u: CURVE keys refused by zmq: %s", s, zmq_strerror(errno));
        rc = PS_EINVAL;
    } else if (zmq_connect(sock, ep) != 0) {
        snprintf(err, errlen, "server %u: cannot connect to '%s': %s", s, ep, zmq_strerror(errno));
        rc = PS_EINVAL;
    }
    if (rc != 0 && sock != NULL) {
        zmq_close(sock);
        *out = NULL;
    }
    return rc;
}

static int open_sockets(struct psc_client *c, const struct psc_config *cfg, char *err,
                        size_t errlen)
{
    for (uint32_t s = 0; s < c->nshards; s++) {
        const char *ep = cfg->servers[s];
        if (ep == NULL || strlen(ep) >= PS_ENDPOINT_MAX) {
            snprintf(err, errlen, "server %u: endpoint missing or longer than %u bytes", s,
                     PS_ENDPOINT_MAX - 1);
            return PS_EINVAL;
        }
        void *sock = NULL;
        if ((c->endpoints[s] = strdup(ep)) == NULL) {
            snprintf(err, errlen, "out of memory");
            return PS_ENOMEM;
        }
        int rc = open_socket(c, cfg, s, ep, &sock, err, errlen);
        if (rc != 0)
            return rc;
        c->socks[s] = sock;
    }
    return 0;
}

/* Tells cfg's hello_waiting which shards have not answered the hello,
 * and why when a shard said (NULL: no answer yet). */
static void hello_waiting(const struct psc_client *c, const struct psc_config *cfg, int waited_ms,
                          const char *why)
{
    uint32_t missing[PS_SHARDS_MAX], n = 0;
    for (uint32_t s = 0; s < c->nshards; s++)
        if (c->offers[s].instance == 0)
            missing[n++] = s;
    if (n > 0)
        cfg->hello_waiting(cfg->hello_waiting_arg, missing, n, waited_ms, why);
}

/* ZeroMQ's socket monitor on each shard's socket while the hello waits:
 * a handshake the server refused (CURVE key not admitted, CURVE on one
 * side only) shows there at once, where the hello would just never be
 * answered. */
struct hello_watch {
    void *mon[PS_SHARDS_MAX]; /* PAIR sockets reading each monitor; NULL: none */
};

static void watch_start(struct psc_client *c, struct hello_watch *hw)
{
    memset(hw, 0, sizeof *hw);
    const int events = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                       ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    for (uint32_t s = 0; s < c->nshards; s++) {
        char ep[64];
        int linger = 0;
        snprintf(ep, sizeof ep, "inproc://psc-hello-%p-%u", (void *)c, s);
        void *m = NULL;
        if (zmq_socket_monitor(c->socks[s], ep, events) != 0 ||
            (m = zmq_socket(c->ctx, ZMQ_PAIR)) == NULL ||
            zmq_setsockopt(m, ZMQ_LINGER, &linger, sizeof linger) != 0 || zmq_connect(m, ep) != 0) {
            if (m != NULL)
                zmq_close(m);
            zmq_socket_monitor(c->socks[s], NULL, 0);
            continue; /* best effort: the hello still times out */
        }
        hw->mon[s] = m;
    }
}

static void watch_stop(struct psc_client *c, struct hello_watch *hw)
{
    for (uint32_t s = 0; s < c->nshards; s++)
        if (hw->mon[s] != NULL) {
            zmq_socket_monitor(c->socks[s], NULL, 0);
            zmq_close(hw->mon[s]);
            hw->mon[s] = NULL;
        }
}

/* A refused handshake seen by the monitors: PS_EAUTH with the shard and
 * the likely cause in the client's error; 0 when none was seen. */
static int watch_refused(struct psc_client *c, const struct psc_config *cfg, struct hello_watch *hw)
{
    for (uint32_t s = 0; s < c->nshards; s++) {
        zmq_msg_t parts[2];
        size_t kept = 0, total = 0;
        if (hw->mon[s] == NULL ||
            ps_zsock_recv(hw->mon[s], ZMQ_DONTWAIT, parts, 2, &kept, &total, NULL) != 0)
            continue;
        uint16_t ev = 0;
        if (kept >= 1 && zmq_msg_size(&parts[0]) >= 6) {
            const uint8_t *d = zmq_msg_data(&parts[0]);
            ev = (uint16_t)(d[0] | d[1] << 8);
        }
        for (size_t i = 0; i < kept; i++)
            zmq_msg_close(&parts[i]);
        /* the server often closes the connection before its reason arrives
         * (no detail, EPIPE): the cause is told from this side's keys */
        int curve = cfg->curve_server_key != NULL;
        const char *why =
            !curve ? "the handshake failed: the server speaks CURVE and this client does not "
                     "(give it CURVE keys: --curve-secret and --curve-server-key)"
            : ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
                ? "the server's CURVE allow list does not admit this client's public key"
                : "the CURVE handshake failed: the server does not speak CURVE, or its public "
                  "key is not the one given (--curve-server-key)";
        return set_error(c, PS_EAUTH, "hello: shard %u (%s) refused this client: %s", s,
                         c->endpoints[s], why);
    }
    return 0;
}

/* Hello to every shard from a new session (a random id: servers keep the
 * last request id applied per worker and session, so a restarted worker is
 * not mistaken for a retry of the old one); the start clock is the
 * furthest any shard names. Waited for up to timeout_ms. With cfg (NULL:
 * none of this), in pieces of WATCH_MS: a handshake the server refused
 * ends it at once (watch_refused), and hello_waiting is told after 1 s
 * and every 5 s which shards have not answered. */
static int say_hello(struct psc_client *c, const struct psc_config *cfg, int timeout_ms)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_HELLO);
    h.worker_id = c->worker_id;
    h.session = c->session = ps_random_id();
    c->start_clock = 0;
    enum { WATCH_MS = 200 };
    int rc = 0, waited = 0, tell_at = 1000;
    uint64_t id = 0;
    char held[sizeof c->last_error] = ""; /* why a shard would not let go of the id yet */
    struct hello_watch hw;
    if (cfg != NULL)
        watch_start(c, &hw);
    for (int sent = 0;;) {
        if (!sent) { /* the hello, again with the same session after a refusal */
            struct slot *sl = slot_alloc(c, h.op, &id);
            if (sl == NULL) {
                rc = set_error(c, PS_EBUSY, "hello: too many requests outstanding");
                break;
            }
            h.request_id = id;
            for (uint32_t s = 0; s < c->nshards; s++)
                if (send_frames(c, s, &h, NULL, 0, NULL, 0, sl, 0) != 0)
                    break;
            sent = 1;
        }
        int piece = cfg == NULL || timeout_ms < 0 || timeout_ms - waited <= WATCH_MS
                        ? (timeout_ms < 0 ? -1 : timeout_ms - waited)
                        : WATCH_MS;
        rc = psc_wait(c, id, piece);
        if (rc == PS_EREMOTE && c->last_remote == PS_EBUSY && cfg != NULL && timeout_ms >= 0 &&
            waited + piece < timeout_ms) {
            /* the id is still held by the connection of a process this one
             * may replace (a restart): the shard lets go of it once that
             * one has been silent for its --worker-timeout */
            snprintf(held, sizeof held, "%s", c->last_error);
            struct timespec ts = {0, WATCH_MS * 1000000L};
            nanosleep(&ts, NULL);
            sent = 0;
            rc = PS_ETIMEDOUT;
        } else if (rc != PS_ETIMEDOUT) {
            break;
        }
        waited += piece;
        if (piece < 0 || waited >= timeout_ms)
            break;
        if ((rc = watch_refused(c, cfg, &hw)) != 0)
            break;
        rc = PS_ETIMEDOUT;
        if (cfg->hello_waiting != NULL && waited >= tell_at) {
            hello_waiting(c, cfg, waited, held[0] ? held : NULL);
            tell_at += 5000;
        }
    }
    if (cfg != NULL)
        watch_stop(c, &hw);
    char why[sizeof c->last_error];
    if (rc == PS_EAUTH) {
        psc_cancel(c, id);
        return rc;
    }
    if (rc == PS_ETIMEDOUT) { /* psc_wait named the shards and its last piece's time */
        const char *from = strstr(c->last_error, " from shard ");
        snprintf(why, sizeof why, "%s", from ? from : "");
        if (held[0] != '\0')
            set_error(c, PS_EBUSY, "%s (for %d ms)", held, waited);
        else
            set_error(c, rc, "hello: no reply within %d ms%s", waited, why);
        psc_cancel(c, id); /* no zero-copy frames: always releases */
        return held[0] != '\0' ? PS_EBUSY : rc;
    }
    if (rc != 0) {
        snprintf(why, sizeof why, "%s", c->last_error);
        return set_error(c, rc, "hello: %s", why);
    }
    c->outside = 0;
    return 0;
}

/* Moves each shard whose hello offered a same-host endpoint this process can
 * reach onto it (ps_local.h). The switch is checked by a hello in the same
 * session over the new socket: it must come from the same psd process, or
 * the shard stays on the endpoint it was given. Runs before any request is
 * outstanding, so no reply is lost with the old socket. */
static void go_local(struct psc_client *c, const struct psc_config *cfg, int timeout_ms)
{
    for (uint32_t s = 0; s < c->nshards; s++) {
        if (!ps_local_reachable(c->offers[s].local))
            continue;
        struct offer want = c->offers[s];
        char *ep = strdup(want.local);
        void *tcp = c->socks[s], *local = NULL;
        char err[256];
        if (ep == NULL || open_socket(c, cfg, s, want.local, &local, err, sizeof err) != 0) {
            free(ep);
            continue;
        }
        c->socks[s] = local;
        uint64_t start_clock = c->start_clock;
        Ps__Header h;
        ps_wire_header_init(&h, PS__OP__OP_HELLO);
        h.session = c->session; /* the same session: not a restart */
        if (c->shm.fd >= 0 &&
            ps_shm_hand(want.local, c->shm.fd, c->shm_token, timeout_ms, err, sizeof err) == 0)
            h.shm_token = c->shm_token; /* bound to this connection by the hello */
        if (call_sync(c, &h, s, s, NULL, timeout_ms) == 0 &&
            c->offers[s].instance == want.instance) {
            zmq_close(tcp);
            free(c->endpoints[s]);
            c->endpoints[s] = ep;
        } else {
            zmq_close(local);
            c->socks[s] = tcp;
            c->offers[s] = want;
            if (c->shm_on != NULL)
                c->shm_on[s] = 0;
            c->start_clock = start_clock;
            free(ep);
        }
    }
    c->last_error[0] = '\0';
}

const char *psc_endpoint(const struct psc_client *c, uint32_t shard)
{
    return shard < c->nshards ? c->endpoints[shard] : NULL;
}

int psc_outside_round(const struct psc_client *c)
{
    return c->outside;
}

int psc_rejoin(struct psc_client *c, int timeout_ms)
{
    if (c->nfree != PS_CLIENT_TICKETS_MAX)
        return set_error(c, PS_EBUSY, "rejoin: %u tickets are outstanding",
                         PS_CLIENT_TICKETS_MAX - c->nfree);
    return say_hello(c, NULL, timeout_ms);
}

int psc_create(const struct psc_config *cfg, struct psc_client **out, char *err, size_t errlen)
{
    *out = NULL;
    if (cfg != NULL && cfg->curve_server_key != NULL &&
        (cfg->curve_public == NULL || cfg->curve_secret == NULL ||
         strlen(cfg->curve_server_key) != 40 || strlen(cfg->curve_public) != 40 ||
         strlen(cfg->curve_secret) != 40)) {
        snprintf(err, errlen,
                 "CURVE needs the server key and this client's key pair, 40 "
                 "Z85 characters each");
        return PS_EINVAL;
    }
    if (cfg == NULL || cfg->servers == NULL || cfg->nservers == 0 ||
        cfg->nservers > PS_SHARDS_MAX) {
        snprintf(err, errlen, "need 1..%u server endpoints", PS_SHARDS_MAX);
        return PS_EINVAL;
    }
    for (size_t s = 0; s < cfg->nservers; s++)
        if (cfg->servers[s] == NULL || ps_endpoint_check(cfg->servers[s], 0, err, errlen) != 0) {
            if (cfg->servers[s] == NULL)
                snprintf(err, errlen, "server endpoint %zu is NULL", s);
            return PS_EINVAL;
        }
    struct psc_client *c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return PS_ENOMEM;
    }
    c->nshards = (uint32_t)cfg->nservers;
    c->worker_id = cfg->worker_id;
    c->dtype = (Ps__DType)cfg->wire_dtype;
    c->nonzero_pulls = cfg->nonzero_pulls != 0;
    c->retry_ms = cfg->retry_ms > 0 ? cfg->retry_ms : 0;
    c->heartbeat_ms = cfg->heartbeat_ms == 0 ? PSC_HEARTBEAT_MS_DEFAULT : cfg->heartbeat_ms;
    c->esize = ps_dtype_size(cfg->wire_dtype);
    if (c->esize == 0) {
        snprintf(err, errlen, "wire dtype %d is not f32, f16 or bf16", cfg->wire_dtype);
        free(c);
        return PS_EINVAL;
    }
    c->piece_bytes = cfg->piece_bytes == 0 ? PSC_PIECE_BYTES_DEFAULT : cfg->piece_bytes;
    if (c->piece_bytes < PSC_PIECE_BYTES_MIN) {
        snprintf(err, errlen, "piece_bytes %zu is below %u", cfg->piece_bytes, PSC_PIECE_BYTES_MIN);
        free(c);
        return PS_EINVAL;
    }
    c->socks = calloc(c->nshards, sizeof *c->socks);
    c->endpoints = calloc(c->nshards, sizeof *c->endpoints);
    c->offers = calloc(c->nshards, sizeof *c->offers);
    c->shm.fd = -1;
    c->pfds = calloc(c->nshards, sizeof *c->pfds);
    c->last_send_ms = calloc(c->nshards, sizeof *c->last_send_ms);
    c->arena_buf = malloc(CLIENT_ARENA_BYTES);
    c->ctx = zmq_ctx_new();
    for (uint32_t i = 0; i < PS_CLIENT_TICKETS_MAX; i++) {
        atomic_init(&c->slots[i].zc_refs, 0u);
        c->free_stack[i] = (uint16_t)(PS_CLIENT_TICKETS_MAX - 1 - i);
    }
    c->nfree = PS_CLIENT_TICKETS_MAX;
    if (c->socks == NULL || c->endpoints == NULL || c->offers == NULL || c->pfds == NULL ||
        c->arena_buf == NULL || c->last_send_ms == NULL || c->ctx == NULL) {
        snprintf(err, errlen, "out of memory");
        psc_destroy(c);
        return PS_ENOMEM;
    }
    ps_arena_init(&c->arena, c->arena_buf, CLIENT_ARENA_BYTES);
    /* before the first socket starts the I/O thread */
    for (int i = 0; i < cfg->nio_cpus; i++)
        if (zmq_ctx_set(c->ctx, ZMQ_THREAD_AFFINITY_CPU_ADD, cfg->io_cpus[i]) != 0) {
            snprintf(err, errlen, "cannot run ZeroMQ's I/O thread on CPU %d: %s", cfg->io_cpus[i],
                     zmq_strerror(errno));
            psc_destroy(c);
            return PS_EINVAL;
        }
    int rc = open_sockets(c, cfg, err, errlen);
    if (rc == 0 && (rc = say_hello(c, cfg, cfg->connect_timeout_ms)) != 0) {
        snprintf(err, errlen, "%s", c->last_error);
        if (rc == PS_ETIMEDOUT && cfg->hello_optional)
            rc = 0;
    } else if (rc == 0 && cfg->local_ipc) {
        /* no region is no error: values go in frames */
        char why[200];
        if (cfg->shm_bytes > 0 && (c->shm_on = calloc(c->nshards, 1)) != NULL &&
            (c->rebind = calloc(c->nshards, sizeof *c->rebind)) != NULL &&
            ps_shm_create(cfg->shm_bytes, &c->shm, why, sizeof why) == 0)
            c->shm_token = ps_random_id();
        go_local(c, cfg, cfg->connect_timeout_ms);
    }
    if (rc != 0) {
        psc_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

void psc_malloc_tune(void)
{
    ps_malloc_tune();
}

void psc_destroy(struct psc_client *c)
{
    if (c == NULL)
        return;
    for (uint32_t s = 0; c->socks != NULL && s < c->nshards; s++) {
        if (c->socks[s] != NULL)
            zmq_close(c->socks[s]);
        free(c->endpoints ? c->endpoints[s] : NULL);
    }
    if (c->ctx != NULL)
        zmq_ctx_term(c->ctx); /* linger 0: drops unsent frames, runs free callbacks */
    for (uint32_t i = 0; i < c->ntables; i++)
        free(c->tables[i]);
    for (uint32_t i = 0; i < PS_CLIENT_TICKETS_MAX; i++) {
        view_drop(c, &c->slots[i]);
        free(c->slots[i].vmsg);
        free(c->slots[i].conv);
        free(c->slots[i].order);
        free(c->slots[i].skeys);
        free(c->slots[i].svals);
        free(c->slots[i].grp);
        free(c->slots[i].kids);
    }
    ps_shm_close(&c->shm);
    free(c->shm_on);
    free(c->rebind);
    free(c->socks);
    free(c->endpoints);
    free(c->offers);
    free(c->pfds);
    free(c->batches);
    free(c->last_send_ms);
    free(c->arena_buf);
    free(c);
}

uint64_t psc_start_clock(const struct psc_client *c)
{
    return c->start_clock;
}

uint64_t psc_stale_pushes(const struct psc_client *c)
{
    return c->stale_pushes;
}

uint64_t psc_resends(const struct psc_client *c)
{
    return c->resends;
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
