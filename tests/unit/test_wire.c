/* Wire codec: round trips, every malformed case of the shared table, and
 * boundaries (at a limit and one past it). */
#include "cases.h"
#include "header_diff.h"

#include "ps_err.h"
#include "ps_limits.h"
#include "ps_header.h"
#include "ps_wire.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static unsigned char arena_buf[PS_ARENA_BYTES_SERVER];

static int decode(struct case_msg *m, enum ps_wire_dir dir, struct ps_wire_msg *out, char *err)
{
    static struct ps_arena a;
    ps_arena_init(&a, arena_buf, sizeof arena_buf);
    struct ps_frame f[CASE_FRAMES_MAX];
    for (size_t i = 0; i < m->nframes; i++) {
        f[i].data = m->data[i];
        f[i].size = m->size[i];
    }
    return ps_wire_decode(&a, f, m->nframes, dir, CASE_MAX_MESSAGE_BYTES, out, err, 256);
}

static void test_roundtrip_push(void **state)
{
    (void)state;
    struct case_msg m;
    assert_int_equal(case_msg_alloc(&m), 0);
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_PUSH);
    h.request_id = UINT64_C(0xfedcba9876543210);
    h.worker_id = 4095;
    h.table_id = 17;
    h.clock = 123456789;
    h.offset = 1000;
    h.count = 250;
    int64_t n = ps_wire_header_pack(&h, m.data[0], CASE_FRAME_BYTES_MAX);
    assert_true(n > 0);
    m.size[0] = (size_t)n;
    float *v = (float *)m.data[1];
    for (int i = 0; i < 250; i++)
        v[i] = (float)i * 0.5f;
    m.size[1] = 1000;
    m.nframes = 2;
    struct ps_wire_msg out;
    char err[256];
    assert_int_equal(decode(&m, PS_WIRE_REQUEST, &out, err), 0);
    assert_int_equal(out.hdr->op, PS__OP__OP_PUSH);
    assert_true(out.hdr->request_id == h.request_id);
    assert_int_equal(out.hdr->worker_id, 4095);
    assert_int_equal(out.hdr->table_id, 17);
    assert_int_equal(out.hdr->clock, 123456789);
    assert_int_equal(out.hdr->offset, 1000);
    assert_int_equal(out.hdr->count, 250);
    assert_ptr_equal(out.vals, m.data[1]); /* zero-copy: points into the frame */
    assert_int_equal(out.vals_bytes, 1000);
    assert_null(out.keys);
    case_msg_free(&m);
}

static void test_roundtrip_create_and_reply(void **state)
{
    (void)state;
    struct case_msg m;
    assert_int_equal(case_msg_alloc(&m), 0);
    Ps__Header h;
    Ps__TableSpec s;
    ps__table_spec__init(&s);
    s.name = "fc2.bias";
    s.size = 128;
    s.optimizer = PS__OPTIMIZER_KIND__OPT_ADAM;
    s.lr = 1e-3f;
    s.beta1 = 0.9f;
    s.beta2 = 0.999f;
    s.eps = 1e-8f;
    s.init = PS__INIT_KIND__INIT_NORMAL;
    s.init_scale = 0.05f;
    s.seed = 99;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &s;
    m.size[0] = (size_t)ps_wire_header_pack(&h, m.data[0], CASE_FRAME_BYTES_MAX);
    m.nframes = 1;
    struct ps_wire_msg out;
    char err[256];
    assert_int_equal(decode(&m, PS_WIRE_REQUEST, &out, err), 0);
    assert_string_equal(out.hdr->spec->name, "fc2.bias");
    assert_int_equal(out.hdr->spec->optimizer, PS__OPTIMIZER_KIND__OPT_ADAM);
    assert_true(out.hdr->spec->beta2 == 0.999f);
    assert_int_equal(out.hdr->spec->seed, 99);

    /* An error reply decodes with its status and text, and needs 1 frame. */
    Ps__Header r;
    ps_wire_header_init(&r, PS__OP__OP_PULL);
    r.status = PS_ERANGE;
    r.error = "outside";
    m.size[0] = (size_t)ps_wire_header_pack(&r, m.data[0], CASE_FRAME_BYTES_MAX);
    assert_int_equal(decode(&m, PS_WIRE_REPLY, &out, err), 0);
    assert_int_equal(out.hdr->status, PS_ERANGE);
    assert_string_equal(out.hdr->error, "outside");
    /* A reply status that is not one of our codes is rejected. */
    r.status = -999;
    m.size[0] = (size_t)ps_wire_header_pack(&r, m.data[0], CASE_FRAME_BYTES_MAX);
    assert_int_equal(decode(&m, PS_WIRE_REPLY, &out, err), PS_EPROTO);
    case_msg_free(&m);
}

