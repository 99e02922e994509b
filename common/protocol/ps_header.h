/* The header frame's fast codec: packs and unpacks the ps.Header of data
 * requests and replies (DESIGN.md: frame 1) without protobuf-c's generic,
 * descriptor-walking code, writing exactly the bytes protobuf-c would and
 * filling the same struct.
 *
 * It is not a second protobuf implementation. It takes only the flat
 * headers of the data path: integer, enum and bool fields, and, when
 * packing, the strings. Anything else it declines, and the caller hands
 * the message to protobuf-c, which stays the definition of what is valid:
 * a nested message (spec, stats), unknown fields, a field number it does
 * not know (a field added to ps.proto), a field given twice, any string
 * field when unpacking, a malformed or over-long varint. A differential
 * unit test (every field set through protobuf-c's descriptor, so a field
 * added to ps.proto and not here fails it) and the wire fuzz target check
 * that the two agree on everything it takes.
 *
 * Why: protobuf-c's pack and unpack of a small header cost about 4,000
 * instructions together, a third of the client's and of psd's own work
 * on a 4 KiB push-pull (tests/bench/HISTORY.md, "The 4 KiB push-pull at window 8"). */
#ifndef PS_HEADER_H
#define PS_HEADER_H

#include "ps.pb-c.h"

#include <stddef.h>
#include <stdint.h>

/* The most a header's fields 1..31 pack to, not counting the bytes of its
 * strings: a tag of up to 2 bytes and a varint (a value, or a string's
 * length) of up to 10 each. A buffer of this plus the strings' lengths
 * takes the fast path. */
#define PS_HEADER_FIELDS_BYTES_MAX (31u * 12u)

/* Packs h into buf[0..cap). Returns the bytes written, or -1 when it
 * declines h or h might not fit in cap; nothing is written then, and the
 * caller packs h with protobuf-c (which finds the exact size). */
int64_t ps_header_pack_fast(const Ps__Header *h, uint8_t *buf, size_t cap);

/* Unpacks len bytes as a ps.Header allocated (once the bytes are known
 * good) from a. Returns NULL when it declines them; nothing is allocated
 * then, and the caller unpacks them with protobuf-c, which accepts or
 * refuses them. The header is released as protobuf-c's would be. */
Ps__Header *ps_header_unpack_fast(ProtobufCAllocator *a, size_t len, const uint8_t *data);

/* Finds the length-delimited field number id (a string, bytes or a
 * nested message) in the len bytes of a protobuf message at p: *at and
 * *len are its contents. 1 found, 0 absent, -1 when the bytes do not parse
 * or the field is given twice. Used where protobuf-c loses what the check
 * needs (a string's length past an embedded NUL). */
int ps_header_field_bytes(const uint8_t *p, size_t n, uint32_t id, const uint8_t **at, size_t *len);

#endif
