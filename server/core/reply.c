/* Replies (reply.h). */
#include "reply.h"

#include "counters.h"
#include "regions.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_half.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct psd_replies {
    psd_send_cb send; /* NULL: requests never wait */
    void *send_ctx;
    psd_unread_cb unread; /* NULL: replies are not held back */
    void *unread_ctx;
    uint64_t unread_bytes_max, unread_bytes_total_max;
    uint64_t unread_refused; /* replies refused for unread bytes */
    uint64_t errors_logged;  /* rate limit for error-reply warnings */
    uint8_t hdr_buf[PS_HEADER_BYTES_MAX];
};

struct psd_replies *psd_replies_create(uint64_t unread_bytes_max, uint64_t unread_bytes_total_max)
{
    struct psd_replies *r = calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    r->unread_bytes_max = unread_bytes_max ? unread_bytes_max : PS_UNREAD_BYTES_DEFAULT;
    r->unread_bytes_total_max =
        unread_bytes_total_max ? unread_bytes_total_max : PS_UNREAD_BYTES_TOTAL_DEFAULT;
    return r;
}

void psd_replies_destroy(struct psd_replies *r)
{
    free(r);
}

void psd_set_sender(struct psd *s, psd_send_cb send, void *ctx)
{
    s->out->send = send;
    s->out->send_ctx = ctx;
}

void psd_set_unread(struct psd *s, psd_unread_cb unread, void *ctx)
{
    s->out->unread = unread;
    s->out->unread_ctx = ctx;
}

uint64_t psd_unread_total(const struct psd *s)
{
    uint64_t peer = 0, total = 0;
    if (s->out->unread != NULL) /* no route: the total alone */
        s->out->unread(s->out->unread_ctx, NULL, 0, &peer, &total);
    return total;
}

uint64_t psd_unread_refused(const struct psd *s)
{
    return s->out->unread_refused;
}

int psd_can_send(const struct psd *s)
{
    return s->out->send != NULL;
}

void psd_reply_deliver(struct psd *s, const void *route, size_t route_len, struct psd_reply *rep)
{
    s->out->send(s->out->send_ctx, route, route_len, rep);
}

void psd_reply_send(struct psd *s, const void *route, size_t route_len, struct psd_reply *rep)
{
    psd_count_bytes_out(s, rep->hdr_len + rep->mask_bytes + rep->vals_bytes);
    psd_reply_deliver(s, route, route_len, rep);
}

void psd_reply_drop(struct psd_reply *rep)
{
    free(rep->mask);
    if (rep->lent != NULL)
        psd_lent_done(rep->lent);
    else if (!rep->vals_borrowed)
        free(rep->vals);
    rep->lent = NULL;
    rep->vals_borrowed = 0;
    rep->mask = rep->vals = NULL;
    rep->mask_bytes = rep->vals_bytes = 0;
}

void psd_reply_header(struct psd *s, const Ps__Header *h, struct psd_reply *rep)
{
    uint8_t *buf = s->out->hdr_buf;
    int64_t n = ps_wire_header_pack(h, buf, PS_HEADER_BYTES_MAX);
    if (n < 0) {
        /* Our own reply outgrew the header limit (e.g. stats of many tables):
         * fall back to a bare error so the peer still gets an answer. */
        Ps__Header e;
        ps_wire_header_init(&e, h->op);
        e.request_id = h->request_id;
        e.status = PS_ELIMIT;
        e.error = "reply header exceeds the header size limit";
        n = ps_wire_header_pack(&e, buf, PS_HEADER_BYTES_MAX);
        psd_reply_drop(rep);
    }
    rep->hdr = buf;
    rep->hdr_len = n < 0 ? 0 : (size_t)n;
}

void psd_reply_init(Ps__Header *out, const Ps__Header *req)
{
    ps_wire_header_init(out, req ? req->op : PS__OP__OP_NONE);
    if (req != NULL) {
        out->request_id = req->request_id;
        out->worker_id = req->worker_id;
        out->table_id = req->table_id;
        out->clock = req->clock;
    }
}

