/* A stand-in for etcd at the HTTP boundary (server/repl/etcd.h,
 * psd_etcd_post_fn): it answers the v3 gateway's JSON calls that psd
 * makes (lease grant, keepalive and revoke, range of one key, and
 * transactions that compare a key's create or mod revision or value and
 * then put) from a store in memory, with etcd's revisions and leases.
 * A test drives time itself: leases expire when it says so, and etcd
 * "goes down" (no answer) while down is set. Not a general etcd. */
#ifndef PSTEST_ETCD_STANDIN_H
#define PSTEST_ETCD_STANDIN_H

#include <stddef.h>
#include <stdint.h>

#define STANDIN_KEYS_MAX   16
#define STANDIN_LEASES_MAX 16

struct standin_kv {
    char key[256];
    char value[4096];
    size_t len;
    int64_t create_rev, mod_rev, lease;
};

struct standin {
    struct standin_kv kv[STANDIN_KEYS_MAX];
    size_t nkv;
    struct {
        int64_t id, ttl;
    } lease[STANDIN_LEASES_MAX];
    size_t nlease;
    int64_t rev, next_lease;
    int64_t min_ttl; /* a grant gives at least this (etcd's minimum) */
    int down;        /* no answer: the call fails as a timeout would */
    unsigned calls, txns;
};

void standin_init(struct standin *s);
/* psd_etcd_post_fn: ctx is the struct standin. */
int standin_post(void *ctx, const char *path, const char *request, char *answer, size_t answer_max,
                 size_t *answer_len, long *status);
/* The lease runs out: its keys are deleted, as etcd does. */
void standin_expire(struct standin *s, int64_t lease);
/* The key's record, or NULL. */
const struct standin_kv *standin_get(const struct standin *s, const char *key);
/* Deletes a key (an operator's etcdctl del). */
void standin_del(struct standin *s, const char *key);

#endif
