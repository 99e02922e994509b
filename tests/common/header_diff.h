/* Differential check of the header fast path (common/protocol/ps_header.h) against
 * protobuf-c, shared by the wire unit test and the wire fuzz target: on
 * any bytes, what the fast path takes protobuf-c must take too, with every
 * field equal. Header-only (static inline) so the fuzz targets, which link
 * only the common library, can use it. */
#ifndef PSTEST_HEADER_DIFF_H
#define PSTEST_HEADER_DIFF_H

#include "ps_header.h"
#include "ps_wire.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Whether two messages of one descriptor hold the same singular fields
 * (strings by content; message fields only when both are unset). */
static inline int header_fields_equal(const ProtobufCMessage *x, const ProtobufCMessage *y)
{
    const ProtobufCMessageDescriptor *d = x->descriptor;
    if (y->descriptor != d || x->n_unknown_fields != 0 || y->n_unknown_fields != 0)
        return 0;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *a = (const char *)x + f->offset, *b = (const char *)y + f->offset;
        switch (f->type) {
        case PROTOBUF_C_TYPE_STRING: {
            const char *sa = *(const char *const *)a, *sb = *(const char *const *)b;
            if (strcmp(sa != NULL ? sa : "", sb != NULL ? sb : "") != 0)
                return 0;
            break;
        }
        case PROTOBUF_C_TYPE_MESSAGE:
            if (*(const void *const *)a != NULL || *(const void *const *)b != NULL)
                return 0;
            break;
        case PROTOBUF_C_TYPE_UINT64:
        case PROTOBUF_C_TYPE_INT64:
        case PROTOBUF_C_TYPE_SINT64:
            if (memcmp(a, b, 8) != 0)
                return 0;
            break;
        default: /* 32-bit integers, enums, bools */
            if (memcmp(a, b, 4) != 0)
                return 0;
            break;
        }
    }
    return 1;
}

/* Unpacks n bytes as a ps.Header both ways. Returns 0 when they agree
 * (the fast path declined, or both unpacked the same fields), -1 when the
 * fast path took bytes protobuf-c refuses or read them differently.
 * *taken: whether the fast path took them. a is reset first. */
static inline int header_diff(struct ps_arena *a, const uint8_t *p, size_t n, int *taken)
{
    ps_arena_reset(a);
    Ps__Header *fast = ps_header_unpack_fast(&a->pa, n, p);
    *taken = fast != NULL;
    if (fast == NULL)
        return 0;
    Ps__Header *ref = ps__header__unpack(NULL, n, p);
    int same = ref != NULL && header_fields_equal(&fast->base, &ref->base);
    if (ref != NULL)
        ps__header__free_unpacked(ref, NULL);
    return same ? 0 : -1;
}

#endif