static void test_bad_cases(void **state)
{
    (void)state;
    size_t checked = 0;
    for (size_t i = 0; i < bad_cases_count; i++) {
        const struct bad_case *bc = &bad_cases[i];
        struct case_msg m;
        assert_int_equal(case_msg_alloc(&m), 0);
        bc->build(&m);
        struct ps_wire_msg out;
        char err[256];
        int rc = decode(&m, PS_WIRE_REQUEST, &out, err);
        if (bc->server_only) {
            /* The decoder must not reject what only server state can judge. */
            if (rc != 0)
                fail_msg("case '%s': decoder rejected it: %s", bc->name, err);
        } else {
            if (rc != bc->expect)
                fail_msg("case '%s': got %s, expected %s (%s)", bc->name, ps_err_name(rc),
                         ps_err_name(bc->expect), err);
            assert_true(strlen(err) > 0);
            checked++;
        }
        case_msg_free(&m);
    }
    assert_true(checked >= 20);
}

static void test_header_limit_boundary(void **state)
{
    (void)state;
    struct case_msg m;
    assert_int_equal(case_msg_alloc(&m), 0);
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_HELLO);
    m.size[0] = (size_t)ps_wire_header_pack(&h, m.data[0], CASE_FRAME_BYTES_MAX);
    m.nframes = 1;
    struct ps_wire_msg out;
    char err[256];
    /* At the limit the size check passes; the zero padding then fails to
     * parse (field number 0), which is a different error. */
    m.size[0] = PS_HEADER_BYTES_MAX;
    assert_int_equal(decode(&m, PS_WIRE_REQUEST, &out, err), PS_EPROTO);
    m.size[0] = PS_HEADER_BYTES_MAX + 1;
    assert_int_equal(decode(&m, PS_WIRE_REQUEST, &out, err), PS_ELIMIT);
    case_msg_free(&m);
}

/* Packing: every scalar at its widest and long strings, into a buffer of
 * exactly the packed size (packs), one byte less (refused, nothing
 * written past it), and one far larger (the path without protobuf-c's size
 * pass); each result unpacks to the same fields. */
static void test_header_pack_widest(void **state)
{
    (void)state;
    static char error[PS_ERROR_TEXT_MAX], ep[200];
    memset(error, 'e', sizeof error - 1);
    memset(ep, 'p', sizeof ep - 1);
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_PUSH_PULL);
    h.version = UINT32_MAX;
    h.op = (Ps__Op)-1; /* a negative enum: a 10-byte varint */
    h.request_id = h.clock = h.offset = h.count = h.session = h.rows = h.instance = UINT64_MAX;
    h.worker_id = h.table_id = h.dim = h.shard = h.shards = UINT32_MAX;
    h.dtype = (Ps__DType)-1;
    h.layout = (Ps__Layout)-1;
    h.status = INT32_MIN;
    h.nonzero_only = h.duplicate = h.stale = 1;
    h.error = error;
    h.detail = error;
    h.local_endpoint = ep;
    size_t need = ps__header__get_packed_size(&h);
    static uint8_t buf[2 * PS_ERROR_TEXT_MAX + 1024];
    assert_true(need + 1 < sizeof buf);
    memset(buf, 0xa5, sizeof buf);
    assert_int_equal(ps_wire_header_pack(&h, buf, need - 1), PS_ELIMIT);
    assert_int_equal(buf[0], 0xa5);
    assert_int_equal(ps_wire_header_pack(&h, buf, need), (int64_t)need);
    assert_int_equal(buf[need], 0xa5);
    for (int pass = 0; pass < 2; pass++) {
        int64_t n = ps_wire_header_pack(&h, buf, pass ? sizeof buf : need);
        assert_int_equal(n, (int64_t)need);
        Ps__Header *u = ps__header__unpack(NULL, (size_t)n, buf);
        assert_non_null(u);
        assert_true(u->request_id == UINT64_MAX && u->instance == UINT64_MAX);
        assert_int_equal(u->status, INT32_MIN);
        assert_int_equal((int)u->op, -1);
        assert_string_equal(u->error, error);
        assert_string_equal(u->local_endpoint, ep);
        ps__header__free_unpacked(u, NULL);
    }
}

