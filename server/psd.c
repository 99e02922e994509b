/* Request dispatch: decode, check against server state, apply, reply. */
#include "psd.h"

#include "ps_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

int psd_init(struct psd *s, struct ps_log *log, uint32_t shard, uint32_t shards,
             uint64_t value_bytes_max)
{
    memset(s, 0, sizeof *s);
    s->log = log;
    s->shard = shard;
    s->shards = shards;
    s->value_bytes_max = value_bytes_max;
    s->start_ns = uv_hrtime();
    s->arena_buf = malloc(PS_ARENA_BYTES_SERVER);
    if (s->arena_buf == NULL)
        return PS_ENOMEM;
    ps_arena_init(&s->arena, s->arena_buf, PS_ARENA_BYTES_SERVER);
    return 0;
}

void psd_fini(struct psd *s)
{
    for (uint32_t i = 0; i < s->ntables; i++)
        psd_table_destroy(s->tables[i]);
    s->ntables = 0;
    free(s->arena_buf);
    free(s->scratch);
    s->arena_buf = NULL;
    s->scratch = NULL;
}

/* ---- replies ---------------------------------------------------------- */

static void reply_header(struct psd *s, const Ps__Header *h, struct psd_reply *rep)
{
    int64_t n = ps_wire_header_pack(h, s->hdr_buf, sizeof s->hdr_buf);
    if (n < 0) {
        /* Our own reply outgrew the header limit (e.g. stats of many tables):
         * fall back to a bare error so the peer still gets an answer. */
        Ps__Header e;
        ps_wire_header_init(&e, h->op);
        e.request_id = h->request_id;
        e.status = PS_ELIMIT;
        e.error = "reply header exceeds the header size limit";
        n = ps_wire_header_pack(&e, s->hdr_buf, sizeof s->hdr_buf);
        free(rep->vals);
        rep->vals = NULL;
        rep->vals_bytes = 0;
    }
    rep->hdr = s->hdr_buf;
    rep->hdr_len = n < 0 ? 0 : (size_t)n;
}

static void reply_init(Ps__Header *out, const Ps__Header *req)
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
static void reply_error(struct psd *s, const Ps__Header *req, int code, const char *text,
                        struct psd_reply *rep)
{
    Ps__Header h;
    reply_init(&h, req);
    h.status = code;
    char buf[PS_ERROR_TEXT_MAX];
    snprintf(buf, sizeof buf, "%s", text);
    h.error = buf;
    s->ctr.errors++;
    s->errors_logged++;
    if (s->errors_logged <= 20 || s->errors_logged % 1000 == 0)
        PS_LOG(s->log, PS_LOG_WARN, "S0200",
               "bad request from worker %u (%s): %s [%s] (%llu so far)", req ? req->worker_id : 0,
               req ? ps_op_name(req->op) : "?", buf, ps_err_name(code),
               (unsigned long long)s->ctr.errors);
    free(rep->vals);
    rep->vals = NULL;
    rep->vals_bytes = 0;
    reply_header(s, &h, rep);
}

