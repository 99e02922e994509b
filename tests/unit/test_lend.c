/* Pull replies sent from the table itself (psd's lend_ok and the table's
 * copy on write), through an in-process psd: which replies are lent, that
 * a held reply keeps its values while the table is written, that writes to
 * other elements do not copy, and that a table whose replies are
 * overwritten in flight copies a shard's worth of replies before it lends
 * again, each time. */
#include "catalog.h"
#include "counters.h"
#include "psd.h"
#include "waits.h"

#include "ps_err.h"
#include "ps_limits.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "inproc.h"

#define SIZE PS_LEND_BYTES_MIN /* floats: a quarter of the table is the smallest lent reply */
#define Q    (SIZE / 4u)

static float grad[SIZE];

/* Dispatches a request of op on [offset, +count) (with the gradient for
 * pushes) and returns its reply, not dropped. */
static void request(struct psd *s, Ps__Op op, uint64_t offset, uint64_t count, Ps__DType dtype,
                    struct psd_reply *rep)
{
    Ps__Header h;
    ps_wire_header_init(&h, op);
    static uint64_t id;
    h.request_id = ++id; /* pushes are applied once per id */
    h.table_id = 0;
    h.offset = offset;
    h.count = count;
    h.dtype = dtype;
    inproc_request(s, &h, op == PS__OP__OP_PULL ? NULL : grad, count * 4, rep);
}

/* Whether an f32 pull of [offset, +count) is answered from the table
 * (the reply is let go of at once). */
static int pull_lent(struct psd *s, uint64_t offset, uint64_t count)
{
    struct psd_reply rep;
    request(s, PS__OP__OP_PULL, offset, count, PS__DTYPE__DTYPE_F32, &rep);
    int lent = rep.lent != NULL;
    psd_reply_drop(&rep);
    return lent;
}

/* A quarter of the table pulled (lent) and pushed to while held: the
 * table's copy on write number `cow`. */
static void lend_overwrite(struct psd *s, uint64_t cow)
{
    struct psd_reply held, rep;
    request(s, PS__OP__OP_PULL, 0, Q, PS__DTYPE__DTYPE_F32, &held);
    assert_non_null(held.lent);
    request(s, PS__OP__OP_PUSH, 0, Q, PS__DTYPE__DTYPE_F32, &rep);
    psd_reply_drop(&rep);
    assert_int_equal(psd_table_at(s, 0)->cow, cow);
    psd_reply_drop(&held);
}

