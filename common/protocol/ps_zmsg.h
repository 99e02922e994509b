/* ZeroMQ messages as both sides use them: one whole multipart message
 * received into a bounded array, and the allocator settings for processes
 * that move large messages. No event loop: the libuv glue is ps_zsock.h. */
#ifndef PS_ZMSG_H
#define PS_ZMSG_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

/* Receives one whole multipart message. flags ZMQ_DONTWAIT: without
 * blocking; 0: the first part waits up to the socket's ZMQ_RCVTIMEO.
 * Keeps the first `max` parts in parts[] (initialised; the caller closes
 * *kept of them), receives and drops any further parts, and counts every
 * part in *total and their bytes in *bytes (when not NULL). Returns 0, or
 * -1 when no message came (nothing is kept then). Multipart delivery is
 * atomic in zmq, so after the first part the rest are already there. */
int ps_zmsg_recv(void *sock, int flags, zmq_msg_t *parts, size_t max, size_t *kept, size_t *total,
                 uint64_t *bytes);

/* Call first in main() of a process that moves large messages (psd,
 * psworker). ZeroMQ allocates every received message and psd every reply;
 * above glibc's mmap threshold each of those is a fresh mmap (a page fault
 * per 4 KiB touched, an munmap after) until glibc's dynamic threshold
 * happens to rise. A fixed threshold of 64 MiB keeps them on the heap:
 * 1+1 training went from 41-50k to 48-53k samples/s (tests/bench/HISTORY.md,
 * "Page faults on every large message"). */
void ps_malloc_tune(void);

#endif