/* ---- the header fast path against protobuf-c ---------------------------- */

static uint64_t rng_next(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* A value for a field: often zero (not sent), small, the widest, or any. */
static uint64_t rng_field(uint64_t *x)
{
    switch (rng_next(x) % 5) {
    case 0:
    case 1:
        return 0;
    case 2:
        return rng_next(x) % 300;
    case 3:
        return UINT64_MAX;
    default:
        return rng_next(x) >> (rng_next(x) % 64);
    }
}

/* The replication fields (32 on: OP_FOLLOW and OP_REPLICATE's), which
 * the fast path declines and protobuf-c packs. */
#define HEADER_FAST_FIELDS_MAX 31u

/* A header with every scalar field random, set through protobuf-c's
 * descriptor (so a field added to ps.proto is covered, and fails the
 * tests until the fast path knows it or declines it); strings only when
 * `strings`. The replication fields stay 0. */
static void random_header(Ps__Header *h, uint64_t *x, int strings, char str[][24])
{
    ps_wire_header_init(h, PS__OP__OP_NONE);
    const ProtobufCMessageDescriptor *d = &ps__header__descriptor;
    int nstr = 0;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        char *member = (char *)h + f->offset;
        uint64_t v = rng_field(x);
        if (f->id > HEADER_FAST_FIELDS_MAX)
            continue;
        switch (f->type) {
        case PROTOBUF_C_TYPE_MESSAGE:
            break;
        case PROTOBUF_C_TYPE_STRING: {
            assert_true(nstr < 4);
            char *s = str[nstr++];
            size_t len = rng_next(x) % 24;
            for (size_t j = 0; j < len; j++)
                s[j] = (char)('a' + rng_next(x) % 26);
            s[len] = '\0';
            if (strings)
                *(char **)member = rng_next(x) % 4 == 0 ? NULL : s;
            break;
        }
        case PROTOBUF_C_TYPE_BOOL: /* 2: still true */
            *(protobuf_c_boolean *)member = (protobuf_c_boolean)(v % 3);
            break;
        case PROTOBUF_C_TYPE_UINT64:
        case PROTOBUF_C_TYPE_INT64:
        case PROTOBUF_C_TYPE_SINT64:
            memcpy(member, &v, 8);
            break;
        case PROTOBUF_C_TYPE_UINT32:
        case PROTOBUF_C_TYPE_INT32:
        case PROTOBUF_C_TYPE_SINT32:
        case PROTOBUF_C_TYPE_ENUM: { /* negative enums too */
            uint32_t w = (uint32_t)v;
            memcpy(member, &w, 4);
            break;
        }
        default:
            fail_msg("ps.Header field %s has a type this test does not set", f->name);
        }
    }
}

/* Packing: the fast path writes protobuf-c's bytes, for any scalars and
 * strings, and declines a buffer that might be too small, writing nothing. */
