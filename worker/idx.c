/* IDX reader over zlib's gz* interface. */
#include "idx.h"
#include "ps_limits.h"

#include "ps_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

static int read_exact(gzFile f, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        unsigned chunk = len - got > (1u << 30) ? (1u << 30) : (unsigned)(len - got);
        int n = gzread(f, (char *)buf + got, chunk);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

int psw_idx_load(const char *path, struct psw_idx *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    char gz[PS_PATH_MAX];
    const char *use = path;
    if (access(path, R_OK) != 0) {
        snprintf(gz, sizeof gz, "%s.gz", path);
        use = gz;
    }
    gzFile f = gzopen(use, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "cannot open '%s' (nor '%s.gz')", path, path);
        return PS_EIO;
    }
    unsigned char hdr[4];
    int rc = PS_EPROTO;
    if (read_exact(f, hdr, 4) != 0 || hdr[0] != 0 || hdr[1] != 0 || hdr[2] != 0x08 || hdr[3] == 0 ||
        hdr[3] > PSW_IDX_DIMS_MAX) {
        snprintf(err, errlen, "'%s': not an unsigned-byte IDX file (bad magic)", use);
        goto out;
    }
    out->ndims = hdr[3];
    uint64_t total = 1;
    for (int i = 0; i < out->ndims; i++) {
        unsigned char d[4];
        if (read_exact(f, d, 4) != 0) {
            snprintf(err, errlen, "'%s': truncated header", use);
            goto out;
        }
        out->dims[i] = (uint32_t)d[0] << 24 | (uint32_t)d[1] << 16 | (uint32_t)d[2] << 8 | d[3];
        total *= out->dims[i];
        if (out->dims[i] == 0 || total > PSW_IDX_BYTES_MAX) {
            snprintf(err, errlen, "'%s': dimension %d is %u: empty or over %llu bytes", use, i,
                     out->dims[i], (unsigned long long)PSW_IDX_BYTES_MAX);
            rc = PS_ELIMIT;
            goto out;
        }
    }
    out->data = malloc((size_t)total);
    if (out->data == NULL) {
        snprintf(err, errlen, "'%s': cannot allocate %llu bytes", use, (unsigned long long)total);
        rc = PS_ENOMEM;
        goto out;
    }
    if (read_exact(f, out->data, (size_t)total) != 0) {
        snprintf(err, errlen, "'%s': truncated: header promises %llu data bytes", use,
                 (unsigned long long)total);
        goto out;
    }
    rc = 0;
out:
    gzclose(f);
    if (rc != 0)
        psw_idx_free(out);
    return rc;
}

void psw_idx_free(struct psw_idx *idx)
{
    free(idx->data);
    idx->data = NULL;
}