static void reply_errorf(struct psd *s, const Ps__Header *req, int code, struct psd_reply *rep,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void reply_errorf(struct psd *s, const Ps__Header *req, int code, struct psd_reply *rep,
                         const char *fmt, ...)
{
    char buf[PS_ERROR_TEXT_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    reply_error(s, req, code, buf, rep);
}

/* ---- ops ---------------------------------------------------------------- */

static void op_hello(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    Ps__Header h;
    reply_init(&h, req);
    h.shard = s->shard;
    h.shards = s->shards;
    PS_LOG(s->log, PS_LOG_DEBUG, "S0300", "hello from worker %u", req->worker_id);
    reply_header(s, &h, rep);
}

static struct psd_table *find_by_name(struct psd *s, const char *name)
{
    for (uint32_t i = 0; i < s->ntables; i++)
        if (strcmp(s->tables[i]->name, name) == 0)
            return s->tables[i];
    return NULL;
}

static void op_create(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    const Ps__TableSpec *spec = req->spec;
    struct psd_table *t = find_by_name(s, spec->name);
    if (t != NULL && !psd_table_same_spec(t, spec)) {
        reply_errorf(s, req, PS_EEXIST, rep,
                     "table '%s' exists with another spec (size %llu, %s, lr %g)", t->name,
                     (unsigned long long)t->size, psd_optimizer_name(t->optimizer), (double)t->lr);
        return;
    }
    if (t == NULL) {
        if (s->ntables >= PS_TABLES_MAX) {
            reply_errorf(s, req, PS_ELIMIT, rep, "table limit of %u reached", PS_TABLES_MAX);
            return;
        }
        int rc = psd_table_create(spec, s->ntables, s->shard, s->shards, &t);
        if (rc != 0) {
            reply_errorf(s, req, rc, rep, "cannot allocate table '%s' of %llu elements", spec->name,
                         (unsigned long long)spec->size);
            return;
        }
        s->tables[s->ntables++] = t;
        PS_LOG(s->log, PS_LOG_INFO, "S0310",
               "created table '%s' id %u: %llu elements, this shard [%llu, %llu), %s lr %g",
               t->name, t->id, (unsigned long long)t->size, (unsigned long long)t->lo,
               (unsigned long long)t->hi, psd_optimizer_name(t->optimizer), (double)t->lr);
    }
    Ps__Header h;
    reply_init(&h, req);
    h.table_id = t->id;
    h.offset = t->lo;
    h.count = t->hi - t->lo;
    reply_header(s, &h, rep);
}

/* Server-state checks shared by pull, push and push-pull. */
static struct psd_table *check_range(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    if (req->table_id >= s->ntables) {
        reply_errorf(s, req, PS_ENOTABLE, rep, "%s: no table with id %u (this shard has %u)",
                     ps_op_name(req->op), req->table_id, s->ntables);
        return NULL;
    }
    struct psd_table *t = s->tables[req->table_id];
    if (req->layout != PS__LAYOUT__LAYOUT_RANGE) {
        reply_errorf(s, req, PS_ENOTSUP, rep,
                     "%s: table '%s' is dense; keyed requests need a "
                     "sparse table",
                     ps_op_name(req->op), t->name);
        return NULL;
    }
    if (req->dtype != PS__DTYPE__DTYPE_F32) {
        reply_errorf(s, req, PS_EDTYPE, rep, "%s: dtype %s is not supported, use f32",
                     ps_op_name(req->op), ps_dtype_name(req->dtype));
        return NULL;
    }
    if (req->offset < t->lo || req->offset + req->count > t->hi) {
        reply_errorf(s, req, PS_ERANGE, rep,
                     "%s: [%llu, %llu) is outside shard %u's range [%llu, %llu) of table '%s' "
                     "(size %llu)",
                     ps_op_name(req->op), (unsigned long long)req->offset,
                     (unsigned long long)(req->offset + req->count), s->shard,
                     (unsigned long long)t->lo, (unsigned long long)t->hi, t->name,
                     (unsigned long long)t->size);
        return NULL;
    }
    return t;
}

/* Values as aligned floats: the frame itself when aligned, else a copy. */
static const float *aligned_values(struct psd *s, const struct ps_wire_msg *m)
{
    if (((uintptr_t)m->vals % _Alignof(float)) == 0)
        return m->vals;
    if (m->vals_bytes > s->scratch_cap) {
        float *p = realloc(s->scratch, m->vals_bytes);
        if (p == NULL)
            return NULL;
        s->scratch = p;
        s->scratch_cap = m->vals_bytes;
    }
    memcpy(s->scratch, m->vals, m->vals_bytes);
    return s->scratch;
}

static void op_data(struct psd *s, const struct ps_wire_msg *m, struct psd_reply *rep)
{
    const Ps__Header *req = m->hdr;
    struct psd_table *t = check_range(s, req, rep);
    if (t == NULL)
        return;
    if (req->op != PS__OP__OP_PULL) {
        const float *g = aligned_values(s, m);
        if (g == NULL) {
            reply_errorf(s, req, PS_ENOMEM, rep, "%s: out of memory", ps_op_name(req->op));
            return;
        }
        psd_table_apply(t, req->offset, req->count, g);
        t->pushes++;
    }
    Ps__Header h;
    reply_init(&h, req);
    if (req->op != PS__OP__OP_PUSH) {
        size_t bytes = (size_t)req->count * sizeof(float);
        void *out = aligned_alloc(64, (bytes + 63u) & ~(size_t)63u);
        if (out == NULL) {
            reply_errorf(s, req, PS_ENOMEM, rep, "%s: cannot allocate %zu reply bytes",
                         ps_op_name(req->op), bytes);
            return;
        }
        psd_table_read(t, req->offset, req->count, out);
        t->pulls++;
        rep->vals = out;
        rep->vals_bytes = bytes;
        h.offset = req->offset;
        h.count = req->count;
        h.dim = 1;
        h.dtype = PS__DTYPE__DTYPE_F32;
    }
    reply_header(s, &h, rep);
}

static void op_stats(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    static const size_t cap = PS_TABLES_MAX;
    Ps__TableStats *ts = calloc(cap, sizeof *ts);
    Ps__TableStats **tp = calloc(cap, sizeof *tp);
    if (ts == NULL || tp == NULL) {
        free(ts);
        free(tp);
        reply_errorf(s, req, PS_ENOMEM, rep, "stats: out of memory");
        return;
    }
    for (uint32_t i = 0; i < s->ntables; i++) {
        const struct psd_table *t = s->tables[i];
        ps__table_stats__init(&ts[i]);
        ts[i].name = (char *)t->name;
        ts[i].id = t->id;
        ts[i].size = t->size;
        ts[i].lo = t->lo;
        ts[i].hi = t->hi;
        ts[i].pushes = t->pushes;
        ts[i].pulls = t->pulls;
        ts[i].updates = t->steps;
        tp[i] = &ts[i];
    }
    Ps__Stats st;
    ps__stats__init(&st);
    st.shard = s->shard;
    st.shards = s->shards;
    st.requests = s->ctr.requests;
    st.errors = s->ctr.errors;
    st.bytes_in = s->ctr.bytes_in;
    st.bytes_out = s->ctr.bytes_out;
    st.uptime_s = (double)(uv_hrtime() - s->start_ns) / 1e9;
    st.n_tables = s->ntables;
    st.tables = tp;
    Ps__Header h;
    reply_init(&h, req);
    h.stats = &st;
    reply_header(s, &h, rep);
    free(ts);
    free(tp);
}

void psd_dispatch(struct psd *s, const struct ps_frame *frames, size_t nframes,
                  struct psd_reply *rep)
{
    memset(rep, 0, sizeof *rep);
    s->ctr.requests++;
    for (size_t i = 0; i < nframes && i <= PS_FRAMES_MAX; i++)
        s->ctr.bytes_in += frames[i].size;
    struct ps_wire_msg m;
    char err[PS_ERROR_TEXT_MAX];
    int rc = ps_wire_decode(&s->arena, frames, nframes, PS_WIRE_REQUEST, s->value_bytes_max, &m,
                            err, sizeof err);
    if (rc != 0) {
        reply_error(s, m.hdr, rc, err, rep);
        return;
    }
    const Ps__Header *req = m.hdr;
    s->ctr.by_op[req->op]++;
    switch (req->op) {
    case PS__OP__OP_HELLO:
        op_hello(s, req, rep);
        break;
    case PS__OP__OP_CREATE_TABLE:
        op_create(s, req, rep);
        break;
    case PS__OP__OP_PULL:
    case PS__OP__OP_PUSH:
    case PS__OP__OP_PUSH_PULL:
        op_data(s, &m, rep);
        break;
    case PS__OP__OP_STATS:
        op_stats(s, req, rep);
        break;
    default:
        reply_errorf(s, req, PS_EOP, rep, "unknown op %d", (int)req->op);
        break;
    }
    s->ctr.bytes_out += rep->hdr_len + rep->vals_bytes;
}