static void test_header_fast_pack_same_bytes(void **state)
{
    (void)state;
    uint64_t x = 0x9e3779b97f4a7c15u;
    static uint8_t fast[PS_HEADER_BYTES_MAX], ref[PS_HEADER_BYTES_MAX];
    char str[4][24];
    for (int it = 0; it < 20000; it++) {
        Ps__Header h;
        random_header(&h, &x, it % 2, str);
        size_t need = ps__header__get_packed_size(&h);
        assert_int_equal(ps__header__pack(&h, ref), need);
        assert_int_equal(ps_header_pack_fast(&h, fast, sizeof fast), (int64_t)need);
        assert_memory_equal(fast, ref, need);
        size_t cap = rng_next(&x) % (need + 1);
        memset(fast, 0xa5, sizeof fast);
        int64_t n = ps_header_pack_fast(&h, fast, cap);
        assert_true(n == -1 || n == (int64_t)need);
        for (size_t i = n == -1 ? 0 : (size_t)n; i < sizeof fast; i++)
            assert_int_equal(fast[i], 0xa5);
    }
    /* declined: a nested message (protobuf-c packs those) */
    Ps__Header h;
    Ps__TableSpec spec;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    case_table_spec(&spec, "t", 10);
    h.spec = &spec;
    assert_int_equal(ps_header_pack_fast(&h, fast, sizeof fast), -1);
    /* declined: each field past the fast path's (replication,
     * pipelines), found through the descriptor, so a field added to
     * ps.proto that the fast path would drop fails here; protobuf-c packs
     * it, and it comes back */
    const ProtobufCMessageDescriptor *d = &ps__header__descriptor;
    int past = 0;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->id <= HEADER_FAST_FIELDS_MAX)
            continue;
        past++;
        ps_wire_header_init(&h, PS__OP__OP_REPLICATE);
        char *member = (char *)&h + f->offset;
        static uint64_t dims[2] = {3, 5};
        static uint8_t route[3] = {1, 2, 3};
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            assert_int_equal(f->type, PROTOBUF_C_TYPE_UINT64);
            *(size_t *)((char *)&h + f->quantifier_offset) = 2;
            *(uint64_t **)member = dims;
        } else if (f->type == PROTOBUF_C_TYPE_STRING) {
            *(const char **)member = "key";
        } else if (f->type == PROTOBUF_C_TYPE_BYTES) {
            ((ProtobufCBinaryData *)member)->data = route;
            ((ProtobufCBinaryData *)member)->len = sizeof route;
        } else if (f->type == PROTOBUF_C_TYPE_BOOL) {
            *(protobuf_c_boolean *)member = 1;
        } else if (f->type == PROTOBUF_C_TYPE_UINT64) {
            *(uint64_t *)member = 9;
        } else if (f->type == PROTOBUF_C_TYPE_UINT32 || f->type == PROTOBUF_C_TYPE_ENUM) {
            *(uint32_t *)member = 2;
        } else {
            fail_msg("ps.Header field %s has a type this test does not set", f->name);
        }
        if (ps_header_pack_fast(&h, fast, sizeof fast) != -1)
            fail_msg("the fast path packs field %s (%u), which it would drop", f->name, f->id);
        int64_t n = ps_wire_header_pack(&h, fast, sizeof fast);
        assert_true(n > 0);
        assert_int_equal((size_t)n, ps__header__get_packed_size(&h));
        Ps__Header *back = ps__header__unpack(NULL, (size_t)n, fast);
        assert_non_null(back);
        uint8_t again[PS_HEADER_BYTES_MAX];
        assert_int_equal(ps__header__pack(back, again), (size_t)n);
        assert_memory_equal(again, fast, (size_t)n);
        ps__header__free_unpacked(back, NULL);
    }
    assert_true(past >= 11); /* replication's six, the pipelines' five */
}

/* The fast path's bound: a buffer of PS_HEADER_FIELDS_BYTES_MAX plus the
 * strings' lengths takes the header, one byte less declines it (and
 * ps_wire_header_pack then packs it through protobuf-c, to the same
 * bytes). Without strings, and with them. */
static void test_header_fast_bound(void **state)
{
    (void)state;
    static uint8_t buf[PS_HEADER_BYTES_MAX], ref[PS_HEADER_BYTES_MAX];
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_BATCH); /* as the client's batch envelope */
    h.worker_id = 7;
    h.count = 3;
    for (int strings = 0; strings < 2; strings++) {
        if (strings) {
            h.error = "what was wrong";
            h.local_endpoint = "ipc:///run/psd/0";
        }
        size_t cap =
            PS_HEADER_FIELDS_BYTES_MAX + (strings ? strlen(h.error) + strlen(h.local_endpoint) : 0);
        size_t need = ps__header__pack(&h, ref);
        assert_int_equal(ps_header_pack_fast(&h, buf, cap), (int64_t)need);
        assert_memory_equal(buf, ref, need);
        assert_int_equal(ps_header_pack_fast(&h, buf, cap - 1), -1);
        assert_int_equal(ps_wire_header_pack(&h, buf, cap - 1), (int64_t)need);
        assert_memory_equal(buf, ref, need);
    }
}