/* The one place error replies are written (and counted, and logged). */
void psd_reply_error(struct psd *s, const Ps__Header *req, int code, const char *text,
                     struct psd_reply *rep)
{
    Ps__Header h;
    psd_reply_init(&h, req);
    h.status = code;
    char buf[PS_ERROR_TEXT_MAX];
    snprintf(buf, sizeof buf, "%s", text);
    h.error = buf;
    uint64_t errors = psd_count_error(s, req, code);
    if (ps_log_sampled(++s->out->errors_logged))
        PS_LOG(s->conf.log, PS_LOG_WARN, S0200,
               "error reply to worker %u (%s): %s [%s] (%llu so far)", req ? req->worker_id : 0,
               req ? ps_op_name(req->op) : "?", buf, ps_err_name(code), (unsigned long long)errors);
    psd_reply_drop(rep);
    psd_reply_header(s, &h, rep);
}

void psd_reply_errorf(struct psd *s, const Ps__Header *req, int code, struct psd_reply *rep,
                      const char *fmt, ...)
{
    char buf[PS_ERROR_TEXT_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    psd_reply_error(s, req, code, buf, rep);
}

/* A reply with values to `route` must fit the bytes it may leave unread
 * (psd_set_unread): one that does not becomes an error reply. While the
 * connection has nothing unread, a reply of any size fits its own bound. */
void psd_fit_unread(struct psd *s, const void *route, size_t route_len, const Ps__Header *req,
                    struct psd_reply *rep)
{
    struct psd_replies *r = s->out;
    uint64_t bytes = rep->mask_bytes + rep->vals_bytes, peer = 0, total = 0;
    if (bytes == 0 || r->unread == NULL)
        return;
    int known = r->unread(r->unread_ctx, route, route_len, &peer, &total);
    int peer_ok = peer == 0 || peer + bytes <= r->unread_bytes_max;
    int total_ok = total + bytes <= r->unread_bytes_total_max;
    if (known && peer_ok && total_ok)
        return;
    r->unread_refused++;
    if (!known)
        psd_reply_errorf(s, req, PS_ELIMIT, rep,
                         "%s: %u connections hold replies they have not read: read yours, or retry",
                         ps_op_name(req->op), PS_UNREAD_PEERS_MAX);
    else if (!peer_ok)
        psd_reply_errorf(
            s, req, PS_ELIMIT, rep,
            "%s: this connection has %llu reply bytes it has not read; %llu more would "
            "pass psd --max-unread-bytes %llu: read your replies",
            ps_op_name(req->op), (unsigned long long)peer, (unsigned long long)bytes,
            (unsigned long long)r->unread_bytes_max);
    else
        psd_reply_errorf(
            s, req, PS_ELIMIT, rep,
            "%s: connections have %llu reply bytes they have not read; %llu more would "
            "pass psd --max-unread-bytes-total %llu",
            ps_op_name(req->op), (unsigned long long)total, (unsigned long long)bytes,
            (unsigned long long)r->unread_bytes_total_max);
}

/* Which elements a bitmap reply carries: i's bit in mask (zeroed, n
 * bits) is set when fn says so; returns how many are (a mask of NULL:
 * only counts). */
typedef uint64_t (*pick_fn)(const void *arg, uint64_t n, uint8_t *mask);

/* Puts w[0..n)'s elements that pick chooses in rep as a bitmap plus
 * their values in dtype, when that is smaller than all n values (k of
 * them, counted before). Returns 1 when rep holds it; 0 when the whole
 * range is to go (larger, or no memory: that one still works). */
static int reply_bitmap(const float *w, size_t n, uint64_t k, Ps__DType dtype, pick_fn pick,
                        const void *arg, struct psd_reply *rep)
{
    size_t esize = ps_dtype_size(dtype), mbytes = (n + 7) / 8;
    if (mbytes + k * esize >= n * esize)
        return 0;
    int f32 = dtype == PS__DTYPE__DTYPE_F32;
    uint8_t *mask = calloc(mbytes ? mbytes : 1, 1);
    void *vals = aligned_alloc(64, ((k ? k : 1) * esize + 63u) & ~(size_t)63u);
    float *g = f32 ? vals : malloc((k ? k : 1) * sizeof(float));
    if (mask == NULL || vals == NULL || g == NULL) {
        free(mask);
        free(vals);
        if (!f32)
            free(g);
        return 0;
    }
    pick(arg, n, mask);
    size_t j = 0;
    for (size_t i = 0; i < n; i++)
        if ((mask[i / 8] >> (i % 8)) & 1u)
            g[j++] = w[i];
    if (!f32) { /* the table is f32; only the wire is 16-bit */
        ps_f32_to_half_n(dtype, g, vals, k);
        free(g);
    }
    rep->mask = mask;
    rep->mask_bytes = mbytes;
    rep->vals = vals;
    rep->vals_bytes = k * esize;
    return 1;
}

static uint64_t pick_nonzero(const void *arg, uint64_t n, uint8_t *mask)
{
    const float *w = arg;
    uint64_t k = 0;
    for (uint64_t i = 0; i < n; i++)
        if (w[i] != 0.0f) {
            if (mask != NULL)
                mask[i / 8] |= (uint8_t)(1u << (i % 8));
            k++;
        }
    return k;
}

/* A pull that asked for changes: the table, its range and the version
 * the client holds (psd_table_changed). */
struct changed_pick {
    const struct psd_table *t;
    const Ps__Header *req;
    uint64_t offset;
};

static uint64_t pick_changed(const void *arg, uint64_t n, uint8_t *mask)
{
    const struct changed_pick *c = arg;
    return psd_table_changed(c->t, c->req->generation, c->req->since, c->offset, n, mask);
}

/* A pull that asked for changes (Header.changed) gets the elements written
 * since its version as a bitmap plus their values, when its version is
 * one this table can compare with and that is smaller than the whole
 * range. Returns 1 when rep holds it. The first such pull starts the
 * table's stamps and gets the whole range. */
static int reply_changed(const Ps__Header *req, struct psd_table *t, uint64_t offset,
                         uint64_t count, struct psd_reply *rep)
{
    if (t->stamp == NULL) {
        (void)psd_table_track(t); /* PS_ENOMEM: every pull gets the whole range */
        return 0;
    }
    struct changed_pick c = {t, req, offset};
    uint64_t n = pick_changed(&c, count, NULL);
    return n != UINT64_MAX && reply_bitmap(t->w + (offset - t->lo), (size_t)count, n, req->dtype,
                                           pick_changed, &c, rep);
}

/* Whether a reply of `bytes` values of t goes out from the table itself
 * (psd_table_lend): f32 replies large enough that a copy would cost more
 * than the bookkeeping, when the table's copy-on-write budget allows
 * (psd_table_may_lend). Writes to other elements do not copy: a worker's
 * chunked push-pulls write the next chunk while the last one's reply is
 * still going out. */
static int lend_ok(struct psd_table *t, const Ps__Header *req, size_t bytes)
{
    return req->dtype == PS__DTYPE__DTYPE_F32 && bytes >= PS_LEND_BYTES_MIN &&
           psd_table_may_lend(t, bytes);
}

/* dst, when not NULL: the values go there (a client's shared region), and
 * the reply carries none. */
void psd_reply_values(struct psd *s, const Ps__Header *req, struct psd_table *t, uint64_t offset,
                      uint64_t count, int duplicate, int stale, unsigned char *dst,
                      struct psd_reply *rep)
{
    Ps__Header h;
    psd_reply_init(&h, req);
    h.duplicate = duplicate != 0;
    h.stale = stale != 0;
    h.offset = offset;
    h.count = count;
    h.dim = 1;
    h.dtype = req->dtype;
    h.clock = psd_cons_clock(&s->conf.cons, t);
    t->pulls++;
    const float *w = t->w + (offset - t->lo);
    int changed = req->changed && !t->sparse;
    if (changed) { /* whatever the reply holds, it is the range at this version */
        h.generation = t->generation;
        h.table_version = t->version;
        h.since = req->since;
        if (dst == NULL && reply_changed(req, t, offset, count, rep)) {
            t->changed_replies++;
            h.layout = PS__LAYOUT__LAYOUT_CHANGED;
            psd_reply_header(s, &h, rep);
            return;
        }
        t->whole_replies++;
    }
    if (dst != NULL) {
        memcpy(dst, w, (size_t)count * sizeof(float));
        psd_regions_count_out(s->shm, count * sizeof(float));
        h.shm = PS_SHM_OUT;
        h.shm_out = req->shm_out;
        psd_reply_header(s, &h, rep);
        return;
    }
    if (req->nonzero_only && t->mask != NULL &&
        reply_bitmap(w, (size_t)count, pick_nonzero(w, count, NULL), req->dtype, pick_nonzero, w,
                     rep)) {
        h.layout = PS__LAYOUT__LAYOUT_MASK;
        psd_reply_header(s, &h, rep);
        return;
    }
    size_t bytes = (size_t)count * ps_dtype_size(req->dtype);
    /* The reply points into the table when the sender copies it at once
     * (a frame this small), or it is lent (a later write copies the table
     * first); otherwise it gets a buffer of its own. */
    rep->vals_borrowed = req->dtype == PS__DTYPE__DTYPE_F32 && bytes < PS_ZEROCOPY_BYTES_MIN;
    if (rep->vals_borrowed || (lend_ok(t, req, bytes) &&
                               (rep->lent = psd_table_lend(t, offset, offset + count)) != NULL)) {
        rep->vals = (void *)w;
        rep->vals_bytes = bytes;
        psd_reply_header(s, &h, rep);
        return;
    }
    void *out = aligned_alloc(64, (bytes + 63u) & ~(size_t)63u);
    if (out == NULL) {
        psd_reply_errorf(s, req, PS_ENOMEM, rep, "%s: cannot allocate %zu reply bytes",
                         ps_op_name(req->op), bytes);
        return;
    }
    if (req->dtype == PS__DTYPE__DTYPE_F32)
        memcpy(out, w, bytes);
    else /* the table is f32; only the wire is 16-bit */
        ps_f32_to_half_n(req->dtype, w, out, (size_t)count);
    rep->vals = out;
    rep->vals_bytes = bytes;
    psd_reply_header(s, &h, rep);
}

int psd_region_part(struct psd *s, const struct ps_frame *route, const Ps__Header *req,
                    uint32_t shm, uint32_t bit, uint64_t off, unsigned char **p,
                    struct psd_reply *rep)
{
    uint64_t bytes = req->count * (bit == PS_SHM_KEYS ? sizeof(uint64_t) : sizeof(float));
    return psd_region_bytes(s, route, req, shm, bit, off, bytes, p, rep);
}

int psd_region_bytes(struct psd *s, const struct ps_frame *route, const Ps__Header *req,
                     uint32_t shm, uint32_t bit, uint64_t off, uint64_t bytes, unsigned char **p,
                     struct psd_reply *rep)
{
    *p = NULL;
    if (!(shm & bit))
        return 0;
    size_t size = 0;
    int rc = psd_regions_at(s->shm, route->data, route->size, off, bytes, (uint64_t)ps_mono_ms(), p,
                            &size);
    if (rc == PS_ESHM)
        psd_reply_errorf(
            s, req, rc, rep,
            "%s: this connection has no shared memory region (none was bound, or it was "
            "dropped): send the values in frames",
            ps_op_name(req->op));
    else if (rc != 0)
        psd_reply_errorf(
            s, req, rc, rep,
            "%s: shared-memory %s [%llu, +%llu) is past the end of the region (%zu bytes)",
            ps_op_name(req->op),
            bit == PS_SHM_IN     ? "values"
            : bit == PS_SHM_KEYS ? "keys"
                                 : "reply",
            (unsigned long long)off, (unsigned long long)bytes, size);
    return rc;
}