static void test_lent_replies(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    inproc_start(&s, &log);
    inproc_create_ones(&s, SIZE);
    struct psd_reply rep, held;
    struct psd_table *t = psd_table_at(&s, 0);
    for (size_t i = 0; i < SIZE; i++)
        grad[i] = 0.5f;

    /* below zmq's zero-copy size the reply points into the table (the
     * sender copies it at once) and is never freed (ASan: no bad free) */
    request(&s, PS__OP__OP_PULL, 10, PS_ZEROCOPY_BYTES_MIN / 4 - 1, PS__DTYPE__DTYPE_F32, &rep);
    assert_true(rep.vals_borrowed && rep.lent == NULL);
    assert_ptr_equal(rep.vals, t->w + 10);
    psd_reply_drop(&rep);
    request(&s, PS__OP__OP_PULL, 10, PS_ZEROCOPY_BYTES_MIN / 4, PS__DTYPE__DTYPE_F32, &rep);
    assert_false(rep.vals_borrowed); /* at the size: a buffer zmq can own */
    psd_reply_drop(&rep);
    /* not lent: one float short of the size, 16-bit values */
    request(&s, PS__OP__OP_PULL, 0, Q - 1, PS__DTYPE__DTYPE_F32, &rep);
    assert_null(rep.lent);
    assert_true(rep.vals != NULL && rep.vals != (void *)t->w);
    psd_reply_drop(&rep);
    request(&s, PS__OP__OP_PULL, 0, SIZE, PS__DTYPE__DTYPE_F16, &rep);
    assert_null(rep.lent);
    psd_reply_drop(&rep);
    /* a push-pull's reply is lent; the next push-pull writes other
     * elements while it is held: no copy */
    request(&s, PS__OP__OP_PUSH_PULL, 0, Q, PS__DTYPE__DTYPE_F32, &held);
    assert_non_null(held.lent);
    assert_ptr_equal(held.vals, t->w);
    request(&s, PS__OP__OP_PUSH_PULL, Q, Q, PS__DTYPE__DTYPE_F32, &rep);
    assert_non_null(rep.lent);
    assert_int_equal(t->cow, 0);
    psd_reply_drop(&rep);
    psd_reply_drop(&held);
    float now = 1.0f; /* the last quarter, which those did not touch */
    /* lent and let go before any write: eight shards' worth that lending
     * saved, which must not pay for copies on write later */
    for (int i = 0; i < 8; i++)
        assert_true(pull_lent(&s, 0, SIZE));

    /* lent: the last quarter, from the table's own memory */
    request(&s, PS__OP__OP_PULL, 3 * Q, Q, PS__DTYPE__DTYPE_F32, &held);
    assert_non_null(held.lent);
    assert_ptr_equal(held.vals, t->w + 3 * Q);
    assert_int_equal(held.vals_bytes, Q * 4);
    /* a push while it is held: the table moves, the reply keeps its values */
    request(&s, PS__OP__OP_PUSH, 0, SIZE, PS__DTYPE__DTYPE_F32, &rep);
    assert_int_equal(rep.hdr_len > 0, 1);
    psd_reply_drop(&rep);
    assert_int_equal(t->cow, 1);
    for (size_t i = 0; i < Q; i++)
        if (((const float *)held.vals)[i] != now)
            fail_msg("held reply element %zu changed to %g", i, (double)((float *)held.vals)[i]);
    assert_true(t->w[SIZE - 1] == now - 0.5f);
    /* after that copy of the whole shard, replies are copied until a
     * shard's worth has been: the whole shard less a float is not enough */
    request(&s, PS__OP__OP_PULL, 0, SIZE - 1, PS__DTYPE__DTYPE_F32, &rep);
    assert_null(rep.lent);
    assert_true(((const float *)rep.vals)[SIZE - 2] == now - 0.5f);
    psd_reply_drop(&rep);
    psd_reply_drop(&held); /* frees the old block (ASan: no leak) */
    /* copied too, which makes a shard's worth and more */
    assert_false(pull_lent(&s, 0, 1 + PS_LEND_BYTES_MIN / 4));
    request(&s, PS__OP__OP_PULL, 0, SIZE, PS__DTYPE__DTYPE_F32, &held);
    assert_non_null(held.lent); /* lent again */
    /* overwritten in flight again: a copy, and copies until a shard's worth
     * more (lending saved before does not pay for it) */
    request(&s, PS__OP__OP_PUSH, 0, Q, PS__DTYPE__DTYPE_F32, &rep);
    psd_reply_drop(&rep);
    assert_int_equal(t->cow, 2);
    assert_false(pull_lent(&s, 0, SIZE));
    psd_reply_drop(&held);
    /* a quarter lent, overwritten in flight: a second copy on write in a
     * row (lending saved less than a shard between them), so twice a
     * shard's worth is copied before the next lend */
    lend_overwrite(&s, 3);
    for (int i = 0; i < 2; i++) /* 1x, then 2x a shard's worth copied */
        assert_false(pull_lent(&s, 0, SIZE));
    assert_true(pull_lent(&s, 0, Q));
    /* a shard's worth lent ends the run: the next copy on write waits one
     * shard's worth again */
    assert_true(pull_lent(&s, 0, SIZE));
    lend_overwrite(&s, 4);
    assert_false(pull_lent(&s, 0, SIZE));
    assert_true(pull_lent(&s, 0, Q));
    psd_fini(&s);
}

/* Quarter-table pulls copied before one is lent again. */
static int copies_before_lend(struct psd *s)
{
    for (int n = 0; n < 4 * 256; n++)
        if (pull_lent(s, 0, Q))
            return n;
    return -1;
}

/* Copies on write in a row: each doubles the shard's worth of replies
 * copied before the next lend, up to PSD_COW_RUN_MAX of them, and no
 * further after that. (Quarter-table replies: lending one never saves a
 * shard's worth, so the run does not end.) */
static void test_cow_run_limit(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    inproc_start(&s, &log);
    inproc_create_ones(&s, SIZE);
    for (uint64_t cow = 1; cow <= PSD_COW_RUN_MAX + 2; cow++) {
        lend_overwrite(&s, cow);
        uint64_t run = cow < PSD_COW_RUN_MAX ? cow : PSD_COW_RUN_MAX;
        assert_int_equal(copies_before_lend(&s), 4 << (run - 1)); /* quarters */
    }
    psd_fini(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lent_replies),
        cmocka_unit_test(test_cow_run_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
