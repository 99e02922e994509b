/* Same-host transport: a shard bound to tcp://HOST:PORT also binds the
 * Linux abstract Unix socket ipc://@psd/HOST:PORT and offers it in its hello
 * replies. A client that can see that name in /proc/net/unix shares the
 * shard's network namespace (abstract names live there, as loopback
 * addresses do) and may switch to it: the same ZeroMQ socket and security,
 * without TCP's loopback processing. The name follows from the TCP port, so
 * a shard restarted on the same port is found again on the same name. */
#ifndef PS_LOCAL_H
#define PS_LOCAL_H

#include <stddef.h>
#include <stdint.h>

#define PS_LOCAL_PREFIX "ipc://@psd/"
/* characters of an abstract name at most (sun_path holds 108 bytes, the
 * first a NUL for an abstract name) */
#define PS_LOCAL_NAME_MAX 100u

/* The local endpoint for a bound "tcp://HOST:PORT" into out (len bytes).
 * 0, or -1 when bound is not tcp:// or the name ("psd/HOST:PORT") is not
 * 5..PS_LOCAL_NAME_MAX printable characters. */
int ps_local_endpoint(const char *bound, char *out, size_t len);

/* 1 when endpoint is a well-formed local endpoint (the rule above) whose
 * abstract socket is listening in this network namespace; 0 otherwise
 * (also where /proc is not mounted). */
int ps_local_reachable(const char *endpoint);

/* Checks an endpoint's port: tcp://HOST:PORT with PORT in 1..65535 (bind:
 * 0..65535 or *, a free one); other transports pass. 0, or PS_EINVAL with
 * a sentence naming the endpoint in err. */
int ps_endpoint_check(const char *ep, int bind, char *err, size_t errlen);
/* ps_endpoint_check for a shard's entry in a server list: one endpoint,
 * or its replicas joined by '|' (at most PS_REPLICAS_MAX, none empty). */
int ps_endpoints_check(const char *entry, char *err, size_t errlen);

/* A random nonzero 64-bit id (getrandom, or clock and pid without it). */
uint64_t ps_random_id(void);

#endif