/* Unpacking: every header it packs, the fast path unpacks to protobuf-c's
 * fields; then the same bytes broken in random ways: whatever the fast
 * path takes, protobuf-c takes and reads the same. Both the taken and the
 * declined branches must be exercised. */
static void test_header_fast_unpack_same_fields(void **state)
{
    (void)state;
    static unsigned char abuf[PS_ARENA_BYTES_SERVER];
    struct ps_arena a;
    ps_arena_init(&a, abuf, sizeof abuf);
    uint64_t x = 0x2545f4914f6cdd1du;
    uint8_t buf[PS_HEADER_BYTES_MAX + 64];
    char str[4][24];
    int taken_total = 0, declined_valid = 0;
    for (int it = 0; it < 20000; it++) {
        Ps__Header h;
        random_header(&h, &x, it % 4 == 0, str);
        size_t n = ps__header__pack(&h, buf);
        int taken;
        assert_int_equal(header_diff(&a, buf, n, &taken), 0);
        if (it % 4 != 0)
            assert_true(taken); /* no strings: the fast path's own output */
        /* break it: flip a byte, cut it short, or append a field */
        size_t m = n;
        switch (rng_next(&x) % 4) {
        case 0:
            if (n > 0)
                buf[rng_next(&x) % n] ^= (uint8_t)(1u << rng_next(&x) % 8);
            break;
        case 1:
            m = n > 0 ? rng_next(&x) % n : 0;
            break;
        case 2: /* a field again or an unknown one, with a long varint, maybe cut */
            buf[n] = (uint8_t)(rng_next(&x) % 256);
            for (int i = 1; i < 10; i++)
                buf[n + i] = 0xff;
            buf[n + 10] = (uint8_t)(rng_next(&x) % 0x80);
            m = n + 11 - rng_next(&x) % 10;
            break;
        default:
            for (size_t i = 0; i < 4; i++)
                buf[n + i] = (uint8_t)rng_next(&x);
            m = n + 4;
            break;
        }
        assert_int_equal(header_diff(&a, buf, m, &taken), 0);
        taken_total += taken;
        if (!taken) {
            Ps__Header *ref = ps__header__unpack(NULL, m, buf);
            declined_valid += ref != NULL;
            if (ref != NULL)
                ps__header__free_unpacked(ref, NULL);
        }
    }
    assert_true(taken_total > 1000);
    assert_true(declined_valid > 100);
}

/* Bytes the fast path declines although protobuf-c takes them, each by
 * design (protobuf-c's answer is the one used). */
static void test_header_fast_declines(void **state)
{
    (void)state;
    static unsigned char abuf[PS_ARENA_BYTES_SERVER];
    struct ps_arena a;
    ps_arena_init(&a, abuf, sizeof abuf);
    static const struct {
        const char *name;
        uint8_t bytes[16];
        size_t len;
    } cases[] = {
        {"a field twice (protobuf-c: the last wins)", {0x08, 0x01, 0x08, 0x02}, 4},
        {"a string field", {0x6a, 0x01, 'x'}, 3},
        {"an unknown field number", {0xf8, 0x03, 0x01}, 3},
        {"a 10-byte varint past 64 bits",
         {0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f},
         11},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ps_arena_reset(&a);
        assert_null(ps_header_unpack_fast(&a.pa, cases[i].len, cases[i].bytes));
        assert_int_equal(a.used, 0); /* nothing allocated when declining */
        Ps__Header *ref = ps__header__unpack(NULL, cases[i].len, cases[i].bytes);
        if (ref == NULL)
            fail_msg("protobuf-c refused the case \"%s\"", cases[i].name);
        ps__header__free_unpacked(ref, NULL);
    }
    /* a tag in more bytes than it needs: both read field 1 */
    static const uint8_t long_tag[] = {0x88, 0x00, 0x05};
    int taken;
    assert_int_equal(header_diff(&a, long_tag, sizeof long_tag, &taken), 0);
    assert_true(taken);
    /* and what it takes, as a request through the decoder */
    uint8_t push[] = {0x08, PS_PROTOCOL_VERSION, 0x10, PS__OP__OP_PULL, 0x50, 0x04, 0x58, 0x01};
    struct ps_frame f = {push, sizeof push};
    struct ps_wire_msg out;
    char err[256];
    assert_int_equal(ps_wire_decode(&a, &f, 1, PS_WIRE_REQUEST, 1u << 20, &out, err, sizeof err),
                     0);
    assert_int_equal(out.hdr->op, PS__OP__OP_PULL);
    assert_int_equal(out.hdr->count, 4);
    assert_string_equal(out.hdr->error, "");
    assert_null(out.hdr->spec);
}

