/* The malformed-request table. Every builder starts from a valid request
 * and breaks exactly one thing, so each case tests one check. */
#define _GNU_SOURCE /* memmem */
#include "cases.h"

#include "ps_err.h"
#include "ps_limits.h"
#include "ps_wire.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int case_msg_alloc(struct case_msg *m)
{
    memset(m, 0, sizeof *m);
    for (int i = 0; i < CASE_FRAMES_MAX; i++) {
        m->data[i] = calloc(1, CASE_FRAME_BYTES_MAX);
        if (m->data[i] == NULL)
            return -1;
    }
    return 0;
}

void case_msg_free(struct case_msg *m)
{
    for (int i = 0; i < CASE_FRAMES_MAX; i++)
        free(m->data[i]);
}

void case_put_header(struct case_msg *m, const Ps__Header *h)
{
    m->size[0] = ps__header__pack(h, m->data[0]);
    m->nframes = 1;
}

void case_add_frame(struct case_msg *m, size_t bytes)
{
    m->size[m->nframes] = bytes;
    m->nframes++;
}

static void data_header(Ps__Header *h, Ps__Op op, uint64_t offset, uint64_t count)
{
    ps_wire_header_init(h, op);
    h->request_id = 42;
    h->worker_id = 3;
    h->table_id = 0;
    h->offset = offset;
    h->count = count;
}

static void valid_push(struct case_msg *m, Ps__Header *h)
{
    case_put_header(m, h);
    case_add_frame(m, h->count * h->dim * ps_dtype_size(h->dtype));
}

static void c_garbage(struct case_msg *m)
{
    for (int i = 0; i < 64; i++)
        m->data[0][i] = (unsigned char)(0xff - i * 7);
    m->size[0] = 64;
    m->nframes = 1;
}

static Ps__TableSpec *good_spec(Ps__TableSpec *s)
{
    ps__table_spec__init(s);
    s->name = "fc1.weight";
    s->size = 1000;
    s->lr = 0.1f;
    s->eps = 1e-8f;
    return s;
}

static void c_truncated(struct case_msg *m)
{
    Ps__Header h;
    Ps__TableSpec s;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = good_spec(&s);
    case_put_header(m, &h);
    m->size[0] -= 6; /* cut inside the length-delimited spec */
}

static void c_empty_header(struct case_msg *m)
{
    m->size[0] = 0;
    m->nframes = 1;
}

static void c_version(struct case_msg *m)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_HELLO);
    h.version = 2;
    case_put_header(m, &h);
}

static void c_op_none(struct case_msg *m)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_NONE);
    case_put_header(m, &h);
}

static void c_op_unknown(struct case_msg *m)
{
    Ps__Header h;
    ps_wire_header_init(&h, (Ps__Op)99);
    case_put_header(m, &h);
}

/* a pipeline stage's activations, sent to psd */
static void c_op_stage(struct case_msg *m)
{
    Ps__Header h;
    uint64_t dims[2] = {2, 5};
    ps_wire_header_init(&h, PS__OP__OP_STAGE);
    h.count = 10;
    h.shape = dims;
    h.n_shape = 2;
    case_put_header(m, &h);
    case_add_frame(m, 40);
}

static void c_pull_extra_frame(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_PULL, 0, 10);
    case_put_header(m, &h);
    case_add_frame(m, 40);
}

static void c_set_no_values(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_SET, 0, 10);
    case_put_header(m, &h);
}

static void c_set_keys(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_SET, 0, 2);
    h.layout = PS__LAYOUT__LAYOUT_KEYS;
    case_put_header(m, &h);
    case_add_frame(m, 16);
    case_add_frame(m, 8);
}

static void c_set_values_short(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_SET, 0, 10);
    case_put_header(m, &h);
    case_add_frame(m, 36);
}

static void c_push_no_values(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_PUSH, 0, 10);
    case_put_header(m, &h);
}

static void c_push_short_values(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_PUSH, 0, 10);
    valid_push(m, &h);
    m->size[1] = 39;
}

