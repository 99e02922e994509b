/* Every limit on what a peer, a file or a flag controls, in one place.
 *
 * Sizes are checked against these before anything is allocated for them.
 * Runtime-tunable ceilings (message bytes) have their bounds here and their
 * chosen value in a flag. The _Static_asserts tie related limits together so
 * changing one cannot silently break another. */
#ifndef PS_LIMITS_H
#define PS_LIMITS_H

#include <stdint.h>
#include <string.h>

#define PS_PROTOCOL_VERSION 1u

/* Cluster shape. */
#define PS_SHARDS_MAX  256u
#define PS_WORKERS_MAX 4096u

/* Tables. */
#define PS_TABLES_MAX     1024u
#define PS_TABLE_NAME_MAX 128u /* bytes, excluding the terminating NUL */
/* Tables named with this prefix belong to the client library (its votes,
 * psclient.h): no part of the model (psctl export leaves them out), and
 * not counted in the clock a joining worker starts at. */
#define PS_TABLE_RESERVED_PREFIX "psd:"
#define PS_TABLE_RESERVED(name)                                                                    \
    (strncmp((name), PS_TABLE_RESERVED_PREFIX, sizeof PS_TABLE_RESERVED_PREFIX - 1) == 0)
#define PS_TABLE_ELEMS_MAX (UINT64_C(1) << 34) /* 64 GiB of f32 per table */
#define PS_SPARSE_DIM_MAX  4096u
#define PS_SHAPE_DIMS_MAX  8u                  /* dimensions a dense table's shape may name */
#define PS_SPARSE_ROWS_MAX (UINT64_C(1) << 31) /* per shard and table */
/* Admission (TableSpec.admit_after): one-byte counters, a sketch of 4
 * rows of admit_counters / 4 (default PS_ADMIT_COUNTERS_DEFAULT) */
#define PS_ADMIT_AFTER_MAX        255u
#define PS_ADMIT_COUNTERS_MIN     64u
#define PS_ADMIT_COUNTERS_MAX     (UINT64_C(1) << 30)
#define PS_ADMIT_COUNTERS_DEFAULT (UINT64_C(1) << 20)
/* Eviction by time (TableSpec.evict_after_s): at most ten years */
#define PS_EVICT_AFTER_S_MAX (UINT64_C(10) * 366 * 24 * 3600)
/* Eviction by decayed frequency (TableSpec.evict_half_life), in pushes:
 * a count (below 2^32) times a remainder of it fits 64 bits */
#define PS_EVICT_HALF_LIFE_MAX (UINT64_C(1) << 31)
#define PS_TABLE_BYTES_DEFAULT (UINT64_C(16) << 30) /* one table's memory on a shard */

/* Messages. */
#define PS_FRAMES_MAX            3u /* header, keys, values */
#define PS_HEADER_BYTES_MAX      65536u
#define PS_ERROR_TEXT_MAX        256u /* error text in replies, including NUL */
#define PS_MESSAGE_BYTES_MIN     (UINT64_C(1) << 17)
#define PS_MESSAGE_BYTES_MAX     (UINT64_C(1) << 32)
#define PS_MESSAGE_BYTES_DEFAULT (UINT64_C(1) << 28) /* 256 MiB */
#define PS_VALUE_BYTES_MAX       PS_MESSAGE_BYTES_MAX
#define PS_DTYPE_BYTES_MAX       4u

/* OP_BATCH: requests in one batch, and bytes of its records frame. */
#define PS_BATCH_MAX       64u
#define PS_BATCH_BYTES_MAX 16384u

/* OP_ROWS pages: rows asked for at most, and value bytes a shard puts in
 * one reply at most (it answers fewer rows when they are wide). */
#define PS_ROWS_PAGE_MAX   65536u
#define PS_ROWS_PAGE_BYTES (UINT64_C(16) << 20)
_Static_assert(PS_ROWS_PAGE_BYTES >= (uint64_t)PS_SPARSE_DIM_MAX * 4u, "a page holds a row");

/* Decoding arena for one header (protobuf-c unpack allocates from it). */
#define PS_ARENA_BYTES_SERVER (4u * PS_HEADER_BYTES_MAX)

/* Requests a server keeps waiting (deferred pulls) and a routing id's size. */
#define PS_WAITS_MAX               4096u
#define PS_WAITS_PER_WORKER_MAX    256u /* one peer cannot fill the queue for the others */
#define PS_ROUTE_ID_MAX            256u /* ZeroMQ routing ids are at most 255 bytes */
#define PS_WAIT_TIMEOUT_MS_DEFAULT 120000u
/* Request ids a server remembers one by one per worker (exactly once:
 * ids older than this below the newest applied count as applied). */
#define PS_DEDUP_WINDOW 2048u
_Static_assert(PS_DEDUP_WINDOW % 64 == 0, "the window is whole words of bits");
/* Checkpoints asked for by a peer (OP_CHECKPOINT): at most one this often;
 * an ask sooner is answered with the newest file. */
#define PS_CHECKPOINT_ASK_MIN_MS 1000u

/* Reply bytes psd has handed to ZeroMQ that their peer has not read yet:
 * per connection (routing id) and in all, defaults of --max-unread-bytes
 * and --max-unread-bytes-total. A reply with values that would pass either
 * is refused with PS_ELIMIT; while a connection has nothing unread, one
 * reply of any size fits its own bound. Frames of at most
 * PS_UNREAD_INLINE_BYTES live inside ZeroMQ's queue entries, which its
 * send high-water mark (1,000 messages a connection) bounds, and are not
 * counted. PS_UNREAD_PEERS_MAX connections may hold unread bytes at once. */
