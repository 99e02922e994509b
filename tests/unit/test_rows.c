/* OP_ROWS pages of a sparse table in an in-process psd, at its limits: a
 * page of PS_ROWS_PAGE_MAX rows is asked for, one more is refused; rows of
 * the widest dim stop at PS_ROWS_PAGE_BYTES of values; the page at the
 * end is empty, one past the end is refused. Every reply passes the
 * client's own reply checks. */
#include "admin.h"
#include "catalog.h"
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
static uint64_t last_next; /* the last reply's Header.next */

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
    last_next = m.hdr->next;
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

/* Sparse table 0 of s: rows of dim floats, rows_max of them, its rows
 * made by pulling keys[0..n) (in key order, the shard's order). */
static void sparse_with_rows(struct psd *s, uint32_t dim, uint64_t rows_max, const uint64_t *keys,
                             uint64_t n)
{
    Ps__TableSpec sp;
    ps__table_spec__init(&sp);
    sp.name = "e";
    sp.sparse = 1;
    sp.dim = dim;
    sp.rows_max = rows_max;
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &sp;
    assert_int_equal(call(s, &h, NULL, 0, NULL, NULL, NULL), 0);
    ps_wire_header_init(&h, PS__OP__OP_PULL);
    h.layout = PS__LAYOUT__LAYOUT_KEYS;
    h.dim = dim;
    h.count = n;
    assert_int_equal(call(s, &h, keys, n, NULL, NULL, NULL), 0);
}

static void test_page_limits(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    inproc_start(&s, &log);
    static uint64_t keys[NROWS], got[NROWS];
    for (uint64_t i = 0; i < NROWS; i++)
        keys[i] = 1000 + 7 * i;
    sparse_with_rows(&s, WIDE, NROWS, keys, NROWS);

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

/* A delta page (rows pushed after a tick) looks at PSD_ROWS_SCAN_MAX
 * rows at most: over a table where one row of PSD_ROWS_SCAN_MAX + 1
 * changed, the first page sends none and says to go on at the bound,
 * the next sends that row; a since past the table's tick is refused. */
static void test_delta_page_limits(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    inproc_start(&s, &log);
    enum { N = PSD_ROWS_SCAN_MAX + 1 };
    static uint64_t keys[N], got[PS_ROWS_PAGE_MAX];
    for (uint64_t i = 0; i < N; i++)
        keys[i] = i;
    sparse_with_rows(&s, 1, N, keys, N); /* tick 1 */
    struct psd_table *t = psd_table_at(&s, 0);
    uint64_t last = N - 1;
    float g = 1.0f;
    char err[256];
    assert_int_equal(psd_table_push_rows(t, &last, &g, 1, err, sizeof err), 0); /* tick 2 */
    uint64_t count = 0, rows = 0;
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_ROWS);
    h.changed = 1;
    h.since = 1;
    h.count = PS_ROWS_PAGE_MAX;
    assert_int_equal(call(&s, &h, NULL, 0, &count, &rows, got), 0);
    assert_int_equal(count, 0); /* the first PSD_ROWS_SCAN_MAX rows: none changed */
    assert_int_equal(last_next, PSD_ROWS_SCAN_MAX);
    assert_int_equal(rows, N);
    h.offset = last_next;
    assert_int_equal(call(&s, &h, NULL, 0, &count, &rows, got), 0);
    assert_int_equal(count, 1); /* the row one past the bound */
    assert_true(got[0] == last);
    assert_int_equal(last_next, N);
    h.offset = 0;
    h.since = 0; /* every row: the page stops at its count */
    h.count = 5;
    assert_int_equal(call(&s, &h, NULL, 0, &count, &rows, got), 0);
    assert_int_equal(count, 5);
    assert_int_equal(last_next, 5);
    h.since = 3; /* past tick 2 */
    assert_int_equal(call(&s, &h, NULL, 0, NULL, NULL, NULL), PS_ESTATE);
    h.since = 2;
    h.changed = 0;
    h.tombstones = 1; /* nothing was evicted */
    assert_int_equal(call(&s, &h, NULL, 0, &count, &rows, NULL), 0);
    assert_int_equal(count, 0);
    assert_int_equal(rows, 0);
    psd_fini(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_page_limits),
        cmocka_unit_test(test_delta_page_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