static void test_value_limit_boundary(void **state)
{
    (void)state;
    struct case_msg m;
    assert_int_equal(case_msg_alloc(&m), 0);
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_PULL);
    h.count = CASE_MAX_MESSAGE_BYTES / 4; /* exactly the limit */
    m.size[0] = (size_t)ps_wire_header_pack(&h, m.data[0], CASE_FRAME_BYTES_MAX);
    m.nframes = 1;
    struct ps_wire_msg out;
    char err[256];
    assert_int_equal(decode(&m, PS_WIRE_REQUEST, &out, err), 0);
    h.count++;
    m.size[0] = (size_t)ps_wire_header_pack(&h, m.data[0], CASE_FRAME_BYTES_MAX);
    assert_int_equal(decode(&m, PS_WIRE_REQUEST, &out, err), PS_ELIMIT);
    case_msg_free(&m);
}

static void test_arena_exhaustion(void **state)
{
    (void)state;
    /* A header that needs more arena than there is fails cleanly. */
    unsigned char small[32];
    struct ps_arena a;
    ps_arena_init(&a, small, sizeof small);
    Ps__Header h;
    Ps__TableSpec s;
    ps__table_spec__init(&s);
    s.name = "a-rather-long-table-name-that-will-not-fit";
    s.size = 1;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &s;
    uint8_t buf[256];
    int64_t n = ps_wire_header_pack(&h, buf, sizeof buf);
    assert_true(n > 0);
    struct ps_frame f = {buf, (size_t)n};
    struct ps_wire_msg out;
    char err[256];
    assert_int_equal(ps_wire_decode(&a, &f, 1, PS_WIRE_REQUEST, 1u << 20, &out, err, sizeof err),
                     PS_EPROTO);
}

static void test_keys_unaligned(void **state)
{
    (void)state;
    unsigned char buf[17];
    uint64_t k = UINT64_C(0x0102030405060708);
    for (int i = 0; i < 8; i++)
        buf[1 + i] = (unsigned char)(k >> (8 * i));
    assert_true(ps_wire_key(buf + 1, 0) == k);
}

/* The key order check, at and around its block boundaries and in every
 * lane of the AVX2 loop, with and without it, keys as unsigned (the top
 * bit set), and through the decoder (an unordered key past the first
 * block is named). */
