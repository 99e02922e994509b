/* Shared memory between a client and a shard on the same host.
 *
 * The values of dense pulls and pushes need not cross a socket when client
 * and shard share a host: the client makes a region (a sealed memfd,
 * mapped), hands its descriptor to the shard over the shard's fd socket
 * (an abstract Unix socket named after its local endpoint, ps_local.h)
 * with a random token, and names the token in a hello over its local
 * ZeroMQ connection. The shard binds the region to that connection; data
 * requests on it may then say "the values are in the region at offset X"
 * or "write the reply's values there" (ps.proto's shm fields) instead of
 * carrying a values frame.
 *
 * The shard maps only a region it was handed (never one it opens by name)
 * and only one sealed against shrinking, so a peer cannot make its reads
 * fault by truncating the file. Binding needs the token over the ZeroMQ
 * connection, i.e. a peer that passed the connection's security. */
#ifndef PS_SHM_H
#define PS_SHM_H

#include <stddef.h>
#include <stdint.h>

struct ps_shm {
    int fd; /* -1: none */
    unsigned char *base;
    size_t size;
};

/* A new region of `size` bytes (rounded up to pages), mapped read-write and
 * sealed against shrinking and growing. 0, or a PS_E* code and err. */
int ps_shm_create(size_t size, struct ps_shm *out, char *err, size_t errlen);
void ps_shm_close(struct ps_shm *r);

/* Client: hands r's descriptor and token to the fd socket of the shard
 * whose local endpoint is `local`, and waits up to timeout_ms for its
 * answer. 0 when the shard took it. */
int ps_shm_hand(const char *local, int fd, uint64_t token, int timeout_ms, char *err,
                size_t errlen);

/* Shard: a non-blocking listening socket for `local` (its own local
 * endpoint), or a PS_E* code and err. */
int ps_shm_listen(const char *local, char *err, size_t errlen);

/* Shard: reads a hand-over from an accepted connection (non-blocking),
 * checks it (one descriptor of a regular file opened read-write, sealed
 * against shrinking, PS_SHM_BYTES_MIN..PS_SHM_BYTES_MAX bytes, and the
 * message's magic) and maps it. 0 with *base, *size and *token set;
 * PS_SHM_PENDING when nothing has arrived yet; a PS_E* code and err when
 * the hand-over is refused (the connection is then done with). */
#define PS_SHM_PENDING 1
int ps_shm_take(int conn, uint64_t *token, void **base, size_t *size, char *err, size_t errlen);

/* Shard: tells the client whether its region was taken, best effort. */
void ps_shm_answer(int conn, int taken);

#endif
