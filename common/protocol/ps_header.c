/* The header frame's fast codec (ps_header.h). The wire format is
 * protobuf's: a field is a varint tag (number << 3 | wire type), then a
 * varint (wire type 0) or a varint length and that many bytes (wire type
 * 2); proto3 fields at their zero value are not sent; fields go out in
 * number order, as protobuf-c writes them. */
#include "ps_header.h"

#include <string.h>

/* A varint is at most 10 bytes; a tag (a 32-bit number) at most 5. */
#define VARINT_BYTES_MAX 10u
#define TAG_BYTES_MAX    5u

/* The fields this codec packs and unpacks, in number order: (number,
 * member, kind). Both directions expand this one list. 14 (spec) and 15
 * (stats) are nested messages: packing declines a header that sets them,
 * and unpacking declines their numbers. Kinds: u32, u64, i32 (int32 and
 * enums: a negative one is sign-extended to 10 bytes), s32 (zigzag), bool,
 * str (packed; unpacking declines it). */
#define HEADER_FIELDS(X)                                                                           \
    X(1, version, u32)                                                                             \
    X(2, op, i32)                                                                                  \
    X(3, request_id, u64)                                                                          \
    X(4, worker_id, u32)                                                                           \
    X(5, table_id, u32)                                                                            \
    X(6, clock, u64)                                                                               \
    X(7, dtype, i32)                                                                               \
    X(8, layout, i32)                                                                              \
    X(9, offset, u64)                                                                              \
    X(10, count, u64)                                                                              \
    X(11, dim, u32)                                                                                \
    X(12, status, s32)                                                                             \
    X(13, error, str)                                                                              \
    X(16, shard, u32)                                                                              \
    X(17, shards, u32)                                                                             \
    X(18, nonzero_only, bool)                                                                      \
    X(19, session, u64)                                                                            \
    X(20, duplicate, bool)                                                                         \
    X(21, stale, bool)                                                                             \
    X(22, detail, str)                                                                             \
    X(23, rows, u64)                                                                               \
    X(24, local_endpoint, str)                                                                     \
    X(25, instance, u64)                                                                           \
    X(26, shm_token, u64)                                                                          \
    X(27, shm, u32)                                                                                \
    X(28, shm_in, u64)                                                                             \
    X(29, shm_out, u64)                                                                            \
    X(30, shm_keys, u64)                                                                           \
    X(31, continues, bool)

/* Field numbers this codec may see: 1..HEADER_ID_MAX (a bit each in the
 * unpacker's mask of fields seen). */
#define HEADER_ID_MAX 31u
_Static_assert(HEADER_ID_MAX < 32, "the unpacker's mask of fields seen is 32 bits");

/* Each field's tag and varint (or string length) fit in 12 bytes, which
 * PS_HEADER_FIELDS_BYTES_MAX gives every number up to HEADER_ID_MAX. */
_Static_assert(PS_HEADER_FIELDS_BYTES_MAX == HEADER_ID_MAX * (2 + VARINT_BYTES_MAX),
               "a field: a tag of up to 2 bytes, a varint of up to 10");
/* Each field's number is within that, and its member has the width its
 * kind reads and writes. */
