/* Wire messages: encode and decode the multipart message of DESIGN.md, and
 * validate everything in it that does not need server state.
 *
 * A message is frames: [header][keys?][values?]. The header is a protobuf-c
 * ps.Header; keys are uint64 little-endian; values are count*dim elements of
 * the header's dtype. Decoding unpacks the header into a caller-provided
 * arena (no malloc per message), checks version, op, dtype, layout, frame
 * count for the op, exact byte lengths, overflow of offset+count, limits and
 * table-spec sanity, and points into the frames without copying them.
 * It does not know about tables (unknown table ids, ranges past a shard are
 * the server's checks) and it does not touch sockets. */
#ifndef PS_WIRE_H
#define PS_WIRE_H

#include <limits.h> /* INT_MAX, used by the generated header */

#include "ps.pb-c.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <endian.h>

struct ps_frame {
    const void *data;
    size_t size;
};

/* Bump allocator for protobuf-c unpack. Fixed capacity set at init; an
 * unpack that needs more fails cleanly instead of growing. */
struct ps_arena {
    unsigned char *buf;
    size_t cap;
    size_t used;
    ProtobufCAllocator pa;
};

void ps_arena_init(struct ps_arena *a, void *buf, size_t cap);
void ps_arena_reset(struct ps_arena *a);

/* A decoded message. Pointers refer into the frames given to decode and
 * into the arena: valid while both are. */
struct ps_wire_msg {
    Ps__Header *hdr;
    const void *keys; /* count uint64 LE, may be unaligned; NULL if none */
    size_t keys_bytes;
    const void *vals; /* count*dim elements of hdr->dtype; NULL if none */
    size_t vals_bytes;
    const uint8_t *mask; /* LAYOUT_MASK, _CHANGED replies: count bits; vals has the set ones */
    size_t mask_bytes;
    const uint8_t *batch; /* OP_BATCH requests: count records (ps_wire_batch_next) */
    size_t batch_bytes;
};

/* Header.shm bits: values in the client's shared region instead of a frame
 * (see ps.proto). Dense ranges of f32; and a keyed push into a dense table
 * (layout keys, dim 1), whose keys (PS_SHM_KEYS) and f32 values
 * (PS_SHM_IN) may each lie there. The decoder cannot read the region: a
 * request with PS_SHM_KEYS has keys NULL, and the server checks the keys
 * once it has copied them out. */
#define PS_SHM_IN   1u
#define PS_SHM_OUT  2u
#define PS_SHM_KEYS 4u

enum ps_wire_dir {
    PS_WIRE_REQUEST = 0,
    PS_WIRE_REPLY = 1,
};

/* Bytes per element of a wire dtype, 0 when unknown. */
size_t ps_dtype_size(int dtype);
/* "f32", "f16", "bf16" or "?". */
const char *ps_dtype_name(int dtype);
/* "pull", "push", ... or "?". */
const char *ps_op_name(int op);

/* Decodes and validates frames[0..nframes). On success returns 0 and fills
 * *out. On failure returns a negative PS_E* code and writes a sentence for a
 * person into err (always NUL-terminated); if the header itself decoded,
 * out->hdr is set so a reply can echo its request id, else it is NULL.
 * value_bytes_max bounds the values frame (the flag-set message ceiling). */
int ps_wire_decode(struct ps_arena *arena, const struct ps_frame *frames, size_t nframes,
                   enum ps_wire_dir dir, uint64_t value_bytes_max, struct ps_wire_msg *out,
                   char *err, size_t errlen);

/* Validates a table spec (name, size, optimizer hyper-parameters, init). */
int ps_wire_check_spec(const Ps__TableSpec *spec, char *err, size_t errlen);

/* Initialises a header for `op` with the current protocol version. */
void ps_wire_header_init(Ps__Header *h, Ps__Op op);

/* Packs h into buf[0..cap). Returns bytes written, or PS_ELIMIT when the
 * packed header would exceed cap or PS_HEADER_BYTES_MAX (nothing is
 * written then). */
int64_t ps_wire_header_pack(const Ps__Header *h, uint8_t *buf, size_t cap);

/* 1 for the ops that move values (pull, push, push-pull): the ones whose
 * requests a batch may carry. */
int ps_wire_op_moves_data(int op);

/* OP_BATCH records (ps.proto): the record at *pos of recs[0..bytes) into
 * *out (pointing into recs), *pos moved past it. 0 when there is no whole
 * non-empty record there. */
int ps_wire_batch_next(const uint8_t *recs, size_t bytes, size_t *pos, struct ps_frame *out);
/* Appends a record of hdr[0..hdr_len) to buf[0..*len) of cap bytes: 0, or
 * PS_ELIMIT when it does not fit (nothing written). */
int ps_wire_batch_add(uint8_t *buf, size_t cap, size_t *len, const uint8_t *hdr, size_t hdr_len);

/* Reads key i of a keys frame (handles unaligned frames): one load on a
 * little-endian host. Inline: it runs once per key of every request. */
static inline uint64_t ps_wire_key(const void *keys, size_t i)
{
    uint64_t k;
    memcpy(&k, (const unsigned char *)keys + i * 8u, sizeof k);
    return le64toh(k);
}

/* The first i in [1, n) with key i not above key i-1 (keys as a keys
 * frame lays them out), or n when they strictly increase. With AVX2 where
 * the CPU has it; _plain never uses it (the tests hold the two to the same
 * answers on a machine that has it). */
size_t ps_wire_keys_unordered(const void *keys, size_t n);
size_t ps_wire_keys_unordered_plain(const void *keys, size_t n);

#endif