#define PS_UNREAD_BYTES_DEFAULT       (UINT64_C(256) << 20)
#define PS_UNREAD_BYTES_TOTAL_DEFAULT (UINT64_C(4) << 30)
#define PS_UNREAD_BYTES_MIN           (UINT64_C(1) << 20)
#define PS_UNREAD_PEERS_MAX           4096u
#define PS_UNREAD_INLINE_BYTES        33u /* ZeroMQ's max_vsm_size on 64-bit hosts */

/* The metrics endpoint (HTTP): connections at once, from one address, and
 * the seconds a silent one is kept. */
#define PS_METRICS_CONNS_MAX          256u
#define PS_METRICS_CONNS_PER_ADDR_MAX 8u
#define PS_METRICS_IDLE_S             10u

/* Event loop fairness: messages handled per readiness callback. */
#define PS_DRAIN_BATCH_MAX 64u

/* Client library. */
#define PS_CLIENT_TICKETS_MAX 1024u /* requests outstanding per client */
#define PS_CLIENT_TABLES_MAX  PS_TABLES_MAX
#define PS_ENDPOINT_MAX       256u  /* bytes of one endpoint string */
#define PS_REPLICAS_MAX       4u    /* replicas of one shard, its primary included ("a|b") */
#define PS_PATH_MAX           4200u /* a file path: PATH_MAX and room for a name added to it */

/* Zero-copy threshold: frames at least this big are handed to zmq without a
 * copy; smaller ones are copied (cheaper than the bookkeeping). */
#define PS_ZEROCOPY_BYTES_MIN 8192u
/* Pull replies at least this big are sent from the table itself (psd's
 * lend_ok); below it, a copy costs less than the table's bookkeeping. */
#define PS_LEND_BYTES_MIN (64u * 1024u)
/* SO_SNDBUF/SO_RCVBUF of psd's and the client's sockets (the kernel caps
 * them at net.core.wmem_max/rmem_max). Chosen by measurement: 1+1 MLP
 * training on loopback went from 38-40k to 42-43k samples/s against the
 * kernel's autotuning; 4 MiB was no better (tests/bench/HISTORY.md). */
#define PS_SOCKET_BUFFER_BYTES (1 << 20)
/* ZMQ_SNDHWM/ZMQ_RCVHWM of the client's sockets (messages queued per
 * shard): above what a client may have outstanding, a message per request
 * and per reply, so a send is never refused for a full queue (that fails
 * its request) and replies never wait in psd for the client's queue.
 * ZeroMQ's default, 1,000, refused 520 sends (8 requests of 16 MiB in 64
 * pieces) to a shard that read slower than they were sent. psd keeps the
 * default: its queues per client stay bounded against a client that
 * floods it or never reads. */
#define PS_SOCKET_HWM (4 * PS_CLIENT_TICKETS_MAX)

/* Shared memory with same-host clients (ps_shm.h): a region's bytes, the
 * regions one psd maps at once (bound or handed over and not yet bound),
 * how long a handed-over region waits for its hello, and fd-socket
 * connections in progress. */
#define PS_SHM_BYTES_MIN   4096u
#define PS_SHM_ALIGN       64u /* what psc_shm_alloc hands out is aligned to it */
#define PS_SHM_BYTES_MAX   (UINT64_C(1) << 36)
#define PS_SHM_REGIONS_MAX 64u
#define PS_SHM_PENDING_MS  10000u
#define PS_SHM_CONNS_MAX   8u
/* A connection there that has not handed its region over this long is
 * closed once another one waits for its slot. */
#define PS_SHM_CONN_IDLE_MS 200u

_Static_assert(PS_ERROR_TEXT_MAX < PS_HEADER_BYTES_MAX, "error text must fit in a header");
_Static_assert(PS_WAITS_PER_WORKER_MAX <= PS_WAITS_MAX, "a worker's share fits the queue");
_Static_assert(PS_TABLE_NAME_MAX < PS_HEADER_BYTES_MAX, "table name must fit in a header");
_Static_assert(PS_MESSAGE_BYTES_MIN > PS_HEADER_BYTES_MAX, "a message must hold a full header");
_Static_assert(PS_MESSAGE_BYTES_DEFAULT >= PS_MESSAGE_BYTES_MIN, "default below minimum");
_Static_assert(PS_MESSAGE_BYTES_DEFAULT <= PS_MESSAGE_BYTES_MAX, "default above maximum");
_Static_assert(PS_CLIENT_TICKETS_MAX <= 65536u, "ticket slot must fit in 16 bits");
_Static_assert((PS_CLIENT_TICKETS_MAX & (PS_CLIENT_TICKETS_MAX - 1)) == 0, "power of two");
_Static_assert(PS_UNREAD_BYTES_DEFAULT <= PS_UNREAD_BYTES_TOTAL_DEFAULT, "a peer's share fits");
_Static_assert(PS_SHARDS_MAX <= UINT32_MAX, "shard ids are uint32 on the wire");
_Static_assert(PS_TABLE_ELEMS_MAX *PS_DTYPE_BYTES_MAX > PS_TABLE_ELEMS_MAX, "no overflow");

#endif
