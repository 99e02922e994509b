/* A proxy for one client's connection to one psd, on a thread of its
 * own, that loses, repeats or holds back messages as a test says: a
 * ROUTER the client connects to in front, a DEALER to psd behind. Each
 * request and each reply goes through a callback with its header
 * unpacked (NULL when it is not one), which says what to do with it. */
#ifndef PSTEST_PROXY_H
#define PSTEST_PROXY_H

#include "ps_wire.h"

#include <pthread.h>
#include <stdatomic.h>

enum proxy_act {
    PROXY_PASS = 0,
    PROXY_DROP,   /* lost */
    PROXY_REPEAT, /* sent twice */
    PROXY_HOLD,   /* replies: sent after the next reply that passes (one at a time; a
                   * second while one is held passes) */
};

/* Runs on the proxy's thread: what it shares with the test is atomic. */
typedef enum proxy_act (*proxy_fn)(void *arg, const Ps__Header *h);

struct proxy {
    void *ctx, *front, *back;
    char endpoint[256]; /* where the client connects */
    pthread_t thread;
    atomic_int stop;
    proxy_fn on_request, on_reply; /* NULL: pass */
    void *arg;
    char retarget[256];
    atomic_int retarget_state; /* 1: connect back to retarget; 2: done */
    atomic_int held;           /* replies held back (PROXY_HOLD taken) */
};

/* Binds a free loopback port and connects to server. Fails the test on
 * error. */
void proxy_start(struct proxy *p, const char *server, proxy_fn on_request, proxy_fn on_reply,
                 void *arg);
/* From now on, requests go to server instead (a restarted shard, a replica
 * taking over). Returns once the proxy has moved. */
void proxy_retarget(struct proxy *p, const char *server);
void proxy_stop(struct proxy *p);

#endif