static void c_push_long_values(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_PUSH, 0, 10);
    valid_push(m, &h);
    m->size[1] = 44;
}

static void c_too_many_frames(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_PUSH, 0, 10);
    valid_push(m, &h);
    case_add_frame(m, 8);
    case_add_frame(m, 8);
    case_add_frame(m, 8);
}

/* A bare request of op with one frame too many. */
static void extra_frame(struct case_msg *m, Ps__Op op)
{
    Ps__Header h;
    ps_wire_header_init(&h, op);
    case_put_header(m, &h);
    case_add_frame(m, 4);
}
static void c_hello_extra_frame(struct case_msg *m)
{
    extra_frame(m, PS__OP__OP_HELLO);
}
static void c_heartbeat_extra_frame(struct case_msg *m)
{
    extra_frame(m, PS__OP__OP_HEARTBEAT);
}

static void c_checkpoint_no_dir(struct case_msg *m)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_CHECKPOINT);
    case_put_header(m, &h);
}

static void c_count_zero(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_PULL, 0, 0);
    case_put_header(m, &h);
}

static void c_offset_overflow(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_PULL, UINT64_MAX - 3, 10);
    case_put_header(m, &h);
}

static void c_dim_on_range(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_PULL, 0, 10);
    h.dim = 2;
    case_put_header(m, &h);
}

static void c_dtype_unknown(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_PULL, 0, 10);
    h.dtype = (Ps__DType)7;
    case_put_header(m, &h);
}

static void c_layout_unknown(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_PULL, 0, 10);
    h.layout = (Ps__Layout)5;
    case_put_header(m, &h);
}

static void keyed(struct case_msg *m, Ps__Op op, const uint64_t *keys, size_t n, size_t kbytes)
{
    Ps__Header h;
    data_header(&h, op, 0, n);
    h.layout = PS__LAYOUT__LAYOUT_KEYS;
    case_put_header(m, &h);
    memcpy(m->data[1], keys, n * 8u);
    case_add_frame(m, kbytes);
    if (op != PS__OP__OP_PULL)
        case_add_frame(m, n * 4u);
}

static void c_keys_unsorted(struct case_msg *m)
{
    const uint64_t k[4] = {5, 9, 7, 11};
    keyed(m, PS__OP__OP_PUSH, k, 4, 32);
}

static void c_keys_duplicate(struct case_msg *m)
{
    const uint64_t k[3] = {5, 9, 9};
    keyed(m, PS__OP__OP_PULL, k, 3, 24);
}

static void c_keys_wrong_size(struct case_msg *m)
{
    const uint64_t k[3] = {1, 2, 3};
    keyed(m, PS__OP__OP_PULL, k, 3, 20);
}

static void c_create_no_spec(struct case_msg *m)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    case_put_header(m, &h);
}

static void create_with(struct case_msg *m, void (*edit)(Ps__TableSpec *s))
{
    Ps__Header h;
    Ps__TableSpec s;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = good_spec(&s);
    edit(&s);
    case_put_header(m, &h);
}

static void e_name_empty(Ps__TableSpec *s)
{
    s->name = "";
}
static void e_name_space(Ps__TableSpec *s)
{
    s->name = "fc 1";
}
static void e_size_zero(Ps__TableSpec *s)
{
    s->size = 0;
}
static void e_size_huge(Ps__TableSpec *s)
{
    s->size = PS_TABLE_ELEMS_MAX + 1;
}
static void e_lr_nan(Ps__TableSpec *s)
{
    s->lr = NAN;
}
static void e_opt_unknown(Ps__TableSpec *s)
{
    s->optimizer = (Ps__OptimizerKind)9;
}
static void e_momentum_big(Ps__TableSpec *s)
{
    s->momentum = 1.5f;
}
static void e_adam_eps_zero(Ps__TableSpec *s)
{
    s->optimizer = PS__OPTIMIZER_KIND__OPT_ADAM;
    s->eps = 0.0f;
}

