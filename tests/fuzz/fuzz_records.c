/* libFuzzer target: what a backup reads from its primary (repl/follow.c,
 * psd__repl_message): records of requests to apply, workers dropped,
 * beats, refusals, and the pieces of a state transfer that it writes to
 * a file and loads as its shard's state. Each input gets a fresh shard
 * (mode from the first byte's low bits: asp, bsp or ssp:1; 2 workers)
 * and a replica following a primary: with bit 2 of that byte it already
 * holds a state at epoch 5, else it waits for one (epoch 0: the first
 * piece names it). Then a sequence of messages in fuzz_frames.h's
 * framing. Nothing may crash, leak or trip a sanitizer; acknowledgements
 * and follows go to a socket connected to nobody. */
#include "fuzz_frames.h"
#include "fuzz_shard.h"

#include "catalog.h"
#include "psd.h"
#include "repl_impl.h"

#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What lives across inputs: the socket acknowledgements go to, the
 * directory transfers are written into, the arenas. */
static void *zctx, *sock;
static char dir[64];
static unsigned char *arenas;

static int once(void)
{
    if (sock != NULL)
        return 0;
    snprintf(dir, sizeof dir, "/tmp/psd-fuzz-records-XXXXXX");
    zctx = zmq_ctx_new();
    sock = zctx ? zmq_socket(zctx, ZMQ_DEALER) : NULL;
    arenas = malloc(2 * PSD_REPL_ARENA_BYTES);
    int zero = 0;
    if (sock == NULL || arenas == NULL || mkdtemp(dir) == NULL ||
        zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero) != 0)
        return -1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0 || once() != 0)
        return 0;
    struct ps_log log;
    static struct psd s; /* psd_init fills it; psd_fini empties it */
    if (fuzz_shard(&s, &log, data[0]) != 0)
        return 0;
    static struct psd_repl r;
    memset(&r, 0, sizeof r);
    r.srv = &s;
    r.log = &log;
    r.role = PSD_ROLE_BACKUP;
    r.follow = sock;
    r.snap_fd = -1;
    r.timeout_ms = 500;
    r.lead.id = 0xb;
    snprintf(r.lead.endpoint, sizeof r.lead.endpoint, "tcp://backup:5570");
    snprintf(r.primary, sizeof r.primary, "tcp://primary:5570");
    snprintf(r.snap_dir, sizeof r.snap_dir, "%s", dir);
    ps_arena_init(&r.req_arena, arenas, PSD_REPL_ARENA_BYTES);
    ps_arena_init(&r.rec_arena, arenas + PSD_REPL_ARENA_BYTES, PSD_REPL_ARENA_BYTES);
    if (data[0] & 4) { /* holds its primary's state at epoch 5, record 0 */
        r.epoch = 5;
        r.loaded = 1;
    }
    size_t pos = 1;
    for (int msgs = 0; pos < size && msgs < 64; msgs++) {
        struct ps_frame frames[FUZZ_FRAMES_MAX];
        size_t n = fuzz_message(data, size, &pos, frames, FUZZ_FRAMES_MAX);
        zmq_msg_t parts[FUZZ_FRAMES_MAX];
        for (size_t i = 0; i < n; i++) {
            zmq_msg_init_size(&parts[i], frames[i].size);
            if (frames[i].size > 0)
                memcpy(zmq_msg_data(&parts[i]), frames[i].data, frames[i].size);
        }
        psd__repl_message(&r, parts, n > PARTS_MAX ? PARTS_MAX : n, n);
        for (size_t i = 0; i < n; i++)
            zmq_msg_close(&parts[i]);
    }
    psd_tick(&s);
    psd_fini(&s);
    char path[sizeof dir + 16];
    snprintf(path, sizeof path, "%s/transfer", dir);
    unlink(path);
    return 0;
}
