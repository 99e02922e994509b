/* A small client of etcd's v3 API through its HTTP/JSON gateway (etcd
 * 3.4's /v3/...), for the replicas' leadership (lead.h): leases, reads,
 * and transactions that compare revisions and put keys. libcurl carries
 * the requests, jansson reads and writes the JSON, libsodium does the
 * base64 the gateway wants for keys and values.
 *
 * Two ways to call. The blocking calls hold the caller for at most the
 * timeout given at init: psd makes them only where it serves nobody (a
 * replica asking who is primary, a campaign, a stop). The asynchronous
 * ones (psd_etcd_keepalive_async, psd_etcd_txn_async) go through
 * libcurl's multi interface on a libuv loop, one at a time, with their
 * own connection: a primary renews its lease and writes its in-sync set
 * while it goes on serving, however slowly etcd answers. Not a general
 * client: no watches, no ranges over prefixes. */
#ifndef PSD_ETCD_H
#define PSD_ETCD_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define PSD_ETCD_URL_MAX   256u
#define PSD_ETCD_KEY_MAX   256u
#define PSD_ETCD_VALUE_MAX 4096u       /* a value read back; longer ones are refused */
#define PSD_ETCD_BODY_MAX  (64u << 10) /* a response body; longer ones are refused */

/* The HTTP boundary: POSTs request (JSON text) to the gateway's
 * /v3/path and writes the answer's body into answer (at most answer_max
 * bytes) and *answer_len, its HTTP status into *status. 0; PS_ELIMIT for
 * an answer longer than answer_max; PS_ETIMEDOUT or PS_EIO when none
 * came. libcurl's by default; tests put a stand-in here. */
typedef int (*psd_etcd_post_fn)(void *ctx, const char *path, const char *request, char *answer,
                                size_t answer_max, size_t *answer_len, long *status);

/* An asynchronous call's end: rc 0 or PS_E* (e->err says why), and
 * what the call returns (keepalive: the lease's TTL left; txn: 1 when
 * the compares held). */
struct psd_etcd;
typedef void (*psd_etcd_done_fn)(void *ctx, int rc, int64_t value);

#define PSD_ETCD_SOCKS 4u /* sockets one asynchronous call may watch */

/* The asynchronous side (psd_etcd_async_start). */
struct psd_etcd_async {
    uv_loop_t *loop;
    void *multi, *easy; /* CURLM *, CURL * */
    uv_timer_t timer;
    struct psd_etcd_sock {
        uv_poll_t poll;
        int fd; /* -1: free */
        int open;
        struct psd_etcd *e;
    } socks[PSD_ETCD_SOCKS];
    char *body;
    size_t body_len;
    int body_over;
    char *request; /* the call's JSON text, until it ends */
    char path[32];
    int busy, closed;
    int kind; /* what the answer holds (etcd.c) */
    psd_etcd_done_fn done;
    void *ctx;
};

struct psd_etcd {
    void *curl;            /* CURL * */
    psd_etcd_post_fn post; /* NULL: libcurl */
    void *post_ctx;
    char url[PSD_ETCD_URL_MAX];
    long timeout_ms;       /* a blocking call's */
    long async_timeout_ms; /* an asynchronous call's (psd_etcd_async_start) */
    char *body;            /* the response being read, PSD_ETCD_BODY_MAX + 1 bytes */
    size_t body_len;
    int body_over;
    uint64_t calls, failures;
    uint64_t blocking;            /* calls that held their caller (the loop, in psd) */
    char err[256];                /* why the last call failed */
    struct psd_etcd_async *async; /* NULL until psd_etcd_async_start */
};

/* One key as read. found 0: the key does not exist (revisions 0). */
struct psd_etcd_kv {
    int found;
    int64_t create_rev, mod_rev, lease;
    size_t len;
    char value[PSD_ETCD_VALUE_MAX + 1]; /* NUL-terminated */
};

/* A transaction's compare: key's create or mod revision equals rev (0
 * with PSD_ETCD_CREATE: the key does not exist), or its value equals
 * value (PSD_ETCD_VALUE). */
enum psd_etcd_target { PSD_ETCD_CREATE = 0, PSD_ETCD_MOD = 1, PSD_ETCD_VALUE = 2 };
struct psd_etcd_cmp {
    const char *key;
    enum psd_etcd_target target;
    int64_t rev;
    const char *value;
};
/* A put when the compares hold (lease 0: none). */
struct psd_etcd_put {
    const char *key;
    const char *value;
    int64_t lease;
};

/* url: http://HOST:PORT. 0, or PS_EINVAL / PS_ENOMEM with err. */
int psd_etcd_init(struct psd_etcd *e, const char *url, long timeout_ms, char *err, size_t errlen);
void psd_etcd_fini(struct psd_etcd *e);
/* Carries the calls over post instead of libcurl (a stand-in for etcd
 * in tests). */
void psd_etcd_set_transport(struct psd_etcd *e, psd_etcd_post_fn post, void *ctx);

/* Each returns 0, or a PS_E* code with the reason in e->err. */
int psd_etcd_grant(struct psd_etcd *e, int64_t ttl_s, int64_t *lease, int64_t *granted_s);
/* *ttl_s: what is left of the lease after the refresh; 0 when etcd no
 * longer has it (it expired, or was revoked). */
int psd_etcd_keepalive(struct psd_etcd *e, int64_t lease, int64_t *ttl_s);
int psd_etcd_revoke(struct psd_etcd *e, int64_t lease);
int psd_etcd_get(struct psd_etcd *e, const char *key, struct psd_etcd_kv *kv);
/* *ok: 1 when every compare held and the puts were made, else 0. */
int psd_etcd_txn(struct psd_etcd *e, const struct psd_etcd_cmp *cmp, size_t ncmp,
                 const struct psd_etcd_put *put, size_t nput, int *ok);

/* The asynchronous calls on loop, each given timeout_ms to end. 0, or
 * PS_ENOMEM with err. */
int psd_etcd_async_start(struct psd_etcd *e, uv_loop_t *loop, long timeout_ms, char *err,
                         size_t errlen);
/* Whether an asynchronous call is under way (one at a time). */
int psd_etcd_busy(const struct psd_etcd *e);
/* Start one call: done(ctx, rc, value) comes later on the loop, once,
 * unless psd_etcd_async_close comes first. With a stand-in transport
 * (psd_etcd_set_transport) the call is made at once and done is called
 * before these return. 0 when started; PS_EBUSY while another is under
 * way, PS_ESTATE before psd_etcd_async_start, PS_ENOMEM. */
int psd_etcd_keepalive_async(struct psd_etcd *e, int64_t lease, psd_etcd_done_fn done, void *ctx);
int psd_etcd_txn_async(struct psd_etcd *e, const struct psd_etcd_cmp *cmp, size_t ncmp,
                       const struct psd_etcd_put *put, size_t nput, psd_etcd_done_fn done,
                       void *ctx);
/* Ends the call under way (its done is never called) and closes the
 * loop's handles; psd_etcd_fini frees the rest once the loop has run. */
void psd_etcd_async_close(struct psd_etcd *e);

#endif
