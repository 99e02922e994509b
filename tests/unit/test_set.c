/* OP_SET (psc_set) through an in-process psd: values written as they are
 * before the first optimizer step, the refusals (after a step, a gap, a
 * keyed or non-finite request), a lent reply kept while its range is set,
 * and await_set tables holding pulls until the values are all there. */
#include "catalog.h"
#include "counters.h"
#include "psd.h"
#include "waits.h"

#include "ps_err.h"
#include "ps_half.h"
#include "ps_limits.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "inproc.h"

#define N PS_LEND_BYTES_MIN /* floats: a quarter of the table is lent */

static float vals[N];

static void header(Ps__Header *h, Ps__Op op, uint64_t offset, uint64_t count)
{
    static uint64_t id;
    ps_wire_header_init(h, op);
    h->request_id = ++id;
    h->table_id = 0;
    h->offset = offset;
    h->count = count;
}

/* Status of a set of vals[offset..+count) into [offset, +count). */
static int set(struct psd *s, uint64_t offset, uint64_t count)
{
    Ps__Header h;
    header(&h, PS__OP__OP_SET, offset, count);
    struct psd_reply rep;
    inproc_request(s, &h, vals + offset, count * 4, &rep);
    Ps__Header *r = ps__header__unpack(NULL, rep.hdr_len, rep.hdr);
    assert_non_null(r);
    int status = r->status;
    ps__header__free_unpacked(r, NULL);
    psd_reply_drop(&rep);
    return status;
}

static void pull(struct psd *s, uint64_t offset, uint64_t count, float *out)
{
    Ps__Header h;
    header(&h, PS__OP__OP_PULL, offset, count);
    struct psd_reply rep;
    inproc_request(s, &h, NULL, 0, &rep);
    assert_int_equal(rep.vals_bytes, count * 4);
    memcpy(out, rep.vals, count * 4);
    psd_reply_drop(&rep);
}

static void test_set_writes_until_the_first_step(void **state)
{
    (void)state;
    struct psd s;
    struct ps_log log;
    inproc_start(&s, &log);
    inproc_create_ones(&s, N);
    for (uint32_t i = 0; i < N; i++)
        vals[i] = (float)i * 0.25f - 7.0f;
    assert_int_equal(set(&s, 0, N), 0);
    static float got[N];
    pull(&s, 0, N, got);
    assert_memory_equal(got, vals, sizeof got); /* bit for bit */

    /* a lent reply keeps its values while its range is set again */
    Ps__Header h;
    header(&h, PS__OP__OP_PULL, 0, N / 4);
    struct psd_reply held;
    inproc_request(&s, &h, NULL, 0, &held);
    assert_non_null(held.lent);
    for (uint32_t i = 0; i < N; i++)
        vals[i] = 3.0f;
    assert_int_equal(set(&s, 0, N / 4), 0);
    assert_float_equal(((const float *)held.vals)[5], 5 * 0.25f - 7.0f, 0.0f);
    psd_reply_drop(&held);
    pull(&s, 0, 8, got);
    assert_float_equal(got[5], 3.0f, 0.0f);

    /* non-finite values are refused, and write nothing */
    vals[2] = NAN;
    assert_int_equal(set(&s, 0, 4), PS_EINVAL);
    pull(&s, 0, 4, got);
    assert_float_equal(got[2], 3.0f, 0.0f);
    vals[2] = 3.0f;

    /* after one optimizer step the weights are the servers' */
    Ps__Header p;
    header(&p, PS__OP__OP_PUSH, 0, N);
    struct psd_reply rep;
    inproc_request(&s, &p, vals, N * 4, &rep);
    psd_reply_drop(&rep);
    assert_int_equal(set(&s, 0, N), PS_ESTATE);
    psd_fini(&s);
}

static void test_set_refuses_keys_and_shared_memory(void **state)
{
    (void)state;
    struct psd s;
    struct ps_log log;
    inproc_start(&s, &log);
    inproc_create_ones(&s, 16);
    uint64_t keys[2] = {1, 2};
    Ps__Header h;
    header(&h, PS__OP__OP_SET, 0, 2);
    h.layout = PS__LAYOUT__LAYOUT_KEYS;
    uint8_t buf[512];
    struct ps_frame f[3] = {{buf, ps__header__pack(&h, buf)}, {keys, 16}, {vals, 8}};
    struct ps_frame route = {"r", 1};
    struct psd_reply rep;
    assert_int_equal(psd_dispatch(&s, &route, f, 3, &rep), PSD_ANSWER_NOW);
    Ps__Header *r = ps__header__unpack(NULL, rep.hdr_len, rep.hdr);
    assert_int_equal(r->status, PS_EPROTO);
    assert_non_null(strstr(r->error, "set: a range of a dense table only"));
    ps__header__free_unpacked(r, NULL);
    psd_reply_drop(&rep);

    header(&h, PS__OP__OP_SET, 0, 2);
    h.shm = PS_SHM_IN;
    f[0].size = ps__header__pack(&h, buf);
    f[1] = f[2];
    assert_int_equal(psd_dispatch(&s, &route, f, 2, &rep), PSD_ANSWER_NOW);
    r = ps__header__unpack(NULL, rep.hdr_len, rep.hdr);
    assert_int_equal(r->status, PS_EPROTO); /* shm bits on an op that moves no values */
    ps__header__free_unpacked(r, NULL);
    psd_reply_drop(&rep);
    psd_fini(&s);
}

