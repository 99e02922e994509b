/* Raw DEALER helpers for tests that speak the wire protocol by hand:
 * sending frames and reading whole replies under a deadline. */
#ifndef PSTEST_RAW_H
#define PSTEST_RAW_H

#include "ps_wire.h"

#include <stddef.h>

#define RAW_TIMEOUT_MS 10000

/* A DEALER connected to endpoint (linger 0). */
void *raw_dealer(void *ctx, const char *endpoint);
/* Receives one reply (all frames), unpacks its header (free with
 * ps__header__free_unpacked(h, NULL)); copies a later frame of exactly
 * out_bytes into out. NULL on timeout. */
Ps__Header *raw_recv(void *s, int timeout_ms, size_t *nframes, void *out, size_t out_bytes);
/* Sends h (+ vals) and returns the reply, failing the test on an error
 * status. */
Ps__Header *raw_exchange(void *s, const Ps__Header *h, const void *vals, size_t vbytes, void *out,
                         size_t out_bytes);

#endif