static void c_name_empty(struct case_msg *m)
{
    create_with(m, e_name_empty);
}
static void c_name_space(struct case_msg *m)
{
    create_with(m, e_name_space);
}
/* a name with a NUL byte in it on the wire: protobuf-c would cut it */
static void c_name_nul(struct case_msg *m)
{
    create_with(m, e_name_space); /* "fc 1" ... */
    unsigned char *at = memmem(m->data[0], m->size[0], "fc 1", 4);
    if (at != NULL)
        at[2] = '\0'; /* ... becomes "fc\0001" */
}
static void c_size_zero(struct case_msg *m)
{
    create_with(m, e_size_zero);
}
static void c_size_huge(struct case_msg *m)
{
    create_with(m, e_size_huge);
}
static void c_lr_nan(struct case_msg *m)
{
    create_with(m, e_lr_nan);
}
static void e_shape_not_size(Ps__TableSpec *s)
{
    static uint64_t dims[2] = {10, 99}; /* 990 of the spec's 1000 */
    s->n_shape = 2;
    s->shape = dims;
}
static void c_shape_not_size(struct case_msg *m)
{
    create_with(m, e_shape_not_size);
}
static void e_shape_deep(Ps__TableSpec *s)
{
    static uint64_t dims[9] = {1000, 1, 1, 1, 1, 1, 1, 1, 1};
    s->n_shape = 9;
    s->shape = dims;
}
static void c_shape_deep(struct case_msg *m)
{
    create_with(m, e_shape_deep);
}
static void e_shape_sparse(Ps__TableSpec *s)
{
    static uint64_t dims[1] = {4};
    s->size = 0;
    s->sparse = 1;
    s->dim = 4;
    s->rows_max = 16;
    s->n_shape = 1;
    s->shape = dims;
}
static void c_shape_sparse(struct case_msg *m)
{
    create_with(m, e_shape_sparse);
}
static void e_pushers_unsorted(Ps__TableSpec *s)
{
    static uint32_t ids[2] = {2, 1};
    s->n_pushers = 2;
    s->pushers = ids;
}
static void c_pushers_unsorted(struct case_msg *m)
{
    create_with(m, e_pushers_unsorted);
}
static void e_pusher_past_limit(Ps__TableSpec *s)
{
    static uint32_t ids[1] = {PS_WORKERS_MAX};
    s->n_pushers = 1;
    s->pushers = ids;
}
static void c_pusher_past_limit(struct case_msg *m)
{
    create_with(m, e_pusher_past_limit);
}
static void e_pushers_sparse(Ps__TableSpec *s)
{
    static uint32_t ids[1] = {0};
    s->size = 0;
    s->sparse = 1;
    s->dim = 4;
    s->rows_max = 16;
    s->n_pushers = 1;
    s->pushers = ids;
}
static void c_pushers_sparse(struct case_msg *m)
{
    create_with(m, e_pushers_sparse);
}
static void e_pusher_not_a_worker(Ps__TableSpec *s)
{
    static uint32_t ids[2] = {0, PS_WORKERS_MAX - 1}; /* valid on the wire, past --workers */
    s->n_pushers = 2;
    s->pushers = ids;
}
static void c_pusher_not_a_worker(struct case_msg *m)
{
    create_with(m, e_pusher_not_a_worker);
}
static void c_opt_unknown(struct case_msg *m)
{
    create_with(m, e_opt_unknown);
}
static void c_momentum_big(struct case_msg *m)
{
    create_with(m, e_momentum_big);
}
static void c_adam_eps_zero(struct case_msg *m)
{
    create_with(m, e_adam_eps_zero);
}

static void c_header_oversize(struct case_msg *m)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_HELLO);
    case_put_header(m, &h);
    m->size[0] = PS_HEADER_BYTES_MAX + 1; /* valid prefix, then zero padding */
}

static void c_count_past_limit(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_PULL, 0, CASE_MAX_MESSAGE_BYTES / 4 + 1);
    case_put_header(m, &h);
}

static void c_count_at_limit_push_short(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_PUSH, 0, PS_TABLE_ELEMS_MAX + 1);
    case_put_header(m, &h);
    case_add_frame(m, 16);
}

/* ---- server-state cases ---- */