/* psd's sender in the tests below: counts the replies sent later, and
 * checks each is a pull's values. */
static void count_sent(void *ctx, const void *route, size_t route_len, struct psd_reply *rep)
{
    (void)route;
    (void)route_len;
    Ps__Header *h = ps__header__unpack(NULL, rep->hdr_len, rep->hdr);
    assert_non_null(h);
    assert_int_equal(h->status, 0);
    assert_int_equal(h->op, PS__OP__OP_PULL);
    assert_int_equal(rep->vals_bytes, 8 * sizeof(float));
    ps__header__free_unpacked(h, NULL);
    psd_reply_drop(rep);
    (*(int *)ctx)++;
}

static void test_await_set_holds_pulls(void **state)
{
    (void)state;
    struct psd s;
    struct ps_log log;
    inproc_start_workers(&s, &log, 1); /* worker 0's pulls may wait */
    int sent = 0;
    psd_set_sender(&s, count_sent, &sent);
    Ps__TableSpec sp;
    ps__table_spec__init(&sp);
    sp.name = "t";
    sp.size = 8;
    sp.lr = 1.0f;
    sp.await_set = 1;
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &sp;
    struct psd_reply rep;
    inproc_request(&s, &h, NULL, 0, &rep);
    Ps__Header *c = ps__header__unpack(NULL, rep.hdr_len, rep.hdr);
    assert_non_null(c);
    if (c->status != 0)
        fail_msg("create: %s", c->error);
    ps__header__free_unpacked(c, NULL);
    psd_reply_drop(&rep);

    /* a pull waits */
    header(&h, PS__OP__OP_PULL, 0, 8);
    uint8_t buf[512];
    struct ps_frame f[1] = {{buf, ps__header__pack(&h, buf)}};
    struct ps_frame route = {"r", 1};
    if (psd_dispatch(&s, &route, f, 1, &rep) != PSD_ANSWER_LATER) {
        Ps__Header *e = ps__header__unpack(NULL, rep.hdr_len, rep.hdr);
        fail_msg("the pull was answered: status %d, %s", e ? e->status : 0, e ? e->error : "");
    }
    assert_int_equal(psd_waits_stats(&s).waiting, 1);
    for (int i = 0; i < 8; i++)
        vals[i] = (float)i;
    /* a piece that leaves a gap is refused; in order they complete the set */
    assert_int_equal(set(&s, 4, 4), PS_EAGAIN);
    assert_int_equal(psd_waits_stats(&s).waiting, 1);
    assert_int_equal(set(&s, 0, 4), 0);
    assert_int_equal(psd_waits_stats(&s).waiting, 1); /* half of it is not enough */
    assert_int_equal(set(&s, 0, 4), 0);               /* a resend is taken */
    assert_int_equal(set(&s, 4, 4), 0);
    assert_int_equal(psd_waits_stats(&s).waiting, 0); /* answered when the last piece came */
    assert_int_equal(sent, 1);
    float got[8];
    pull(&s, 0, 8, got);
    assert_memory_equal(got, vals, sizeof got);

    /* a sparse table cannot await a set */
    ps__table_spec__init(&sp);
    sp.name = "e";
    sp.sparse = 1;
    sp.dim = 2;
    sp.rows_max = 16;
    sp.await_set = 1;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &sp;
    inproc_request(&s, &h, NULL, 0, &rep);
    Ps__Header *r = ps__header__unpack(NULL, rep.hdr_len, rep.hdr);
    assert_int_equal(r->status, PS_EINVAL);
    assert_non_null(strstr(r->error, "await_set takes a dense table"));
    ps__header__free_unpacked(r, NULL);
    psd_reply_drop(&rep);
    psd_fini(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set_writes_until_the_first_step),
        cmocka_unit_test(test_set_refuses_keys_and_shared_memory),
        cmocka_unit_test(test_await_set_holds_pulls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
