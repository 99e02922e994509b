/* A shard's state in a file: what psd's checkpoints and its replicas'
 * state transfers hold, and psctl reshard rewrites. The file is
 * safetensors, which other tools read (8-byte header length, a JSON
 * header written with jansson, raw little-endian tensors named
 * "w/TABLE", "s1/TABLE", "s2/TABLE", "mask/TABLE", "keys/TABLE",
 * "steps/TABLE"); the header's metadata carries the shard's state as
 * JSON (tables' specs, clocks and counters, workers' exactly-once
 * records) and a CRC32 of the tensors and the state.
 *
 * Files are named shard-I-of-S-SEQ.safetensors. Writes are atomic (temp
 * file, fsync, rename, fsync the directory) and keep the newest
 * PSD_SNAPSHOT_KEEP of a shard. Reading checks everything before it is
 * used: the format, the checksum, every tensor's dtype and size, the
 * tables' specs and sizes; a bad file is an error that names what is
 * wrong. Nothing here knows about psd's dispatch or its network: psd and
 * psctl both link it (a library of its own, with the tables). */
#ifndef PSD_SNAPSHOT_H
#define PSD_SNAPSHOT_H

#include "consistency.h"
#include "table.h"

#include "ps_limits.h"

#include <stddef.h>
#include <stdint.h>

#define PSD_SNAPSHOT_KEEP       3
#define PSD_SNAPSHOT_HEADER_MAX (64u << 20)

/* One worker's exactly-once record. */
struct psd_snapshot_peer {
    uint32_t worker_id;
    uint64_t session, last_applied;
    int has_bits; /* 0: a version-1 file without the window; every id up to
                   * last_applied counts as applied */
    uint64_t bits[PS_DEDUP_WINDOW / 64];
};

/* What a snapshot holds. */
struct psd_snapshot {
    uint32_t shard, shards;
    struct psd_cons cons;      /* its mode and worker count */
    struct psd_table **tables; /* ntables, in id order */
    uint32_t ntables;
    struct psd_snapshot_peer *peers; /* npeers */
    size_t npeers;
    uint64_t duplicates_dropped;
    /* a replica's: the state is its primary's after repl_seq records of
     * epoch repl_epoch (0, 0: not a replica's, or an older file) */
    uint64_t repl_epoch, repl_seq;
};

/* Writes s as the next file of its shard in dir; its path goes to
 * path. 0 or PS_E* with err. */
int psd_snapshot_write(const struct psd_snapshot *s, const char *dir, char *path, size_t pathlen,
                       char *err, size_t errlen);

/* Reads the file at path into s, whose shard, shards and cons say what
 * it must hold (its tables' per-worker state is made for cons.workers);
 * a table over table_bytes_max is refused. On success s owns the tables
 * and peers read (psd_snapshot_free); on failure it holds none. 0 or
 * PS_E* with err. */
int psd_snapshot_read(struct psd_snapshot *s, const char *path, uint64_t table_bytes_max, char *err,
                      size_t errlen);
/* Frees the tables and peers s holds (read, or made by psd_reshard). */
void psd_snapshot_free(struct psd_snapshot *s);

/* The sequence numbers of shard `shard` of `shards`'s files in dir,
 * newest first, at most max of them (every entry is looked at). */
size_t psd_snapshot_seqs(const char *dir, uint32_t shard, uint32_t shards, int64_t *seqs,
                         size_t max);
/* The path of one of them. */
void psd_snapshot_path(const char *dir, uint32_t shard, uint32_t shards, int64_t seq, char *path,
                       size_t len);

/* psd snapshot files in dir, of any shard and shard count: how many, and
 * which shards they were written by ("shard 0 of 2, shard 1 of 2") into
 * what. For telling a directory that holds a model which does not
 * restore here from an empty one. */
size_t psd_snapshot_found(const char *dir, char *what, size_t len);

/* What the files in dir were written with: their shard count (one only,
 * or PS_EINVAL naming them), and the consistency mode and worker count
 * of the newest valid file of shard 0. */
int psd_snapshot_params(const char *dir, uint32_t *shards, struct psd_cons *cons, char *err,
                        size_t errlen);

#endif
