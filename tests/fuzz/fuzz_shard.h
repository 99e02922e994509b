/* The shard the server-side fuzz targets drive: shard 0 of 1, 2
 * workers, small limits, waits that expire at once, and the consistency
 * mode an input's first byte names (asp, bsp or ssp:1), silent. */
#ifndef PSFUZZ_SHARD_H
#define PSFUZZ_SHARD_H

#include "psd.h"

#include "ps_log.h"

#include <stdint.h>

/* 0, or what psd_init returned. */
static inline int fuzz_shard(struct psd *s, struct ps_log *log, uint8_t mode)
{
    static const char *const modes[] = {"asp", "bsp", "ssp:1"};
    ps_log_init(log, "fuzz", PS_LOG_ERROR - 1); /* silent */
    struct psd_params p = {.shard = 0,
                           .shards = 1,
                           .value_bytes_max = UINT64_C(1) << 20,
                           .wait_timeout_ms = 1,
                           .table_bytes_max = UINT64_C(1) << 24};
    psd_cons_parse(modes[mode % 3], &p.cons);
    p.cons.workers = 2;
    return psd_init(s, log, &p);
}

#endif
