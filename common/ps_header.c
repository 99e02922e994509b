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
/* Fields of ps.Header this codec knows: 1..HEADER_FIELD_MAX. */
#define HEADER_FIELD_MAX 30u
_Static_assert(PS_HEADER_SCALARS_BYTES_MAX == HEADER_FIELD_MAX * (2 + VARINT_BYTES_MAX),
               "a field: a tag of up to 2 bytes, a varint of up to 10");
/* A string: a 2-byte tag, a length of at most 5 bytes, the bytes. */
#define STRING_OVERHEAD_MAX 7u

static inline uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static inline uint8_t *put_field(uint8_t *p, uint32_t id, uint64_t v)
{
    if (v == 0)
        return p;
    p = put_varint(p, (uint64_t)id << 3 | PROTOBUF_C_WIRE_TYPE_VARINT);
    return put_varint(p, v);
}

/* int32 and enum fields: a negative value is sign-extended to 10 bytes. */
static inline uint64_t i32_wire(int32_t v)
{
    return (uint64_t)(int64_t)v;
}

static inline uint64_t s32_wire(int32_t v)
{
    return ((uint32_t)v << 1) ^ (uint32_t)(v >> 31);
}

static inline uint8_t *put_string(uint8_t *p, uint32_t id, const char *s, size_t len)
{
    if (len == 0)
        return p;
    p = put_varint(p, (uint64_t)id << 3 | PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED);
    p = put_varint(p, len);
    memcpy(p, s, len);
    return p + len;
}

static inline size_t str_len(const char *s)
{
    return s != NULL ? strlen(s) : 0;
}

int64_t ps_header_pack_fast(const Ps__Header *h, uint8_t *buf, size_t cap)
{
    if (h->spec != NULL || h->stats != NULL || h->base.n_unknown_fields != 0 ||
        h->base.descriptor != &ps__header__descriptor)
        return -1;
    size_t error_len = str_len(h->error), detail_len = str_len(h->detail),
           endpoint_len = str_len(h->local_endpoint);
    size_t bound = PS_HEADER_SCALARS_BYTES_MAX + 3 * STRING_OVERHEAD_MAX + error_len + detail_len +
                   endpoint_len;
    if (bound > cap)
        return -1;
    uint8_t *p = buf;
    p = put_field(p, 1, h->version);
    p = put_field(p, 2, i32_wire((int32_t)h->op));
    p = put_field(p, 3, h->request_id);
    p = put_field(p, 4, h->worker_id);
    p = put_field(p, 5, h->table_id);
    p = put_field(p, 6, h->clock);
    p = put_field(p, 7, i32_wire((int32_t)h->dtype));
    p = put_field(p, 8, i32_wire((int32_t)h->layout));
    p = put_field(p, 9, h->offset);
    p = put_field(p, 10, h->count);
    p = put_field(p, 11, h->dim);
    p = put_field(p, 12, s32_wire(h->status));
    p = put_string(p, 13, h->error, error_len);
    /* 14 spec and 15 stats: unset (declined above otherwise) */
    p = put_field(p, 16, h->shard);
    p = put_field(p, 17, h->shards);
    p = put_field(p, 18, h->nonzero_only != 0);
    p = put_field(p, 19, h->session);
    p = put_field(p, 20, h->duplicate != 0);
    p = put_field(p, 21, h->stale != 0);
    p = put_string(p, 22, h->detail, detail_len);
    p = put_field(p, 23, h->rows);
    p = put_string(p, 24, h->local_endpoint, endpoint_len);
    p = put_field(p, 25, h->instance);
    p = put_field(p, 26, h->shm_token);
    p = put_field(p, 27, h->shm);
    p = put_field(p, 28, h->shm_in);
    p = put_field(p, 29, h->shm_out);
    p = put_field(p, 30, h->shm_keys);
    return (int64_t)(p - buf);
}

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

/* Stores field id's value as protobuf-c does (32-bit fields keep the low
 * 32 bits). Returns -1 for a field this codec does not unpack. */
static int store(Ps__Header *h, uint64_t id, uint64_t v)
{
    switch (id) {
    case 1:
        h->version = (uint32_t)v;
        return 0;
    case 2:
        h->op = (Ps__Op)(int32_t)(uint32_t)v;
        return 0;
    case 3:
        h->request_id = v;
        return 0;
    case 4:
        h->worker_id = (uint32_t)v;
        return 0;
    case 5:
        h->table_id = (uint32_t)v;
        return 0;
    case 6:
        h->clock = v;
        return 0;
    case 7:
        h->dtype = (Ps__DType)(int32_t)(uint32_t)v;
        return 0;
    case 8:
        h->layout = (Ps__Layout)(int32_t)(uint32_t)v;
        return 0;
    case 9:
        h->offset = v;
        return 0;
    case 10:
        h->count = v;
        return 0;
    case 11:
        h->dim = (uint32_t)v;
        return 0;
    case 12:
        h->status = s32_value(v);
        return 0;
    case 16:
        h->shard = (uint32_t)v;
        return 0;
    case 17:
        h->shards = (uint32_t)v;
        return 0;
    case 18:
        h->nonzero_only = v != 0;
        return 0;
    case 19:
        h->session = v;
        return 0;
    case 20:
        h->duplicate = v != 0;
        return 0;
    case 21:
        h->stale = v != 0;
        return 0;
    case 23:
        h->rows = v;
        return 0;
    case 25:
        h->instance = v;
        return 0;
    case 26:
        h->shm_token = v;
        return 0;
    case 27:
        h->shm = (uint32_t)v;
        return 0;
    case 28:
        h->shm_in = v;
        return 0;
    case 29:
        h->shm_out = v;
        return 0;
    case 30:
        h->shm_keys = v;
        return 0;
    default:
        return -1; /* strings, messages, numbers it does not know */
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
        if (id == 0 || id > HEADER_FIELD_MAX || (seen >> id & 1) != 0)
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
