/* Writing safetensors files: an 8-byte little-endian header length, a JSON
 * header (written with jansson) padded with spaces to 8 bytes, then the raw
 * little-endian tensors back to back. Python's safetensors and numpy read
 * them. Used for psd checkpoints, psworker --save and psctl export. */
#ifndef PS_SAFETENSORS_H
#define PS_SAFETENSORS_H

#include "ps_limits.h"

#include <stddef.h>
#include <stdint.h>

#define PS_ST_NAME_MAX 200

struct ps_st_tensor {
    char name[PS_ST_NAME_MAX];
    const char *dtype; /* "F32", "U64", "U32", "U8" */
    uint64_t shape[PS_SHAPE_DIMS_MAX];
    int ndim; /* 1 to PS_SHAPE_DIMS_MAX */
    const void *data;
    size_t bytes;
};

/* Fills t (bytes from the shape and esize). */
void ps_st_tensor(struct ps_st_tensor *t, const char *name, const char *dtype, const void *data,
                  size_t esize, uint64_t d0, uint64_t d1);

/* Gives t (filled by ps_st_tensor as a vector) these ndims dimensions,
 * whose product must be its element count: 0, or PS_EINVAL. */
int ps_st_tensor_shape(struct ps_st_tensor *t, const uint64_t *dims, uint32_t ndims);

/* Writes n tensors to path atomically: a temp file beside it, fsync,
 * rename, fsync of the directory. metadata: "__metadata__" string pairs
 * (key, value, key, value, ...; nmeta strings in all). 0 or PS_EIO /
 * PS_ENOMEM with a sentence in err naming the file. */
int ps_st_write(const char *path, const struct ps_st_tensor *ts, size_t n,
                const char *const *metadata, size_t nmeta, char *err, size_t errlen);

#endif
