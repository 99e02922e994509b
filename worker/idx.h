/* IDX files (MNIST, Fashion-MNIST): a big-endian header (magic with the
 * element type and the number of dimensions, then each dimension) and raw
 * bytes. Read through zlib, so gzip and plain files both work. Only unsigned
 * byte data (type 0x08) is accepted; every size is checked against the file
 * and against PSW_IDX_BYTES_MAX before anything is allocated. */
#ifndef PSW_IDX_H
#define PSW_IDX_H

#include <stddef.h>
#include <stdint.h>

#define PSW_IDX_DIMS_MAX  4
#define PSW_IDX_BYTES_MAX (UINT64_C(1) << 31)

struct psw_idx {
    int ndims;
    uint32_t dims[PSW_IDX_DIMS_MAX];
    uint8_t *data; /* product of dims bytes; owned, free with psw_idx_free */
};

/* Loads `path`, or `path`.gz when path does not exist. 0 or a PS_E* code
 * with a sentence naming the file and the problem in err. */
int psw_idx_load(const char *path, struct psw_idx *out, char *err, size_t errlen);
void psw_idx_free(struct psw_idx *idx);

#endif
