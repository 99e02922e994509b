/* OP_BATCH (ps.proto): the records codec, its limits (at and one past),
 * every malformed envelope the decoder refuses, and an in-process psd
 * answering each request of a batch through its sender, in order, as if
 * it came alone: what may not go in a batch (a hello, a batch, a request
 * that needs frames, bytes that are no header) is refused one by one, and
 * the rest is handled. */
#include "catalog.h"
#include "counters.h"
#include "psd.h"
#include "waits.h"

#include "ps_err.h"
#include "ps_limits.h"
#include "ps_wire.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "inproc.h"

#define SENT_MAX 16

/* What the in-process psd sent through its sender. */
static struct {
    int n;
    uint64_t id[SENT_MAX];
    int status[SENT_MAX];
    size_t vals_bytes[SENT_MAX];
    float first[SENT_MAX];
    uint64_t bytes; /* of every reply sent: header, mask and values */
} sent;

static void capture(void *ctx, const void *route, size_t route_len, struct psd_reply *rep)
{
    (void)ctx;
    assert_int_equal(route_len, 1);
    assert_memory_equal(route, "r", 1);
    assert_true(sent.n < SENT_MAX);
    Ps__Header *h = ps__header__unpack(NULL, rep->hdr_len, rep->hdr);
    assert_non_null(h);
    sent.id[sent.n] = h->request_id;
    sent.status[sent.n] = h->status;
    sent.vals_bytes[sent.n] = rep->vals_bytes;
    sent.bytes += rep->hdr_len + rep->mask_bytes + rep->vals_bytes;
    sent.first[sent.n] = rep->vals_bytes >= 4 ? ((const float *)rep->vals)[0] : -1.0f;
    sent.n++;
    ps__header__free_unpacked(h, NULL);
    psd_reply_drop(rep);
}

/* Appends h as a record. */
static void add(uint8_t *recs, size_t *len, const Ps__Header *h)
{
    uint8_t buf[512];
    int64_t n = ps_wire_header_pack(h, buf, sizeof buf);
    assert_true(n > 0);
    assert_int_equal(ps_wire_batch_add(recs, PS_BATCH_BYTES_MAX, len, buf, (size_t)n), 0);
}

static void pull(Ps__Header *h, uint64_t id, uint64_t offset, uint64_t count)
{
    ps_wire_header_init(h, PS__OP__OP_PULL);
    h->request_id = id;
    h->offset = offset;
    h->count = count;
}

/* Decodes [envelope of count][recs] as a request (or a reply). */
static int decode_batch(uint64_t count, const uint8_t *recs, size_t len, int status,
                        enum ps_wire_dir dir, char *err)
{
    static unsigned char abuf[PS_ARENA_BYTES_SERVER];
    static struct ps_arena a;
    ps_arena_init(&a, abuf, sizeof abuf);
    Ps__Header e;
    ps_wire_header_init(&e, PS__OP__OP_BATCH);
    e.count = count;
    e.status = status;
    uint8_t hb[256];
    int64_t n = ps_wire_header_pack(&e, hb, sizeof hb);
    assert_true(n > 0);
    struct ps_frame f[2] = {{hb, (size_t)n}, {recs, len}};
    struct ps_wire_msg m;
    return ps_wire_decode(&a, f, 2, dir, 1u << 20, &m, err, 256);
}

static void test_records_round_trip(void **state)
{
    (void)state;
    static uint8_t recs[PS_BATCH_BYTES_MAX];
    size_t len = 0, pos = 0;
    const uint8_t a[] = {1, 2, 3}, b[] = {9};
    assert_int_equal(ps_wire_batch_add(recs, sizeof recs, &len, a, 3), 0);
    assert_int_equal(ps_wire_batch_add(recs, sizeof recs, &len, b, 1), 0);
    assert_int_equal(len, 4 + 3 + 4 + 1);
    assert_int_equal(ps_wire_batch_add(recs, sizeof recs, &len, b, 0), PS_ELIMIT); /* empty */
    assert_int_equal(ps_wire_batch_add(recs, 12, &len, b, 1), PS_ELIMIT);          /* full */
    assert_int_equal(len, 12);                                                     /* unchanged */
    struct ps_frame f;
    assert_int_equal(ps_wire_batch_next(recs, len, &pos, &f), 1);
    assert_int_equal(f.size, 3);
    assert_memory_equal(f.data, a, 3);
    assert_int_equal(ps_wire_batch_next(recs, len, &pos, &f), 1);
    assert_int_equal(f.size, 1);
    assert_int_equal(ps_wire_batch_next(recs, len, &pos, &f), 0);
    assert_int_equal(pos, len);
    /* a length past the end, or 0, is no record */
    pos = 0;
    assert_int_equal(ps_wire_batch_next(recs, 6, &pos, &f), 0);
    const uint8_t zero[5] = {0, 0, 0, 0, 7};
    assert_int_equal(ps_wire_batch_next(zero, 5, &pos, &f), 0);
    assert_int_equal(pos, 0);
}

