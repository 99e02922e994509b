/* Writes the seed corpus of fuzz_records: what a primary sends a backup
 * that follows it (a state transfer in two pieces of a real checkpoint,
 * then records of requests, a dropped worker, a beat), in the framing of
 * fuzz_frames.h, for the target's shard (shard 0 of 1, 2 workers).
 *   record_seeds DIR   (writes DIR/records/) */
#include "fuzz_frames.h"

#include "checkpoint.h"
#include "psd.h"
#include "record.h"

#include "ps_err.h"
#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A seed being written: its bytes so far. */
struct seed {
    unsigned char buf[1 << 17];
    size_t n;
};

static void frame(struct seed *s, const void *p, size_t len)
{
    s->buf[s->n++] = (unsigned char)(len & 0xff);
    s->buf[s->n++] = (unsigned char)(len >> 8);
    memcpy(s->buf + s->n, p, len);
    s->n += len;
}

static size_t pack(const Ps__Header *h, uint8_t *out)
{
    return ps__header__pack(h, out);
}

/* A record header and, for a request, its frames. */
static void message(struct seed *s, const Ps__Header *rec, const Ps__Header *req, const void *vals,
                    size_t vbytes)
{
    static uint8_t a[1024], b[1024];
    s->buf[s->n++] = (unsigned char)(1 + (req != NULL) + (vals != NULL));
    frame(s, a, pack(rec, a));
    if (req != NULL)
        frame(s, b, pack(req, b));
    if (vals != NULL)
        frame(s, vals, vbytes);
}

static void request(struct seed *s, uint64_t seq, const Ps__Header *req, const void *vals,
                    size_t vbytes)
{
    Ps__Header rec;
    psd_record_header(&rec, PS__RECORD__REC_REQUEST, 5, seq);
    rec.route.data = (uint8_t *)"w0";
    rec.route.len = 2;
    message(s, &rec, req, vals, vbytes);
}

static void piece(struct seed *s, const unsigned char *file, size_t size, size_t off, size_t len)
{
    Ps__Header rec;
    psd_record_header(&rec, PS__RECORD__REC_SNAPSHOT, 5, 0);
    rec.offset = off;
    rec.count = size;
    rec.last = off + len >= size;
    s->buf[s->n++] = 2;
    static uint8_t a[256];
    frame(s, a, pack(&rec, a));
    frame(s, file + off, len);
}

static void save(const struct seed *s, const char *dir, int i)
{
    char path[512];
    snprintf(path, sizeof path, "%s/records/seed-%02d", dir, i);
    FILE *f = fopen(path, "wb");
    if (f != NULL) {
        fwrite(s->buf, 1, s->n, f);
        fclose(f);
    }
}

static void dispatch(struct psd *s, const Ps__Header *h, const void *vals, size_t vbytes)
{
    static uint8_t buf[1024];
    struct ps_frame f[2] = {{buf, pack(h, buf)}, {vals, vbytes}}, route = {"w0", 2};
    struct psd_reply rep;
    if (psd_dispatch(s, &route, f, vals ? 2 : 1, &rep))
        psd_reply_drop(&rep);
}

static Ps__TableSpec dense_spec(void)
{
    Ps__TableSpec sp;
    ps__table_spec__init(&sp);
    sp.name = "dense";
    sp.size = 1000;
    sp.optimizer = PS__OPTIMIZER_KIND__OPT_MOMENTUM;
    sp.lr = 0.1f;
    sp.momentum = 0.9f;
    return sp;
}