static void test_keys_unordered(void **state)
{
    (void)state;
    enum { N = 9000 };
    static uint64_t k[N];
    static unsigned char odd[N * 8 + 3]; /* the same keys 3 bytes off alignment */
    size_t (*const check[])(const void *, size_t) = {ps_wire_keys_unordered,
                                                     ps_wire_keys_unordered_plain};
    for (size_t f = 0; f < sizeof check / sizeof check[0]; f++) {
        for (size_t i = 0; i < N; i++)
            k[i] = 3 * i + 1;
        assert_int_equal(check[f](k, 0), 0);
        assert_int_equal(check[f](k, 1), 1);
        assert_int_equal(check[f](k, N), N);
        const size_t at[] = {1, 2, 3, 4, 5, 6, 4095, 4096, 4097, 4098, 4099, 8192, N - 2, N - 1};
        for (size_t a = 0; a < sizeof at / sizeof at[0]; a++) {
            size_t i = at[a];
            uint64_t keep = k[i];
            k[i] = k[i - 1]; /* a duplicate */
            assert_int_equal(check[f](k, N), i);
            memcpy(odd + 3, k, sizeof k);
            assert_int_equal(check[f](odd + 3, N), i);
            k[i] = k[i - 1] - 1; /* a step back */
            assert_int_equal(check[f](k, N), i);
            if (i + 1 < N) { /* a later bad pair is not the first */
                k[i + 1] = 0;
                assert_int_equal(check[f](k, N), i);
                k[i + 1] = 3 * (i + 1) + 1;
            }
            k[i] = keep;
            assert_int_equal(check[f](k + 1, i), i); /* another lane phase, any length */
        }
        /* across 2^63: in order as unsigned, out of order as signed */
        for (size_t i = 0; i < 64; i++)
            k[i] = (UINT64_C(1) << 63) - 32 + i;
        assert_int_equal(check[f](k, 64), 64);
        k[40] = UINT64_MAX;
        assert_int_equal(check[f](k, 64), 41);
        k[40] = 5;
        assert_int_equal(check[f](k, 64), 40);
    }
    for (size_t i = 0; i < N; i++)
        k[i] = 3 * i + 1;
    assert_int_equal(ps_wire_keys_unordered(k, N), N);
    k[5000] = k[4999];
    struct case_msg m;
    assert_int_equal(case_msg_alloc(&m), 0); /* frames of CASE_FRAME_BYTES_MAX hold N keys */
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_PUSH);
    h.layout = PS__LAYOUT__LAYOUT_KEYS;
    h.table_id = 1;
    h.count = N;
    case_put_header(&m, &h);
    memcpy(m.data[1], k, sizeof k);
    case_add_frame(&m, sizeof k);
    case_add_frame(&m, N * 4);
    struct ps_wire_msg out;
    char err[256];
    assert_int_equal(decode(&m, PS_WIRE_REQUEST, &out, err), PS_EPROTO);
    assert_non_null(strstr(err, "key[5000]=14998 after 14998"));
    case_msg_free(&m);
}

/* A masked pull reply (LAYOUT_MASK: the nonzeros; LAYOUT_CHANGED: what
 * was written since the request's version): bitmap of count bits, then
 * the set bits' values. */
static int masked_reply(Ps__Layout layout, uint64_t count, const uint8_t *mask, size_t mask_bytes,
                        size_t nvals)
{
    struct case_msg m;
    assert_int_equal(case_msg_alloc(&m), 0);
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_PULL);
    h.layout = layout;
    h.count = count;
    case_put_header(&m, &h);
    memcpy(m.data[1], mask, mask_bytes);
    case_add_frame(&m, mask_bytes);
    case_add_frame(&m, nvals * 4);
    struct ps_wire_msg out;
    char err[256];
    int rc = decode(&m, PS_WIRE_REPLY, &out, err);
    if (rc == 0) {
        assert_ptr_equal(out.mask, m.data[1]);
        assert_int_equal(out.vals_bytes, nvals * 4);
    }
    case_msg_free(&m);
    return rc;
}

static void test_masked_replies(void **state)
{
    (void)state;
    const uint8_t mask[2] = {0x81, 0x02}; /* bits 0, 7, 9 of 10 */
    const Ps__Layout layouts[2] = {PS__LAYOUT__LAYOUT_MASK, PS__LAYOUT__LAYOUT_CHANGED};
    for (int l = 0; l < 2; l++) {
        Ps__Layout ly = layouts[l];
        assert_int_equal(masked_reply(ly, 10, mask, 2, 3), 0);
        assert_int_equal(masked_reply(ly, 10, mask, 2, 2), PS_ESIZE); /* one value short */
        assert_int_equal(masked_reply(ly, 10, mask, 2, 4), PS_ESIZE); /* one too many */
        assert_int_equal(masked_reply(ly, 10, mask, 1, 2), PS_ESIZE); /* bitmap too short */
        assert_int_equal(masked_reply(ly, 9, mask, 2, 3), PS_EPROTO); /* bit 9 past count 9 */
        assert_int_equal(masked_reply(ly, 16, mask, 2, 3), 0);        /* whole bytes */
        /* requests cannot use the reply-only layouts */
        struct case_msg m;
        assert_int_equal(case_msg_alloc(&m), 0);
        Ps__Header h;
        ps_wire_header_init(&h, PS__OP__OP_PULL);
        h.layout = ly;
        h.count = 4;
        case_put_header(&m, &h);
        struct ps_wire_msg out;
        char err[256];
        assert_int_equal(decode(&m, PS_WIRE_REQUEST, &out, err), PS_EPROTO);
        case_msg_free(&m);
    }
}