static void test_malformed_envelopes(void **state)
{
    (void)state;
    static uint8_t recs[PS_BATCH_BYTES_MAX + 8];
    size_t len = 0;
    Ps__Header h;
    char err[256];
    pull(&h, 1, 0, 4);
    add(recs, &len, &h);
    add(recs, &len, &h);
    assert_int_equal(decode_batch(2, recs, len, 0, PS_WIRE_REQUEST, err), 0);
    assert_int_equal(decode_batch(0, recs, len, 0, PS_WIRE_REQUEST, err), PS_ELIMIT);
    assert_int_equal(decode_batch(PS_BATCH_MAX + 1, recs, len, 0, PS_WIRE_REQUEST, err), PS_ELIMIT);
    assert_non_null(strstr(err, "count"));
    /* count and records disagree, a record cut short, bytes left over */
    assert_int_equal(decode_batch(3, recs, len, 0, PS_WIRE_REQUEST, err), PS_EFRAMES);
    assert_int_equal(decode_batch(1, recs, len, 0, PS_WIRE_REQUEST, err), PS_EFRAMES);
    assert_int_equal(decode_batch(2, recs, len - 1, 0, PS_WIRE_REQUEST, err), PS_EFRAMES);
    assert_non_null(strstr(err, "records"));
    memset(recs + len, 0, 4); /* an empty record after the two */
    assert_int_equal(decode_batch(3, recs, len + 4, 0, PS_WIRE_REQUEST, err), PS_EFRAMES);
    assert_int_equal(decode_batch(2, recs, PS_BATCH_BYTES_MAX + 1, 0, PS_WIRE_REQUEST, err),
                     PS_ELIMIT);
    /* at the limits: PS_BATCH_MAX records, and a records frame of
     * PS_BATCH_BYTES_MAX bytes (one past each is refused above) */
    len = 0;
    for (int i = 0; i < (int)PS_BATCH_MAX; i++) {
        pull(&h, (uint64_t)i + 1, 0, 4);
        add(recs, &len, &h);
    }
    assert_int_equal(decode_batch(PS_BATCH_MAX, recs, len, 0, PS_WIRE_REQUEST, err), 0);
    const uint8_t big[] = {1};
    size_t blen = 0;
    static uint8_t whole[PS_BATCH_BYTES_MAX];
    memset(whole, 0x7f, sizeof whole);
    assert_int_equal(ps_wire_batch_add(recs, PS_BATCH_BYTES_MAX, &blen, whole,
                                       PS_BATCH_BYTES_MAX - sizeof(uint32_t)),
                     0);
    assert_int_equal(blen, PS_BATCH_BYTES_MAX);
    assert_int_equal(ps_wire_batch_add(recs, PS_BATCH_BYTES_MAX, &blen, big, 1), PS_ELIMIT);
    assert_int_equal(decode_batch(1, recs, blen, 0, PS_WIRE_REQUEST, err), 0);
    len = 0;
    pull(&h, 1, 0, 4);
    add(recs, &len, &h);
    add(recs, &len, &h);
    /* a batch is never answered as one, except with an error */
    assert_int_equal(decode_batch(2, recs, len, 0, PS_WIRE_REPLY, err), PS_EPROTO);
    /* the records frame is missing */
    static unsigned char abuf[PS_ARENA_BYTES_SERVER];
    static struct ps_arena a;
    ps_arena_init(&a, abuf, sizeof abuf);
    ps_wire_header_init(&h, PS__OP__OP_BATCH);
    h.count = 1;
    uint8_t hb[256];
    struct ps_frame f = {hb, (size_t)ps_wire_header_pack(&h, hb, sizeof hb)};
    struct ps_wire_msg m;
    assert_int_equal(ps_wire_decode(&a, &f, 1, PS_WIRE_REQUEST, 1u << 20, &m, err, 256),
                     PS_EFRAMES);
}