/* A checkpoint of the target's shard holding "dense", pushed once. */
static unsigned char *checkpoint(size_t *size)
{
    struct ps_log log;
    ps_log_init(&log, "seeds", PS_LOG_ERROR);
    struct psd_params p = {.shard = 0, .shards = 1, .value_bytes_max = UINT64_C(1) << 20};
    psd_cons_parse("asp", &p.cons);
    p.cons.workers = 2;
    static struct psd s;
    if (psd_init(&s, &log, &p) != 0)
        return NULL;
    Ps__TableSpec sp = dense_spec();
    Ps__Header h;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &sp;
    dispatch(&s, &h, NULL, 0);
    static const float g[16] = {1, 2, 3, 4};
    ps_wire_header_init(&h, PS__OP__OP_PUSH);
    h.count = 16;
    dispatch(&s, &h, g, sizeof g);
    char dir[] = "/tmp/psd-seeds-XXXXXX", path[4200], err[256];
    unsigned char *file = NULL;
    if (mkdtemp(dir) != NULL &&
        psd_checkpoint_write(&s, dir, path, sizeof path, err, sizeof err) == 0) {
        FILE *f = fopen(path, "rb");
        file = f ? malloc(1 << 16) : NULL;
        *size = file ? fread(file, 1, 1 << 16, f) : 0;
        if (f)
            fclose(f);
        unlink(path);
    }
    rmdir(dir);
    psd_fini(&s);
    return file;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: record_seeds DIR\n");
        return 2;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/records", argv[1]);
    mkdir(argv[1], 0755);
    mkdir(path, 0755);
    size_t size = 0;
    unsigned char *file = checkpoint(&size);
    if (file == NULL || size == 0 || size >= 0xffff) {
        fprintf(stderr, "record_seeds: no checkpoint to cut into pieces\n");
        return 1;
    }
    static struct seed s;
    Ps__Header h;
    static const float g[16] = {1, 1, 1, 1};
    /* 0: a transfer in two pieces, then requests, a drop and a beat */
    s.n = 0;
    s.buf[s.n++] = 0;
    piece(&s, file, size, 0, size / 2);
    piece(&s, file, size, size / 2, size - size / 2);
    ps_wire_header_init(&h, PS__OP__OP_HELLO);
    h.session = 9;
    request(&s, 1, &h, NULL, 0);
    ps_wire_header_init(&h, PS__OP__OP_PUSH);
    h.count = 16;
    h.request_id = 2;
    request(&s, 2, &h, g, sizeof g);
    Ps__Header rec;
    psd_record_header(&rec, PS__RECORD__REC_DROP, 5, 3);
    rec.worker_id = 1;
    message(&s, &rec, NULL, NULL, 0);
    psd_record_header(&rec, PS__RECORD__REC_BEAT, 5, 3);
    message(&s, &rec, NULL, NULL, 0);
    save(&s, argv[1], 0);
    /* 1: a replica holding a state (bit 2), bsp: a table made and pushed
     * by records, then one missing (a resync), and a refusal */
    s.n = 0;
    s.buf[s.n++] = 4 | 1;
    Ps__TableSpec sp = dense_spec();
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &sp;
    request(&s, 1, &h, NULL, 0);
    ps_wire_header_init(&h, PS__OP__OP_PUSH_PULL);
    h.count = 16;
    request(&s, 2, &h, g, sizeof g);
    request(&s, 4, &h, g, sizeof g);
    ps_wire_header_init(&h, PS__OP__OP_PULL);
    h.status = PS_ENOTPRIMARY;
    static uint8_t a[256];
    s.buf[s.n++] = 1;
    frame(&s, a, pack(&h, a));
    save(&s, argv[1], 1);
    /* 2: the pieces out of order */
    s.n = 0;
    s.buf[s.n++] = 2;
    piece(&s, file, size, size / 2, size - size / 2);
    piece(&s, file, size, 0, size / 2);
    save(&s, argv[1], 2);
    /* 3: a sparse table that evicts by time, made by a record; an age
     * floor it takes, then one past its tick (a resync) */
    s.n = 0;
    s.buf[s.n++] = 4 | 1;
    Ps__TableSpec ts;
    ps__table_spec__init(&ts);
    ts.name = "timed";
    ts.sparse = 1;
    ts.dim = 4;
    ts.rows_max = 64;
    ts.lr = 0.1f;
    ts.evict_after_s = 1;
    ps_wire_header_init(&h, PS__OP__OP_CREATE_TABLE);
    h.spec = &ts;
    request(&s, 1, &h, NULL, 0);
    psd_record_header(&rec, PS__RECORD__REC_AGE_FLOOR, 5, 2);
    rec.table_id = 0;
    rec.offset = 1;
    message(&s, &rec, NULL, NULL, 0);
    psd_record_header(&rec, PS__RECORD__REC_AGE_FLOOR, 5, 3);
    rec.offset = 99;
    message(&s, &rec, NULL, NULL, 0);
    save(&s, argv[1], 3);
    free(file);
    return 0;
}
