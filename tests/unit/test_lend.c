/* Pull replies sent from the table itself (psd's lend_ok and the table's
 * copy on write), through an in-process psd: which replies are lent, that
 * a held reply keeps its values while the table is written, that writes to
 * other elements do not copy, and that a table whose replies are
 * overwritten in flight stops lending. */
#include "psd.h"

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

static void test_lent_replies(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    inproc_start(&s, &log);
    inproc_create_ones(&s, SIZE);
    struct psd_reply rep, held;
    struct psd_table *t = s.tables[0];
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
    /* that copy cost the whole shard, more than the three quarters lent:
     * no more lending */
    request(&s, PS__OP__OP_PULL, 0, SIZE, PS__DTYPE__DTYPE_F32, &rep);
    assert_null(rep.lent);
    assert_true(((const float *)rep.vals)[SIZE - 1] == now - 0.5f);
    psd_reply_drop(&rep);
    psd_reply_drop(&held); /* frees the old block (ASan: no leak) */
    psd_fini(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lent_replies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
