/* OP_ROWS pages of a sparse table in an in-process psd, at its limits: a
 * page of PS_ROWS_PAGE_MAX rows is asked for, one more is refused; rows of
 * the widest dim stop at PS_ROWS_PAGE_BYTES of values; the page at the
 * end is empty, one past the end is refused. Every reply passes the
 * client's own reply checks. */
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

#define WIDE  PS_SPARSE_DIM_MAX
#define NROWS (PS_ROWS_PAGE_BYTES / (WIDE * 4u) + 1u) /* one more than a page holds */

static unsigned char reply_arena[PS_ARENA_BYTES_SERVER];

/* Dispatches header h (and a keys frame when keys); returns the reply's
 * status, and for a rows reply its count and total rows, with its keys
 * into keys_out (when given). The reply is checked as a client would. */
static int call(struct psd *s, const Ps__Header *h, const uint64_t *keys, size_t nkeys,
                uint64_t *count, uint64_t *rows, uint64_t *keys_out)
{
    struct psd_reply rep;
    inproc_request(s, h, keys, nkeys * 8, &rep);
    struct ps_frame r[3] = {{rep.hdr, rep.hdr_len}};
    size_t nr = 1; /* the frames psd's sender sends */
    if (rep.mask != NULL)
        r[nr++] = (struct ps_frame){rep.mask, rep.mask_bytes};
    if (rep.vals != NULL)
        r[nr++] = (struct ps_frame){rep.vals, rep.vals_bytes};
    struct ps_arena a;
    ps_arena_init(&a, reply_arena, sizeof reply_arena);
    struct ps_wire_msg m;
    char err[256];
    int rc = ps_wire_decode(&a, r, nr, PS_WIRE_REPLY, INPROC_VALUE_BYTES_MAX, &m, err, sizeof err);
    if (rc != 0)
        fail_msg("our own reply does not pass the client's checks: %s", err);
    int status = m.hdr->status;
    if (count != NULL)
        *count = m.hdr->count;
    if (rows != NULL)
        *rows = m.hdr->rows;
    for (uint64_t i = 0; keys_out != NULL && status == 0 && i < m.hdr->count; i++)
        keys_out[i] = ps_wire_key(m.keys, i);
    psd_reply_drop(&rep);
    return status;
}

static int rows_page(struct psd *s, uint64_t offset, uint64_t want, uint64_t *count, uint64_t *rows,
                     uint64_t *keys_out)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_ROWS);
    h.offset = offset;
    h.count = want;
    return call(s, &h, NULL, 0, count, rows, keys_out);
}

static void test_page_limits(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    inproc_start(&s, &log);
    Ps__TableSpec sp;
    ps__table_spec__init(&sp);
    sp.name = "e";
    sp.sparse = 1;
    sp.dim = WIDE;
    sp.rows_max = NROWS;
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &sp;
    assert_int_equal(call(&s, &h, NULL, 0, NULL, NULL, NULL), 0);

    static uint64_t keys[NROWS], got[NROWS];
    for (uint64_t i = 0; i < NROWS; i++)
        keys[i] = 1000 + 7 * i;
    ps_wire_header_init(&h, PS__OP__OP_PULL); /* creates the rows, in key order */
    h.layout = PS__LAYOUT__LAYOUT_KEYS;
    h.dim = WIDE;
    h.count = NROWS;
    assert_int_equal(call(&s, &h, keys, NROWS, NULL, NULL, NULL), 0);

    uint64_t count = 0, rows = 0;
    /* at the request limit: answered, stopped by the byte limit */
    assert_int_equal(rows_page(&s, 0, PS_ROWS_PAGE_MAX, &count, &rows, got), 0);
    assert_int_equal(count, NROWS - 1);
    assert_int_equal(count * WIDE * 4u, PS_ROWS_PAGE_BYTES);
    assert_int_equal(rows, NROWS);
    assert_memory_equal(got, keys, count * 8);
    /* the last row, then the empty page at the end, then past it */
    assert_int_equal(rows_page(&s, NROWS - 1, PS_ROWS_PAGE_MAX, &count, &rows, got), 0);
    assert_int_equal(count, 1);
    assert_true(got[0] == keys[NROWS - 1]);
    assert_int_equal(rows_page(&s, NROWS, 5, &count, &rows, NULL), 0);
    assert_int_equal(count, 0);
    assert_int_equal(rows_page(&s, NROWS + 1, 5, NULL, NULL, NULL), PS_ERANGE);
    /* one past the request limit, and 0 */
    assert_int_equal(rows_page(&s, 0, PS_ROWS_PAGE_MAX + 1, NULL, NULL, NULL), PS_ELIMIT);
    assert_int_equal(rows_page(&s, 0, 0, NULL, NULL, NULL), PS_ELIMIT);
    psd_fini(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_page_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
