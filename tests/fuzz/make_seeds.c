/* Writes the seed corpus of the fuzz targets: every malformed case of the
 * shared table plus valid requests, in the framing of fuzz_frames.h.
 *   make_seeds DIR   (writes DIR/wire/, DIR/dispatch/ and DIR/replies/) */
#include "cases.h"
#include "fuzz_frames.h"

#include "ps_limits.h"
#include "ps_wire.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static size_t frame_bytes(const struct case_msg *m, unsigned char *out)
{
    size_t n = 0;
    out[n++] = (unsigned char)m->nframes;
    for (size_t i = 0; i < m->nframes; i++) {
        size_t len = m->size[i] > 0xffff ? 0xffff : m->size[i];
        out[n++] = (unsigned char)(len & 0xff);
        out[n++] = (unsigned char)(len >> 8);
        memcpy(out + n, m->data[i], len);
        n += len;
    }
    return n;
}

static void write_file(const char *dir, const char *sub, size_t i, const unsigned char *b, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s/seed-%02zu", dir, sub, i);
    FILE *f = fopen(path, "wb");
    if (f != NULL) {
        fwrite(b, 1, n, f);
        fclose(f);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds DIR\n");
        return 2;
    }
    char path[512];
    mkdir(argv[1], 0755);
    snprintf(path, sizeof path, "%s/wire", argv[1]);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/dispatch", argv[1]);
    mkdir(path, 0755);
    static unsigned char buf[8 * CASE_FRAME_BYTES_MAX];
    for (size_t i = 0; i < bad_cases_count; i++) {
        struct case_msg m;
        if (case_msg_alloc(&m) != 0)
            return 1;
        bad_cases[i].build(&m);
        size_t n = frame_bytes(&m, buf + 1);
        if (n < 4096) { /* keep the corpus small: the oversize cases are left out */
            write_file(argv[1], "wire", i, buf + 1, n);
            buf[0] = (unsigned char)(i % 3); /* a mode byte for dispatch */
            write_file(argv[1], "dispatch", i, buf, n + 1);
        }
        case_msg_free(&m);
    }
    /* valid: a pull, a push and a push-pull of the dense table (id 0), and
     * a heartbeat */
    struct case_msg m;
    if (case_msg_alloc(&m) != 0)
        return 1;
    const Ps__Op ops[4] = {PS__OP__OP_PULL, PS__OP__OP_PUSH, PS__OP__OP_PUSH_PULL,
                           PS__OP__OP_HEARTBEAT};
    for (int k = 0; k < 4; k++) {
        Ps__Header h;
        ps_wire_header_init(&h, ops[k]);
        h.count = 8;
        h.offset = 992;
        m.size[0] = ps__header__pack(&h, m.data[0]);
        m.nframes = 1;
        if (ops[k] == PS__OP__OP_PUSH || ops[k] == PS__OP__OP_PUSH_PULL) {
            memset(m.data[1], 0x3f, 32);
            m.size[1] = 32;
            m.nframes = 2;
        }
        size_t n = frame_bytes(&m, buf + 1);
        write_file(argv[1], "wire", 100 + (size_t)k, buf + 1, n);
        buf[0] = (unsigned char)k;
        write_file(argv[1], "dispatch", 100 + (size_t)k, buf, n + 1);
    }
    /* shared memory (the dispatch target binds an 8 KiB region when bit 3
     * of the mode byte is set): a push-pull reading and writing the region,
     * and a pull whose reply would end past it */
    for (int k = 0; k < 2; k++) {
        Ps__Header h;
        ps_wire_header_init(&h, k == 0 ? PS__OP__OP_PUSH_PULL : PS__OP__OP_PULL);
        h.count = 8;
        h.offset = 992;
        h.shm = k == 0 ? PS_SHM_IN | PS_SHM_OUT : PS_SHM_OUT;
        h.shm_in = 64;
        h.shm_out = k == 0 ? 4096 : 8192 - 16;
        m.size[0] = ps__header__pack(&h, m.data[0]);
        m.nframes = 1;
        size_t n = frame_bytes(&m, buf + 1);
        write_file(argv[1], "wire", 110 + (size_t)k, buf + 1, n);
        buf[0] = (unsigned char)(8 | k);
        write_file(argv[1], "dispatch", 110 + (size_t)k, buf, n + 1);
    }
    /* keyed pushes into the dense table with the keys in the region (the
     * dispatch target's region starts with the keys 0..511): the values
     * there too, then the values in a frame */
    for (int k = 0; k < 2; k++) {
        Ps__Header h;
        ps_wire_header_init(&h, PS__OP__OP_PUSH);
        h.layout = PS__LAYOUT__LAYOUT_KEYS;
        h.count = 8;
        h.shm = k == 0 ? PS_SHM_KEYS | PS_SHM_IN : PS_SHM_KEYS;
        h.shm_keys = 8 * (uint64_t)k;
        h.shm_in = 4096;
        m.size[0] = ps__header__pack(&h, m.data[0]);
        m.nframes = 1;
        if (k == 1) {
            memset(m.data[1], 0x3c, 32);
            m.size[1] = 32;
            m.nframes = 2;
        }
        size_t n = frame_bytes(&m, buf + 1);
        write_file(argv[1], "wire", 130 + (size_t)k, buf + 1, n);
        buf[0] = 8;
        write_file(argv[1], "dispatch", 130 + (size_t)k, buf, n + 1);
    }
    /* batches (OP_BATCH): a push-pull through the region, a pull and a
     * hello in one; and the same records with a count one short */
    static uint8_t recs[PS_BATCH_BYTES_MAX];
    size_t rlen = 0;
    const Ps__Op bops[3] = {PS__OP__OP_PUSH_PULL, PS__OP__OP_PULL, PS__OP__OP_HELLO};
    for (int k = 0; k < 3; k++) {
        Ps__Header h;
        uint8_t hb[256];
        ps_wire_header_init(&h, bops[k]);
        h.request_id = (uint64_t)k + 1;
        h.count = 8;
        h.offset = 992;
        if (k == 0) {
            h.shm = PS_SHM_IN | PS_SHM_OUT;
            h.shm_in = 64;
            h.shm_out = 4096;
        }
        size_t hl = ps__header__pack(&h, hb);
        if (ps_wire_batch_add(recs, sizeof recs, &rlen, hb, hl) != 0)
            return 1;
    }
    for (int k = 0; k < 2; k++) {
        Ps__Header h;
        ps_wire_header_init(&h, PS__OP__OP_BATCH);
        h.count = (uint64_t)(3 - k);
        m.size[0] = ps__header__pack(&h, m.data[0]);
        memcpy(m.data[1], recs, rlen);
        m.size[1] = rlen;
        m.nframes = 2;
        size_t n = frame_bytes(&m, buf + 1);
        write_file(argv[1], "wire", 120 + (size_t)k, buf + 1, n);
        buf[0] = 8;
        write_file(argv[1], "dispatch", 120 + (size_t)k, buf, n + 1);
    }
    /* fuzz_replies: the answer each of its requests (the first byte)
     * expects from a shard, right; the target gives it the request's id */
    snprintf(path, sizeof path, "%s/replies", argv[1]);
    mkdir(path, 0755);
    for (int k = 0; k < FUZZ_REPLY_REQUESTS; k++) {
        Ps__Header h;
        Ps__Stats st;
        Ps__TableStats ts, *tsp = &ts;
        ps_wire_header_init(&h, PS__OP__OP_PULL);
        m.nframes = 1;
        size_t floats = 0, nkeys = 0;
        if (k <= 3) { /* dense pull, push, push-pull, view: [0, 16) or [100, +16) */
            h.offset = k == 1 ? 100 : 0;
            h.count = 16;
            floats = k == 1 ? 0 : 16;
        } else if (k == 4) { /* keyed push */
            h.layout = PS__LAYOUT__LAYOUT_KEYS;
        } else if (k <= 7) { /* rows of dim 4: pull, push, push-pull of 2 keys */
            h.layout = PS__LAYOUT__LAYOUT_KEYS;
            h.count = 2;
            h.dim = 4;
            floats = k == 6 ? 0 : 8;
        } else if (k == 8) { /* a page of 2 rows of 20 */
            h.layout = PS__LAYOUT__LAYOUT_KEYS;
            h.count = 2;
            h.dim = 4;
            h.rows = 20;
            nkeys = 2;
            floats = 8;
        } else if (k == 9 || k == 10 || k == 12) { /* stats, with one table */
            ps__stats__init(&st);
            ps__table_stats__init(&ts);
            ts.name = "dense";
            ts.optimizer = "sgd";
            ts.size = 1000;
            ts.hi = 1000;
            ts.id = 1;
            st.consistency = "asp";
            st.shards = 1;
            st.n_tables = 1;
            st.tables = &tsp;
            h.stats = &st;
        } else { /* a checkpoint written */
            h.detail = "shard-0-of-1-0000000000000001.safetensors";
        }
        m.size[0] = ps__header__pack(&h, m.data[0]);
        if (nkeys > 0) {
            for (size_t i = 0; i < nkeys; i++) {
                uint64_t key = 10 * i + 3;
                memcpy(m.data[m.nframes] + 8 * i, &key, 8);
            }
            m.size[m.nframes++] = 8 * nkeys;
        }
        if (floats > 0) {
            memset(m.data[m.nframes], 0x3f, 4 * floats);
            m.size[m.nframes++] = 4 * floats;
        }
        buf[0] = (unsigned char)k;
        size_t n = frame_bytes(&m, buf + 1);
        write_file(argv[1], "replies", (size_t)k, buf, n + 1);
    }
    /* answers with twice what was asked, consistent in themselves: a pull
     * of 16 answered with 32 values, a row pull of 2 with 4 rows (the
     * client's buffers are of the asked size) */
    for (int k = 0; k < 2; k++) {
        Ps__Header h;
        ps_wire_header_init(&h, PS__OP__OP_PULL);
        h.count = k == 0 ? 32 : 4;
        if (k == 1) {
            h.layout = PS__LAYOUT__LAYOUT_KEYS;
            h.dim = 4;
        }
        m.size[0] = ps__header__pack(&h, m.data[0]);
        memset(m.data[1], 0x3f, 128);
        m.size[1] = 128;
        m.nframes = 2;
        buf[0] = (unsigned char)(k == 0 ? 0 : 5);
        size_t n = frame_bytes(&m, buf + 1);
        write_file(argv[1], "replies", FUZZ_REPLY_REQUESTS + (size_t)k, buf, n + 1);
    }
    case_msg_free(&m);
    return 0;
}
