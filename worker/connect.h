/* Connecting psworker to its shards: the client from the flags, and the
 * region shared with shards on this host. */
#ifndef PSW_CONNECT_H
#define PSW_CONNECT_H

#include "trainer.h"

#include <stddef.h>
#include <stdint.h>

int psw_wire_dtype(const char *s);
int psw_connect_client(struct trainer *tr, int nonzero_pulls, char *err, size_t errlen);

#endif
