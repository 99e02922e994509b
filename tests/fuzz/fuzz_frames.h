/* The byte layout fuzz inputs use for multipart messages, shared by the
 * targets and the seed generator: a frame count byte, then per frame a
 * 16-bit little-endian length and that many bytes (cut short at the end
 * of the input). A dispatch input is a mode byte, then messages. */
#ifndef PSFUZZ_FRAMES_H
#define PSFUZZ_FRAMES_H

#include "ps_wire.h"

#include <stddef.h>
#include <stdint.h>

#define FUZZ_FRAMES_MAX 6

/* fuzz_replies: the requests an input's first byte names (make_seeds
 * writes a right answer to each). */
#define FUZZ_REPLY_REQUESTS 13

/* Reads one message at *pos; returns the number of frames (<= max). */
static inline size_t fuzz_message(const uint8_t *data, size_t size, size_t *pos,
                                  struct ps_frame *frames, size_t max)
{
    if (*pos >= size)
        return 0;
    size_t n = data[(*pos)++] % (max + 1);
    for (size_t i = 0; i < n; i++) {
        size_t len = 0;
        if (*pos + 2 <= size) {
            len = (size_t)data[*pos] | (size_t)data[*pos + 1] << 8;
            *pos += 2;
        } else {
            *pos = size;
        }
        if (len > size - *pos)
            len = size - *pos;
        frames[i].data = data + *pos;
        frames[i].size = len;
        *pos += len;
    }
    return n;
}

#endif
