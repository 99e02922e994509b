/* safetensors writer (see ps_safetensors.h). */
#include "ps_safetensors.h"
#include "ps_limits.h"

#include "ps_err.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void ps_st_tensor(struct ps_st_tensor *t, const char *name, const char *dtype, const void *data,
                  size_t esize, uint64_t d0, uint64_t d1)
{
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->ndim = d1 ? 2 : 1;
    t->data = data;
    t->bytes = (size_t)d0 * (d1 ? d1 : 1) * esize;
}

int ps_st_tensor_shape(struct ps_st_tensor *t, const uint64_t *dims, uint32_t ndims)
{
    uint64_t n = 1;
    for (uint32_t i = 0; i < ndims; i++)
        n *= dims[i];
    if (ndims == 0 || ndims > PS_SHAPE_DIMS_MAX ||
        n != t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1))
        return PS_EINVAL;
    memcpy(t->shape, dims, ndims * sizeof *dims);
    t->ndim = (int)ndims;
    return 0;
}

static char *header(const struct ps_st_tensor *ts, size_t n, const char *const *meta, size_t nmeta)
{
    json_t *h = json_object(), *m = json_object();
    uint64_t off = 0;
    for (size_t i = 0; h && i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < ts[i].ndim; d++)
            json_array_append_new(shape, json_integer((json_int_t)ts[i].shape[d]));
        json_object_set_new(h, ts[i].name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", ts[i].dtype, "shape", shape,
                                      "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + ts[i].bytes)));
        off += ts[i].bytes;
    }
    for (size_t i = 0; m && i + 1 < nmeta; i += 2)
        json_object_set_new(m, meta[i], json_string(meta[i + 1]));
    json_object_set_new(h, "__metadata__", m);
    char *text = h ? json_dumps(h, JSON_COMPACT) : NULL;
    json_decref(h);
    return text;
}

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return PS_EIO;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int fsync_dir_of(const char *path)
{
    char copy[PS_PATH_MAX];
    snprintf(copy, sizeof copy, "%s", path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return PS_EIO;
    int rc = fsync(fd) == 0 ? 0 : PS_EIO;
    close(fd);
    return rc;
}

int ps_st_write(const char *path, const struct ps_st_tensor *ts, size_t n,
                const char *const *metadata, size_t nmeta, char *err, size_t errlen)
{
    char *hdr = header(ts, n, metadata, nmeta), tmp[PS_PATH_MAX];
    if (hdr == NULL) {
        snprintf(err, errlen, "'%s': out of memory for the header", path);
        return PS_ENOMEM;
    }
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    int ok = fd >= 0 && write_all(fd, len8, 8) == 0 && write_all(fd, hdr, hlen) == 0 &&
             write_all(fd, "        ", padded - hlen) == 0;
    for (size_t i = 0; ok && i < n; i++) /* x86-64 and arm64 are little-endian */
        ok = ts[i].bytes == 0 || (ts[i].data && write_all(fd, ts[i].data, ts[i].bytes) == 0);
    ok = ok && fsync(fd) == 0;
    if (fd >= 0 && close(fd) != 0)
        ok = 0;
    free(hdr);
    if (!ok || rename(tmp, path) != 0 || fsync_dir_of(path) != 0) {
        snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
        unlink(tmp);
        return PS_EIO;
    }
    return 0;
}