static void c_unknown_table(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_PULL, 0, 10);
    h.table_id = 77;
    case_put_header(m, &h);
}

static void c_range_past_table(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_PUSH, 995, 10);
    valid_push(m, &h);
}

static void c_pull_straddles_end(struct case_msg *m)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_PULL, 990, 20);
    h.dtype = PS__DTYPE__DTYPE_F16;
    case_put_header(m, &h);
}

static void c_keys_on_dense(struct case_msg *m)
{
    const uint64_t k[3] = {1, 2, 3};
    keyed(m, PS__OP__OP_PULL, k, 3, 24);
}

static void e_over_table_limit(Ps__TableSpec *s)
{
    s->name = "over";
    s->size = CASE_TABLE_BYTES_MAX / 4 + 1; /* SGD: 4 bytes an element */
}
static void c_table_over_limit(struct case_msg *m)
{
    create_with(m, e_over_table_limit);
}

static void c_keys_outside_shard(struct case_msg *m)
{
    const uint64_t k[2] = {10, 1000}; /* t0 holds [0, 1000) */
    keyed(m, PS__OP__OP_PUSH, k, 2, 16);
}

static void e_other_lr(Ps__TableSpec *s)
{
    s->name = "t0";
    s->lr = 0.5f;
}
static void c_create_conflict(struct case_msg *m)
{
    create_with(m, e_other_lr);
}

/* A rows request of count rows of table id table, with a stray frame of
 * `extra` bytes when extra > 0. */
static void rows_req(struct case_msg *m, uint64_t count, uint32_t table, size_t extra)
{
    Ps__Header h;
    data_header(&h, PS__OP__OP_ROWS, 0, count);
    h.table_id = table;
    case_put_header(m, &h);
    if (extra > 0)
        case_add_frame(m, extra);
}
static void c_rows_count_zero(struct case_msg *m)
{
    rows_req(m, 0, 0, 0);
}
static void c_rows_page_too_big(struct case_msg *m)
{
    rows_req(m, PS_ROWS_PAGE_MAX + 1, 0, 0);
}
static void c_rows_with_frame(struct case_msg *m)
{
    rows_req(m, 4, 0, 8);
}
static void c_rows_of_dense(struct case_msg *m)
{
    rows_req(m, 4, 0, 0); /* t0 is dense */
}
static void c_rows_unknown_table(struct case_msg *m)
{
    rows_req(m, 4, 999, 0);
}