#define WIDTH_u32  4
#define WIDTH_i32  4
#define WIDTH_s32  4
#define WIDTH_bool 4
#define WIDTH_u64  8
#define WIDTH_str  sizeof(char *)
#define CHECK_FIELD(id, name, kind)                                                                \
    _Static_assert(id >= 1 && id <= HEADER_ID_MAX, #name ": a number the codec knows");            \
    _Static_assert(sizeof(((Ps__Header *)0)->name) == WIDTH_##kind, #name " is " #kind);
HEADER_FIELDS(CHECK_FIELD)
#undef CHECK_FIELD

/* ---- packing ------------------------------------------------------------- */

static inline uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static inline uint8_t *put_u64(uint8_t *p, uint32_t id, uint64_t v)
{
    if (v == 0)
        return p;
    p = put_varint(p, (uint64_t)id << 3 | PROTOBUF_C_WIRE_TYPE_VARINT);
    return put_varint(p, v);
}

static inline uint8_t *put_u32(uint8_t *p, uint32_t id, uint32_t v)
{
    return put_u64(p, id, v);
}

static inline uint8_t *put_i32(uint8_t *p, uint32_t id, int32_t v)
{
    return put_u64(p, id, (uint64_t)(int64_t)v);
}

static inline uint8_t *put_s32(uint8_t *p, uint32_t id, int32_t v)
{
    return put_u64(p, id, ((uint32_t)v << 1) ^ (uint32_t)(v >> 31));
}

static inline uint8_t *put_bool(uint8_t *p, uint32_t id, protobuf_c_boolean v)
{
    return put_u64(p, id, v != 0);
}

static inline size_t len_str(const char *s)
{
    return s == NULL || s[0] == '\0' ? 0 : strlen(s); /* most are empty */
}

static inline uint8_t *put_str(uint8_t *p, uint32_t id, const char *s)
{
    size_t len = len_str(s);
    if (len == 0)
        return p;
    p = put_varint(p, (uint64_t)id << 3 | PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED);
    p = put_varint(p, len);
    memcpy(p, s, len);
    return p + len;
}

/* Bytes a field's contents add beyond its 12 (a string's). */
#define EXTRA_u32(x)  0
#define EXTRA_u64(x)  0
#define EXTRA_i32(x)  0
#define EXTRA_s32(x)  0
#define EXTRA_bool(x) 0
#define EXTRA_str(x)  len_str(x)

int64_t ps_header_pack_fast(const Ps__Header *h, uint8_t *buf, size_t cap)
{
    if (h->spec != NULL || h->stats != NULL || h->base.n_unknown_fields != 0 ||
        h->base.descriptor != &ps__header__descriptor)
        return -1;
    /* the fields from 32 on (replication, pipelines, changed pulls) are
     * protobuf-c's to pack */
    if (h->epoch != 0 || h->seq != 0 || h->record != 0 || h->route.len != 0 ||
        (h->user != NULL && h->user[0] != '\0') || h->last || h->n_shape != 0 || h->stage != 0 ||
        h->backward || h->stages != 0 || h->eval || h->changed || h->since != 0 ||
        h->generation != 0 || h->table_version != 0 || h->next != 0 || h->tombstones ||
        h->resume_epoch != 0 || h->resume_seq != 0)
        return -1;
#define EXTRA(id, name, kind) +EXTRA_##kind(h->name)
    if (PS_HEADER_FIELDS_BYTES_MAX HEADER_FIELDS(EXTRA) > cap)
        return -1;
#undef EXTRA
    uint8_t *p = buf;
#define PACK(id, name, kind) p = put_##kind(p, id, h->name);
    HEADER_FIELDS(PACK)
#undef PACK
    return (int64_t)(p - buf);
}

/* ---- unpacking ----------------------------------------------------------- */

/* Reads a varint of at most max bytes at p[0..n). Returns its length, or
 * 0 when it runs past n or max, or sets bits past 64 (declined: protobuf-c
 * refuses some of these and truncates others). */
static inline size_t get_varint(const uint8_t *p, size_t n, size_t max, uint64_t *out)
{
    if (n > 0 && p[0] < 0x80) {
        *out = p[0];
        return 1;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n && i < max; i++) {
        v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if ((p[i] & 0x80) == 0) {
            if (i == VARINT_BYTES_MAX - 1 && p[i] > 1)
                return 0;
            *out = v;
            return i + 1;
        }
    }
    return 0;
}

static inline int32_t s32_value(uint64_t v)
{
    uint32_t z = (uint32_t)v;
    return (int32_t)((z >> 1) ^ (0u - (z & 1u)));
}

/* A decoded varint into a member, as protobuf-c stores it (32-bit fields
 * keep the low 32 bits): 0, or -1 for a string (declined). */
#define GET_u32(m, v)  ((m) = (uint32_t)(v), 0)
#define GET_u64(m, v)  ((m) = (v), 0)
#define GET_i32(m, v)  ((m) = (int32_t)(uint32_t)(v), 0)
#define GET_s32(m, v)  ((m) = s32_value(v), 0)
#define GET_bool(m, v) ((m) = (v) != 0, 0)
#define GET_str(m, v)  (-1)

/* Stores field id's value. Returns -1 for a field this codec does not
 * unpack: strings, messages, numbers it does not know. */
static int store(Ps__Header *h, uint64_t id, uint64_t v)
{
    switch (id) {
#define STORE(id, name, kind)                                                                      \
    case id:                                                                                       \
        return GET_##kind(h->name, v);
        HEADER_FIELDS(STORE)
#undef STORE
    default:
        return -1;
    }
}

Ps__Header *ps_header_unpack_fast(ProtobufCAllocator *a, size_t len, const uint8_t *data)
{
    Ps__Header tmp = PS__HEADER__INIT;
    uint32_t seen = 0;
    size_t pos = 0;
    while (pos < len) {
        uint64_t tag, v;
        size_t n = get_varint(data + pos, len - pos, TAG_BYTES_MAX, &tag);
        if (n == 0 || (tag & 7) != PROTOBUF_C_WIRE_TYPE_VARINT)
            return NULL;
        uint64_t id = tag >> 3;
        if (id == 0 || id > HEADER_ID_MAX || (seen >> id & 1) != 0)
            return NULL;
        pos += n;
        n = get_varint(data + pos, len - pos, VARINT_BYTES_MAX, &v);
        if (n == 0 || store(&tmp, id, v) != 0)
            return NULL;
        pos += n;
        seen |= UINT32_C(1) << id;
    }
    Ps__Header *h = a->alloc(a->allocator_data, sizeof *h);
    if (h != NULL)
        *h = tmp;
    return h;
}

int ps_header_field_bytes(const uint8_t *p, size_t n, uint32_t id, const uint8_t **at, size_t *len)
{
    int found = 0;
    for (size_t i = 0; i < n;) {
        uint64_t tag = 0, v = 0;
        size_t k = get_varint(p + i, n - i, VARINT_BYTES_MAX, &tag);
        if (k == 0)
            return -1;
        i += k;
        switch (tag & 7u) {
        case PROTOBUF_C_WIRE_TYPE_VARINT:
            k = get_varint(p + i, n - i, VARINT_BYTES_MAX, &v);
            break;
        case PROTOBUF_C_WIRE_TYPE_64BIT:
            k = 8;
            break;
        case PROTOBUF_C_WIRE_TYPE_32BIT:
            k = 4;
            break;
        case PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED:
            k = get_varint(p + i, n - i, VARINT_BYTES_MAX, &v);
            if (k == 0 || v > n - i - k)
                return -1;
            if (tag >> 3 == id) {
                if (found++)
                    return -1; /* given twice */
                *at = p + i + k;
                *len = (size_t)v;
            }
            k += (size_t)v;
            break;
        default:
            return -1;
        }
        if (k == 0 || k > n - i)
            return -1;
        i += k;
    }
    return found;
}
