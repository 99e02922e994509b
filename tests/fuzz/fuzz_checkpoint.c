/* libFuzzer target: the checkpoint reader. A checkpoint is input from a
 * file: whatever its bytes, loading must fail cleanly or restore tables
 * that the server can then serve, never crash or leak. Each input is
 * written to a file and loaded into a fresh server (bsp, 2 workers, shard 0
 * of 1), which then answers a pull of table 0. */
#include "checkpoint.h"
#include "catalog.h"
#include "counters.h"
#include "psd.h"
#include "waits.h"

#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>
#include <zlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Rewrites the header's crc32 (same length) to match the data (and, in
 * a version 2 file, the state), so that mutations get past the checksum
 * to the state and tensor checks. */
static void fix_crc(uint8_t *buf, size_t size)
{
    if (size < 8)
        return;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | buf[i];
    if (n > size - 8)
        return;
    const char *key = "\"crc32\":\"";
    size_t kl = strlen(key);
    for (size_t i = 8; i + kl + 8 <= 8 + n; i++) {
        if (memcmp(buf + i, key, kl) != 0)
            continue;
        unsigned long crc = crc32_z(crc32(0L, Z_NULL, 0), buf + 8 + n, size - 8 - n);
        json_t *hdr = json_loadb((const char *)buf + 8, n, 0, NULL);
        json_t *meta = json_object_get(hdr, "__metadata__");
        const char *version = json_string_value(json_object_get(meta, "version"));
        const char *state = json_string_value(json_object_get(meta, "state"));
        if (version != NULL && strcmp(version, "2") == 0 && state != NULL) /* sums the state too */
            crc = crc32_z(crc, (const unsigned char *)state, strlen(state));
        json_decref(hdr);
        char hex[9];
        snprintf(hex, sizeof hex, "%08lx", crc);
        memcpy(buf + i + kl, hex, 8);
        return;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    if (path[0] == '\0')
        snprintf(path, sizeof path, "/tmp/psd-fuzz-ckpt.%ld", (long)getpid());
    FILE *f = fopen(path, "wb");
    uint8_t *copy = malloc(size ? size : 1);
    if (f == NULL || copy == NULL) {
        if (f)
            fclose(f);
        free(copy);
        return 0;
    }
    memcpy(copy, data, size);
    fix_crc(copy, size);
    fwrite(copy, 1, size, f);
    fclose(f);
    free(copy);
    struct ps_log log;
    ps_log_init(&log, "fuzz", PS_LOG_ERROR - 1);
    struct psd_params p = {.shard = 0,
                           .shards = 1,
                           .value_bytes_max = UINT64_C(1) << 20,
                           .table_bytes_max = UINT64_C(1) << 24};
    psd_cons_parse("bsp", &p.cons);
    p.cons.workers = 2;
    static struct psd s;
    if (psd_init(&s, &log, &p) != 0)
        return 0;
    char err[512];
    if (psd_checkpoint_load(&s, path, err, sizeof err) == 0 && psd_ntables(&s) > 0) {
        Ps__Header h;
        ps_wire_header_init(&h, PS__OP__OP_PULL);
        h.count = 1;
        h.offset = psd_table_at(&s, 0)->lo;
        h.clock = psd_table_at(&s, 0)->clock;
        uint8_t buf[256];
        struct ps_frame fr = {buf, ps__header__pack(&h, buf)}, route = {"r", 1};
        struct psd_reply rep;
        if (psd_dispatch(&s, &route, &fr, 1, &rep))
            psd_reply_drop(&rep);
    }
    psd_fini(&s);
    return 0;
}
