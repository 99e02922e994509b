/* libFuzzer target: the wire decoder, as a request and as a reply. It must
 * return a code for anything, never crash, read out of bounds or leak;
 * when it accepts, every key and value byte it points to must be readable.
 * The header frame is also unpacked by the fast path and by protobuf-c
 * alone: where the fast path takes the bytes, the two must agree. */
#include "fuzz_frames.h"
#include "header_diff.h"

#include "ps_limits.h"
#include "ps_wire.h"

#include <string.h>

static unsigned char arena_buf[PS_ARENA_BYTES_SERVER];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ps_frame frames[FUZZ_FRAMES_MAX];
    size_t pos = 0;
    size_t n = fuzz_message(data, size, &pos, frames, FUZZ_FRAMES_MAX);
    struct ps_arena arena;
    ps_arena_init(&arena, arena_buf, sizeof arena_buf);
    int taken;
    if (n > 0 && frames[0].size <= PS_HEADER_BYTES_MAX &&
        header_diff(&arena, frames[0].data, frames[0].size, &taken) != 0)
        __builtin_trap(); /* the fast path and protobuf-c disagree */
    for (int dir = 0; dir < 2; dir++) {
        struct ps_wire_msg m;
        char err[PS_ERROR_TEXT_MAX];
        if (ps_wire_decode(&arena, frames, n, (enum ps_wire_dir)dir, UINT64_C(1) << 20, &m, err,
                           sizeof err) != 0)
            continue;
        volatile uint64_t sink = 0; /* touch everything the decoder vouched for */
        for (size_t i = 0; m.keys && i < m.hdr->count; i++)
            sink += ps_wire_key(m.keys, i);
        for (size_t i = 0; i < m.vals_bytes; i++)
            sink += ((const uint8_t *)m.vals)[i];
        for (size_t i = 0; i < m.mask_bytes; i++)
            sink += m.mask[i];
        (void)sink;
    }
    return 0;
}
