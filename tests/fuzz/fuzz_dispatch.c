/* libFuzzer target: the whole request dispatch of an in-process psd. Each
 * input gets a fresh server (mode from the first byte: asp, bsp or ssp:1,
 * 2 workers, small limits) holding a dense and a sparse table, then a
 * sequence of messages; with bit 2 of that byte, a worker is dropped from
 * the live set after every fourth message (what --worker-timeout does);
 * with bit 3, the messages' connection has a shared region bound. Every message must get a
 * reply or wait; nothing may crash, leak or trip a sanitizer; waiting pulls are then expired. */
#include "fuzz_frames.h"
#include "fuzz_shard.h"

#include "catalog.h"
#include "counters.h"
#include "psd.h"
#include "waits.h"

#include "ps_err.h"
#include "ps_log.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void sink(void *ctx, const void *route, size_t route_len, struct psd_reply *rep)
{
    (void)ctx;
    (void)route;
    (void)route_len;
    psd_reply_drop(rep);
}

static void create(struct psd *s, const char *name, int sparse)
{
    Ps__Header h;
    Ps__TableSpec sp;
    ps__table_spec__init(&sp);
    sp.name = (char *)name;
    sp.size = sparse ? 0 : 1000;
    sp.sparse = sparse;
    sp.dim = sparse ? 4 : 0;
    sp.rows_max = sparse ? 64 : 0;
    sp.optimizer = sparse ? PS__OPTIMIZER_KIND__OPT_ADAM : PS__OPTIMIZER_KIND__OPT_MOMENTUM;
    sp.lr = 0.1f;
    sp.momentum = 0.9f;
    sp.beta1 = 0.9f;
    sp.beta2 = 0.999f;
    sp.eps = 1e-8f;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &sp;
    uint8_t buf[512];
    struct ps_frame f = {buf, ps__header__pack(&h, buf)}, route = {"r", 1};
    struct psd_reply rep;
    if (psd_dispatch(s, &route, &f, 1, &rep))
        psd_reply_drop(&rep);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    struct ps_log log;
    static struct psd s; /* psd_init fills it; psd_fini empties it */
    if (fuzz_shard(&s, &log, data[0]) != 0)
        return 0;
    psd_set_sender(&s, sink, NULL);
    create(&s, "dense", 0);
    create(&s, "sparse", 1);
    /* with bit 3, a shared region of 8 KiB bound to the fuzzed messages'
     * connection "w" (they name offsets into it; the hello binds it); its
     * first 4 KiB hold the keys 0..511, for keyed pushes to name */
    if (data[0] & 8) {
        void *m = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        for (uint64_t k = 0; m != MAP_FAILED && k < 512; k++)
            memcpy((uint8_t *)m + k * 8, &k, 8);
        if (m != MAP_FAILED && psd_shm_take(&s, 7, m, 8192) != 0)
            munmap(m, 8192);
        Ps__Header h;
        ps_wire_header_init(&h, PS__OP__OP_HELLO);
        h.shm_token = 7;
        uint8_t buf[64];
        struct ps_frame f = {buf, ps__header__pack(&h, buf)}, route = {"w", 1};
        struct psd_reply rep;
        if (psd_dispatch(&s, &route, &f, 1, &rep))
            psd_reply_drop(&rep);
    }
    size_t pos = 1;
    for (int msgs = 0; pos < size && msgs < 64; msgs++) {
        struct ps_frame frames[FUZZ_FRAMES_MAX], route = {"w", 1};
        size_t n = fuzz_message(data, size, &pos, frames, FUZZ_FRAMES_MAX);
        struct psd_reply rep;
        if (psd_dispatch(&s, &route, frames, n, &rep))
            psd_reply_drop(&rep);
        if ((data[0] & 4) && msgs % 4 == 3)
            psd_drop_worker(&s, (uint32_t)(msgs / 4) % 2);
    }
    psd_tick(&s); /* expire what waits (1 ms deadline) once time has passed */
    psd_fini(&s);
    return 0;
}
