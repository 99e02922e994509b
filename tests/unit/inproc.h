/* An in-process psd for unit tests: one shard, asp, replies handed back to
 * the test instead of sent. Include after <cmocka.h>. */
#ifndef TEST_INPROC_H
#define TEST_INPROC_H

#include "psd.h"

#include "ps_log.h"

#define INPROC_VALUE_BYTES_MAX (64u << 20)

/* The same with `workers` worker ids whose pulls may wait (psd --workers). */
static inline void inproc_start_workers(struct psd *s, struct ps_log *log, uint32_t workers)
{
    ps_log_init(log, "test", PS_LOG_ERROR);
    struct psd_params p = {.shard = 0,
                           .shards = 1,
                           .value_bytes_max = INPROC_VALUE_BYTES_MAX,
                           .wait_timeout_ms = 3600000};
    assert_int_equal(psd_cons_parse("asp", &p.cons), 0);
    p.cons.workers = workers;
    assert_int_equal(psd_init(s, log, &p), 0);
}

static inline void inproc_start(struct psd *s, struct ps_log *log)
{
    inproc_start_workers(s, log, 0);
}

/* Dispatches h, followed by a frame of `bytes` at data when data is not
 * NULL; the reply is the caller's to drop. */
static inline void inproc_request(struct psd *s, const Ps__Header *h, const void *data,
                                  size_t bytes, struct psd_reply *rep)
{
    uint8_t buf[512];
    struct ps_frame f[2] = {{buf, ps__header__pack(h, buf)}, {data, bytes}};
    struct ps_frame route = {"r", 1};
    assert_int_equal(psd_dispatch(s, &route, f, data != NULL ? 2 : 1, rep), 1);
}

/* Creates dense table 0, "t": `size` elements, all 1, plain SGD at lr 1. */
static inline void inproc_create_ones(struct psd *s, uint64_t size)
{
    Ps__TableSpec sp;
    ps__table_spec__init(&sp);
    sp.name = "t";
    sp.size = size;
    sp.lr = 1.0f;
    sp.init = PS__INIT_KIND__INIT_CONSTANT;
    sp.init_scale = 1.0f;
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &sp;
    struct psd_reply rep;
    inproc_request(s, &h, NULL, 0, &rep);
    psd_reply_drop(&rep);
}

#endif