/* An OP_ROWS reply: count keys, then count x dim f32 values. */
static int rows_reply(uint64_t count, uint32_t dim, Ps__DType dtype, size_t kbytes, size_t vbytes)
{
    struct case_msg m;
    assert_int_equal(case_msg_alloc(&m), 0);
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_ROWS);
    h.count = count;
    h.dim = dim;
    h.dtype = dtype;
    h.layout = PS__LAYOUT__LAYOUT_KEYS;
    case_put_header(&m, &h);
    uint64_t k = 5; /* any order: the shard's */
    for (size_t i = 0; i + 8 <= kbytes; i += 8, k = k * 7 % 1000)
        memcpy(m.data[1] + i, &k, 8);
    case_add_frame(&m, kbytes);
    case_add_frame(&m, vbytes);
    struct ps_wire_msg out;
    char err[256];
    int rc = decode(&m, PS_WIRE_REPLY, &out, err);
    if (rc == 0) {
        assert_ptr_equal(out.keys, m.data[1]);
        assert_int_equal(out.vals_bytes, vbytes);
    } else {
        assert_true(strlen(err) > 0);
    }
    case_msg_free(&m);
    return rc;
}

static void test_rows_replies(void **state)
{
    (void)state;
    const Ps__DType f32 = PS__DTYPE__DTYPE_F32;
    assert_int_equal(rows_reply(3, 4, f32, 24, 48), 0);
    assert_int_equal(rows_reply(0, 4, f32, 0, 0), 0); /* past the last row: empty */
    assert_int_equal(rows_reply(3, 4, f32, 16, 48), PS_ESIZE);
    assert_int_equal(rows_reply(3, 4, f32, 24, 44), PS_ESIZE);
    assert_int_equal(rows_reply(3, 0, f32, 24, 0), PS_ELIMIT);
    assert_int_equal(rows_reply(3, PS_SPARSE_DIM_MAX + 1, f32, 24, 48), PS_ELIMIT);
    assert_int_equal(rows_reply(PS_ROWS_PAGE_MAX + 1, 1, f32, 8, 4), PS_ELIMIT);
    assert_int_equal(rows_reply(3, 4, PS__DTYPE__DTYPE_F16, 24, 24), PS_EDTYPE);
}

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(ps_strerror(PS_ERANGE), "range outside the table");
    assert_string_equal(ps_err_name(PS_ETIMEDOUT), "PS_ETIMEDOUT");
    assert_string_equal(ps_strerror(-12345), "unknown error");
    assert_int_equal(ps_dtype_size(PS__DTYPE__DTYPE_BF16), 2);
    assert_int_equal(ps_dtype_size(9), 0);
    assert_string_equal(ps_op_name(PS__OP__OP_PUSH_PULL), "push_pull");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_push),
        cmocka_unit_test(test_roundtrip_create_and_reply),
        cmocka_unit_test(test_bad_cases),
        cmocka_unit_test(test_header_limit_boundary),
        cmocka_unit_test(test_header_pack_widest),
        cmocka_unit_test(test_header_fast_pack_same_bytes),
        cmocka_unit_test(test_header_fast_bound),
        cmocka_unit_test(test_header_fast_unpack_same_fields),
        cmocka_unit_test(test_header_fast_declines),
        cmocka_unit_test(test_value_limit_boundary),
        cmocka_unit_test(test_arena_exhaustion),
        cmocka_unit_test(test_keys_unaligned),
        cmocka_unit_test(test_keys_unordered),
        cmocka_unit_test(test_masked_replies),
        cmocka_unit_test(test_rows_replies),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
