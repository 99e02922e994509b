/* A small client of etcd's v3 API through its HTTP/JSON gateway (etcd
 * 3.4's /v3/...), for the replicas' leadership (lead.h): leases, reads,
 * and transactions that compare revisions and put keys. libcurl carries
 * the requests, jansson reads and writes the JSON, libsodium does the
 * base64 the gateway wants for keys and values.
 *
 * Calls block for at most the timeout given at init; they run on psd's
 * loop, against an etcd that answers in a millisecond or two. Not a
 * general client: no watches, no ranges over prefixes. */
#ifndef PSD_ETCD_H
#define PSD_ETCD_H

#include <stddef.h>
#include <stdint.h>

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

struct psd_etcd {
    void *curl;            /* CURL * */
    psd_etcd_post_fn post; /* NULL: libcurl */
    void *post_ctx;
    char url[PSD_ETCD_URL_MAX];
    long timeout_ms;
    char *body; /* the response being read, PSD_ETCD_BODY_MAX + 1 bytes */
    size_t body_len;
    int body_over;
    uint64_t calls, failures;
    char err[256]; /* why the last call failed */
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

#endif
