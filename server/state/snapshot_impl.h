/* What snapshot.c (the format) and reshard.c share: a file read into
 * memory and checked, its tensors, and a table made from its saved
 * state. Nothing outside the two uses it. */
#ifndef PSD_SNAPSHOT_IMPL_H
#define PSD_SNAPSHOT_IMPL_H

#include "snapshot.h"

#include <jansson.h>

/* A snapshot file in memory. */
struct psd__blob {
    unsigned char *buf;
    size_t size;
    json_t *hdr;
    const unsigned char *data;
    size_t dlen;
};

/* Reads the file at path and checks what does not depend on the shard
 * reading it: the format, the version, the checksum, the state's JSON.
 * On success *st holds the state (the caller frees it with
 * psd__blob_free and json_decref). */
int psd__snapshot_open(const char *path, struct psd__blob *b, json_t **st, char *err,
                       size_t errlen);
void psd__blob_free(struct psd__blob *b);
/* The newest file of shard `shard` of `shards` in dir that opens and
 * verifies as that shard's, opened into b and st; its path into path. */
int psd__snapshot_newest(const char *dir, uint32_t shard, uint32_t shards, struct psd__blob *b,
                         json_t **st, char *path, size_t pathlen, char *err, size_t errlen);
/* The bytes of tensor prefix/name, checked for dtype and size (NULL with
 * err when it is missing or another). */
const void *psd__blob_tensor(const struct psd__blob *b, const char *prefix, const char *name,
                             const char *dtype, size_t bytes, char *err, size_t errlen);
/* Rows of a sparse table's keys tensor (its shape's first dimension). */
uint64_t psd__blob_rows(const struct psd__blob *b, const char *name);
/* A number of the state: an integer, or a decimal string (64-bit seeds). */
uint64_t psd__json_u64(json_t *o, const char *k);
/* A table of shard s->shard of s->shards made from its saved state o
 * (spec, clocks, counters) with id, its values not filled in yet (the
 * table and its consistency state: psd__table_free). */
int psd__snapshot_table(const struct psd_snapshot *s, json_t *o, uint32_t id,
                        uint64_t table_bytes_max, struct psd_table **out, char *err, size_t errlen);
void psd__table_free(const struct psd_snapshot *s, struct psd_table *t);
/* The pruning of a dense table from its saved state pr: the mask made
 * (not filled in) and its counters. 0 or PS_ENOMEM. */
int psd__snapshot_prune(struct psd_table *t, json_t *pr);

#endif
