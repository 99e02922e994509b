/* The psd server core: its state and request dispatch, free of transport.
 *
 * psd_dispatch takes the frames of one request (after the routing id) and
 * produces one reply (a packed header and an optional values buffer). It
 * validates everything: malformed input gets an error reply, never an abort.
 * The zmq transport (net.c) and the fuzz targets both drive it. Owned by one
 * loop thread; no locks. */
#ifndef PSD_PSD_H
#define PSD_PSD_H

#include "ps_log.h"
#include "table.h"
#include "ps_wire.h"

#include "ps_limits.h"

#include <stdint.h>

#define PSD_OPS_COUNT 7 /* ps.Op values, OP_NONE included */

struct psd_counters {
    uint64_t requests;
    uint64_t errors;
    uint64_t bytes_in;
    uint64_t bytes_out;
    uint64_t by_op[PSD_OPS_COUNT];
};

struct psd {
    struct ps_log *log;
    uint32_t shard, shards;
    uint64_t value_bytes_max;
    uint64_t start_ns;

    struct psd_table *tables[PS_TABLES_MAX];
    uint32_t ntables;

    struct psd_counters ctr;
    uint64_t errors_logged; /* rate limit for malformed-request warnings */

    struct ps_arena arena;
    unsigned char *arena_buf;
    float *scratch; /* aligned copy of values when a frame is misaligned */
    size_t scratch_cap;
    uint8_t hdr_buf[PS_HEADER_BYTES_MAX];
};

/* One reply. hdr points into the server (valid until the next dispatch);
 * vals, when not NULL, is malloc'd and owned by the caller after dispatch
 * (release with free(), or hand to zmq with a free callback). */
struct psd_reply {
    const uint8_t *hdr;
    size_t hdr_len;
    void *vals;
    size_t vals_bytes;
};

int psd_init(struct psd *s, struct ps_log *log, uint32_t shard, uint32_t shards,
             uint64_t value_bytes_max);
void psd_fini(struct psd *s);

/* Handles one request. nframes counts every frame after the routing id (it
 * may exceed the array: frames past PS_FRAMES_MAX are counted, not passed).
 * Always produces a reply. */
void psd_dispatch(struct psd *s, const struct ps_frame *frames, size_t nframes,
                  struct psd_reply *rep);

#endif