const struct bad_case bad_cases[] = {
    {"garbage header", PS_EPROTO, 0, c_garbage},
    {"truncated header", PS_EPROTO, 0, c_truncated},
    {"empty header", PS_EVERSION, 0, c_empty_header},
    {"wrong version", PS_EVERSION, 0, c_version},
    {"op none", PS_EOP, 0, c_op_none},
    {"unknown op", PS_EOP, 0, c_op_unknown},
    {"a pipeline stage's op", PS_EOP, 0, c_op_stage},
    {"pull with a values frame", PS_EFRAMES, 0, c_pull_extra_frame},
    {"push without values", PS_EFRAMES, 0, c_push_no_values},
    {"set without values", PS_EFRAMES, 0, c_set_no_values},
    {"set by keys", PS_EPROTO, 0, c_set_keys},
    {"set with a short values frame", PS_ESIZE, 0, c_set_values_short},
    {"push values one byte short", PS_ESIZE, 0, c_push_short_values},
    {"push values too long", PS_ESIZE, 0, c_push_long_values},
    {"five frames", PS_EFRAMES, 0, c_too_many_frames},
    {"hello with a frame", PS_EFRAMES, 0, c_hello_extra_frame},
    {"count zero", PS_EINVAL, 0, c_count_zero},
    {"offset+count overflow", PS_ERANGE, 0, c_offset_overflow},
    {"dim 2 on range layout", PS_EINVAL, 0, c_dim_on_range},
    {"unknown dtype", PS_EDTYPE, 0, c_dtype_unknown},
    {"unknown layout", PS_EPROTO, 0, c_layout_unknown},
    {"keys unsorted", PS_EPROTO, 0, c_keys_unsorted},
    {"keys duplicate", PS_EPROTO, 0, c_keys_duplicate},
    {"keys frame wrong size", PS_ESIZE, 0, c_keys_wrong_size},
    {"create without spec", PS_EPROTO, 0, c_create_no_spec},
    {"create empty name", PS_EINVAL, 0, c_name_empty},
    {"create name with space", PS_EINVAL, 0, c_name_space},
    {"create name with a NUL byte", PS_EINVAL, 0, c_name_nul},
    {"create size zero", PS_ELIMIT, 0, c_size_zero},
    {"create size past limit", PS_ELIMIT, 0, c_size_huge},
    {"create lr NaN", PS_EINVAL, 0, c_lr_nan},
    {"create unknown optimizer", PS_EINVAL, 0, c_opt_unknown},
    {"create with a shape that is not its size", PS_EINVAL, 0, c_shape_not_size},
    {"create with 9 dimensions", PS_ELIMIT, 0, c_shape_deep},
    {"create a sparse table with a shape", PS_EINVAL, 0, c_shape_sparse},
    {"create with pushers out of order", PS_EINVAL, 0, c_pushers_unsorted},
    {"create with a pusher past PS_WORKERS_MAX", PS_EINVAL, 0, c_pusher_past_limit},
    {"create a sparse table with pushers", PS_EINVAL, 0, c_pushers_sparse},
    {"create with a pusher past --workers", PS_EINVAL, 1, c_pusher_not_a_worker},
    {"create momentum 1.5", PS_EINVAL, 0, c_momentum_big},
    {"create adam eps 0", PS_EINVAL, 0, c_adam_eps_zero},
    {"header one past limit", PS_ELIMIT, 0, c_header_oversize},
    {"pull one past value limit", PS_ELIMIT, 0, c_count_past_limit},
    {"push count past table limit", PS_ELIMIT, 0, c_count_at_limit_push_short},
    {"unknown table", PS_ENOTABLE, 1, c_unknown_table},
    {"range past table", PS_ERANGE, 1, c_range_past_table},
    {"f16 pull past the table end", PS_ERANGE, 1, c_pull_straddles_end},
    {"keyed pull of a dense table", PS_ENOTSUP, 1, c_keys_on_dense},
    {"keyed push past the shard", PS_ERANGE, 1, c_keys_outside_shard},
    {"table one past --max-table-bytes", PS_ELIMIT, 1, c_table_over_limit},
    {"create conflicting spec", PS_EEXIST, 1, c_create_conflict},
    {"heartbeat with a frame", PS_EFRAMES, 0, c_heartbeat_extra_frame},
    {"checkpoint without --checkpoint-dir", PS_ENOTSUP, 1, c_checkpoint_no_dir},
    {"rows page of 0", PS_ELIMIT, 0, c_rows_count_zero},
    {"rows page one past the limit", PS_ELIMIT, 0, c_rows_page_too_big},
    {"rows with a frame", PS_EFRAMES, 0, c_rows_with_frame},
    {"rows of a dense table", PS_EINVAL, 1, c_rows_of_dense},
    {"rows of an unknown table", PS_ENOTABLE, 1, c_rows_unknown_table},
};

const size_t bad_cases_count = sizeof bad_cases / sizeof bad_cases[0];

void case_table_spec(Ps__TableSpec *s, const char *name, uint64_t size)
{
    ps__table_spec__init(s);
    s->name = (char *)name;
    s->size = size;
    s->lr = 0.5f;
    s->momentum = 0.9f;
    s->beta1 = 0.9f;
    s->beta2 = 0.999f;
    s->eps = 1e-8f;
    s->init = PS__INIT_KIND__INIT_CONSTANT;
    s->init_scale = 1.0f;
}

void case_sparse_spec(Ps__TableSpec *s, const char *name, uint32_t dim, uint64_t rows_max, float lr)
{
    ps__table_spec__init(s);
    s->name = (char *)name;
    s->sparse = 1;
    s->dim = dim;
    s->rows_max = rows_max;
    s->lr = lr;
}