/* Dispatches [envelope of count][recs] from route "r". */
static int dispatch(struct psd *s, uint64_t count, const uint8_t *recs, size_t len,
                    struct psd_reply *rep)
{
    Ps__Header e;
    ps_wire_header_init(&e, PS__OP__OP_BATCH);
    e.count = count;
    uint8_t hb[256];
    struct ps_frame f[2] = {{hb, (size_t)ps_wire_header_pack(&e, hb, sizeof hb)}, {recs, len}};
    struct ps_frame route = {"r", 1};
    return psd_dispatch(s, &route, f, 2, rep);
}

static void test_each_request_answered(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    inproc_start(&s, &log);
    inproc_create_ones(&s, 8);
    psd_set_sender(&s, capture, NULL);
    memset(&sent, 0, sizeof sent);

    static uint8_t recs[PS_BATCH_BYTES_MAX];
    size_t len = 0;
    Ps__Header h;
    pull(&h, 11, 0, 4);
    add(recs, &len, &h);
    ps_wire_header_init(&h, PS__OP__OP_HELLO); /* not a data request */
    h.request_id = 12;
    add(recs, &len, &h);
    pull(&h, 13, 4, 8); /* past the table's end */
    add(recs, &len, &h);
    ps_wire_header_init(&h, PS__OP__OP_BATCH); /* no batches in batches: no records frame */
    h.request_id = 14;
    h.count = 1;
    add(recs, &len, &h);
    ps_wire_header_init(&h, PS__OP__OP_PUSH); /* its values frame cannot come along */
    h.request_id = 15;
    h.count = 2;
    add(recs, &len, &h);
    const uint8_t junk[] = {0xff, 0xff, 0xff};
    assert_int_equal(ps_wire_batch_add(recs, sizeof recs, &len, junk, sizeof junk), 0);
    pull(&h, 17, 6, 2);
    add(recs, &len, &h);

    uint64_t before = psd_counts(&s)->requests, out = psd_counts(&s)->bytes_out;
    sent.bytes = 0;
    struct psd_reply rep;
    assert_int_equal(dispatch(&s, 7, recs, len, &rep), 0); /* all answered through the sender */
    assert_int_equal(psd_counts(&s)->bytes_out - out, sent.bytes); /* each reply counted once */
    assert_int_equal(sent.n, 7);
    const uint64_t id[] = {11, 12, 13, 14, 15, 0, 17};
    const int status[] = {0, PS_EOP, PS_ERANGE, PS_EFRAMES, PS_EFRAMES, PS_EPROTO, 0};
    for (int i = 0; i < 7; i++) {
        if (sent.id[i] != id[i] || sent.status[i] != status[i])
            fail_msg("reply %d: id %llu status %s, expected id %llu status %s", i,
                     (unsigned long long)sent.id[i], ps_err_name(sent.status[i]),
                     (unsigned long long)id[i], ps_err_name(status[i]));
    }
    assert_int_equal(sent.vals_bytes[0], 16);
    assert_true(sent.first[0] == 1.0f);
    assert_int_equal(sent.vals_bytes[6], 8);
    assert_int_equal(psd_counts(&s)->requests - before, 8);       /* the batch and each in it */
    assert_int_equal(psd_counts(&s)->by_op[PS__OP__OP_BATCH], 2); /* this one and the one in it */
    assert_int_equal(psd_counts(&s)->by_op[PS__OP__OP_HELLO], 1);

    /* a malformed batch: one error reply, nothing in it handled */
    memset(&sent, 0, sizeof sent);
    before = psd_counts(&s)->requests;
    assert_int_equal(dispatch(&s, 8, recs, len, &rep), 1);
    Ps__Header *r = ps__header__unpack(NULL, rep.hdr_len, rep.hdr);
    assert_int_equal(r->status, PS_EFRAMES);
    assert_int_equal(r->op, PS__OP__OP_BATCH);
    ps__header__free_unpacked(r, NULL);
    psd_reply_drop(&rep);
    assert_int_equal(sent.n, 0);
    assert_int_equal(psd_counts(&s)->requests - before, 1);

    /* a shard with no sender (no transport) refuses batches whole */
    psd_set_sender(&s, NULL, NULL);
    assert_int_equal(dispatch(&s, 7, recs, len, &rep), 1);
    r = ps__header__unpack(NULL, rep.hdr_len, rep.hdr);
    assert_int_equal(r->status, PS_EOP);
    ps__header__free_unpacked(r, NULL);
    psd_reply_drop(&rep);
    assert_int_equal(sent.n, 0);
    psd_fini(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_records_round_trip),
        cmocka_unit_test(test_malformed_envelopes),
        cmocka_unit_test(test_each_request_answered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
