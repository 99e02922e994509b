/* Leadership of a replicated shard through etcd (lead.h). */
#include "lead.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_log.h"

#include <inttypes.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int psd_lead_init(struct psd_lead *l, const char *url, const char *prefix, uint32_t shard,
                  uint32_t shards, uint64_t id, const char *endpoint, int64_t ttl_s, char *err,
                  size_t errlen)
{
    memset(l, 0, sizeof *l);
    if (prefix[0] != '/' || strlen(prefix) > PSD_ETCD_PREFIX_MAX)
        return ps_errf(PS_EINVAL, err, errlen,
                       "--etcd-prefix: '%s' must start with / and be at most %u bytes", prefix,
                       PSD_ETCD_PREFIX_MAX);
    snprintf(l->leader_key, sizeof l->leader_key, "%s/shard-%u-of-%u/leader", prefix, shard,
             shards);
    snprintf(l->insync_key, sizeof l->insync_key, "%s/shard-%u-of-%u/insync", prefix, shard,
             shards);
    l->id = id;
    snprintf(l->endpoint, sizeof l->endpoint, "%s", endpoint);
    l->ttl_s = ttl_s;
    /* a blocking call holds psd's loop PSD_ETCD_CALL_MS at most (etcd
     * answers in a millisecond or two; one fsync on a slow disk takes
     * tens); psd makes them only where it serves nobody */
    return psd_etcd_init(&l->etcd, url, PSD_ETCD_CALL_MS, err, errlen);
}

void psd_lead_fini(struct psd_lead *l)
{
    psd_etcd_fini(&l->etcd);
}

static uint64_t hex_id(const char *s)
{
    return s != NULL ? strtoull(s, NULL, 16) : 0;
}

int psd_lead_read(struct psd_lead *l, struct psd_lead_view *v)
{
    memset(v, 0, sizeof *v);
    struct psd_etcd_kv *kv = malloc(sizeof *kv);
    if (kv == NULL)
        return PS_ENOMEM;
    int rc = psd_etcd_get(&l->etcd, l->leader_key, kv);
    json_t *j = NULL;
    if (rc == 0 && kv->found && (j = json_loads(kv->value, 0, NULL)) != NULL) {
        v->leader = 1;
        if (kv->len < sizeof v->leader_value) /* longer: no takeover compares it */
            memcpy(v->leader_value, kv->value, kv->len + 1);
        v->epoch = (uint64_t)json_integer_value(json_object_get(j, "epoch"));
        v->leader_id = hex_id(json_string_value(json_object_get(j, "id")));
        const char *ep = json_string_value(json_object_get(j, "endpoint"));
        snprintf(v->endpoint, sizeof v->endpoint, "%s", ep ? ep : "");
    }
    json_decref(j);
    j = NULL;
    if (rc == 0)
        rc = psd_etcd_get(&l->etcd, l->insync_key, kv);
    if (rc == 0 && kv->found && (j = json_loads(kv->value, 0, NULL)) != NULL) {
        v->insync_found = 1;
        v->insync_rev = kv->mod_rev;
        uint64_t e = (uint64_t)json_integer_value(json_object_get(j, "epoch"));
        v->insync_epoch = e;
        if (!v->leader)
            v->epoch = e;
        json_t *m = json_object_get(j, "members");
        size_t used = 0;
        for (size_t i = 0; i < json_array_size(m); i++) {
            const char *one = json_string_value(json_array_get(m, i));
            if (one == NULL)
                continue;
            v->member |= hex_id(one) == l->id;
            size_t len = strlen(one);
            if (used + len + 3 < sizeof v->members) {
                memcpy(v->members + used, used ? ", " : "", used ? 2 : 0);
                used += used ? 2 : 0;
                memcpy(v->members + used, one, len + 1);
                used += len;
            }
        }
        json_t *st = json_object_get(j, "stopped");
        if (json_is_object(st)) {
            v->stopped = 1;
            v->stopped_epoch = (uint64_t)json_integer_value(json_object_get(st, "epoch"));
            v->stopped_seq = (uint64_t)json_integer_value(json_object_get(st, "seq"));
        }
    } else if (rc == 0 && kv->found) {
        rc = PS_EPROTO;
        snprintf(l->etcd.err, sizeof l->etcd.err, "etcd: the in-sync key is not JSON");
    }
    json_decref(j);
    free(kv);
    return rc;
}

/* The in-sync set's value: this process first, then the backups; with
 * stopped, the clean stop's position (seq of the epoch). */
static char *insync_text(const struct psd_lead *l, uint64_t epoch, const uint64_t *ids,
                         const char *const *endpoints, uint32_t n, int stopped, uint64_t seq)
{
    json_t *m = json_array();
    char one[PS_ENDPOINT_MAX + 24];
    snprintf(one, sizeof one, "%016" PRIx64 "@%s", l->id, l->endpoint);
    json_array_append_new(m, json_string(one));
    for (uint32_t i = 0; i < n; i++) {
        snprintf(one, sizeof one, "%016" PRIx64 "@%s", ids[i], endpoints[i]);
        json_array_append_new(m, json_string(one));
    }
    json_t *o = json_pack("{s:I, s:o}", "epoch", (json_int_t)epoch, "members", m);
    if (o != NULL && stopped)
        json_object_set_new(
            o, "stopped",
            json_pack("{s:I, s:I}", "epoch", (json_int_t)epoch, "seq", (json_int_t)seq));
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text;
}

int psd_lead_campaign(struct psd_lead *l, const struct psd_lead_view *v, int *won)
{
    *won = 0;
    if (v->insync_found ? !v->member && !(v->resume && !v->leader) : v->leader)
        return 0;
    int rc;
    int64_t granted = 0;
    uint64_t asked = (uint64_t)ps_mono_ms();
    if (l->lease == 0 && (rc = psd_etcd_grant(&l->etcd, l->ttl_s, &l->lease, &granted)) != 0)
        return rc;
    if (granted > 0)
        l->granted_s = granted;
    uint64_t epoch = v->epoch + 1;
    char id[24];
    snprintf(id, sizeof id, "%016" PRIx64, l->id);
    json_t *o =
        json_pack("{s:I, s:s, s:s}", "epoch", (json_int_t)epoch, "id", id, "endpoint", l->endpoint);
    char *lv = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    char *sv = insync_text(l, epoch, NULL, NULL, 0, 0, 0);
    if (lv == NULL || sv == NULL || strlen(lv) >= sizeof l->leader_value) {
        free(lv);
        free(sv);
        return PS_ENOMEM;
    }
    struct psd_etcd_cmp cmp[2] = {
        v->leader ? (struct psd_etcd_cmp){.key = l->leader_key,
                                          .target = PSD_ETCD_VALUE,
                                          .value = v->leader_value}
                  : (struct psd_etcd_cmp){.key = l->leader_key, .target = PSD_ETCD_CREATE},
        {.key = l->insync_key,
         .target = v->insync_found ? PSD_ETCD_MOD : PSD_ETCD_CREATE,
         .rev = v->insync_found ? v->insync_rev : 0},
    };
    struct psd_etcd_put put[2] = {{l->leader_key, lv, l->lease}, {l->insync_key, sv, 0}};
    rc = psd_etcd_txn(&l->etcd, cmp, 2, put, 2, won);
    if (rc == 0 && *won) {
        snprintf(l->leader_value, sizeof l->leader_value, "%s", lv);
        l->epoch = epoch;
        l->renewed_ms = asked;
        l->lease_until_ms = asked + (uint64_t)l->granted_s * PSD_LEASE_SURE_MS_PER_S;
    }
    free(lv);
    free(sv);
    return rc;
}

/* A lease's renewal is due a third of its TTL after the last, and
 * PSD_ETCD_RETRY_MS after a try that failed. */
static int due(int64_t lease, int64_t granted_s, uint64_t renewed_ms, uint64_t tried_ms,
               uint64_t now_ms)
{
    return lease != 0 && now_ms - renewed_ms >= (uint64_t)granted_s * 1000u / PSD_RENEWS_PER_TTL &&
           now_ms - tried_ms >= PSD_ETCD_RETRY_MS;
}

int psd_lead_renew_due(const struct psd_lead *l, uint64_t now_ms)
{
    return due(l->lease, l->granted_s, l->renewed_ms, l->tried_ms, now_ms);
}

/* The keepalive's answer: what is left of the lease from when it was
 * asked. */
static int renewed(struct psd_lead *l, uint64_t asked_ms, int64_t ttl)
{
    if (ttl <= 0) {
        l->lease = 0;
        l->lease_until_ms = 0;
        snprintf(l->etcd.err, sizeof l->etcd.err, "etcd no longer holds this process's lease");
        return PS_ESTATE;
    }
    l->renewed_ms = asked_ms;
    l->lease_until_ms = asked_ms + (uint64_t)ttl * PSD_LEASE_SURE_MS_PER_S;
    return 0;
}

static void on_keepalive(void *ctx, int rc, int64_t ttl)
{
    struct psd_lead *l = ctx;
    if (l->lease != l->renew_lease) /* given up meanwhile */
        rc = PS_ESTATE;
    else if (rc == 0)
        rc = renewed(l, l->renew_asked_ms, ttl);
    l->renew_done(l->renew_ctx, rc, 0);
}

int psd_lead_renew_async(struct psd_lead *l, uint64_t now_ms, psd_etcd_done_fn done, void *ctx)
{
    if (l->lease == 0)
        return PS_ESTATE;
    if (psd_etcd_busy(&l->etcd))
        return PS_EBUSY;
    l->tried_ms = now_ms;
    l->renew_lease = l->lease;
    l->renew_asked_ms = now_ms;
    l->renew_done = done;
    l->renew_ctx = ctx;
    return psd_etcd_keepalive_async(&l->etcd, l->lease, on_keepalive, l);
}

/* Puts the in-sync key if this process still holds the leader key:
 * blocking (done NULL: *ok says), or asynchronous (done(ctx, rc, ok)). */
static int put_insync(struct psd_lead *l, const uint64_t *ids, const char *const *endpoints,
                      uint32_t n, int stopped, uint64_t seq, int *ok, psd_etcd_done_fn done,
                      void *ctx)
{
    if (ok != NULL)
        *ok = 0;
    char *sv = insync_text(l, l->epoch, ids, endpoints, n, stopped, seq);
    if (sv == NULL)
        return PS_ENOMEM;
    /* etcd compares values too: the leader key still holds what this
     * process wrote (its epoch and id) */
    struct psd_etcd_cmp cmp = {
        .key = l->leader_key, .target = PSD_ETCD_VALUE, .value = l->leader_value};
    struct psd_etcd_put put = {l->insync_key, sv, 0};
    int rc = done != NULL ? psd_etcd_txn_async(&l->etcd, &cmp, 1, &put, 1, done, ctx)
                          : psd_etcd_txn(&l->etcd, &cmp, 1, &put, 1, ok);
    free(sv);
    return rc;
}

int psd_lead_set_insync_async(struct psd_lead *l, const uint64_t *ids, const char *const *endpoints,
                              uint32_t n, psd_etcd_done_fn done, void *ctx)
{
    return put_insync(l, ids, endpoints, n, 0, 0, NULL, done, ctx);
}

int psd_lead_set_stopped(struct psd_lead *l, const uint64_t *ids, const char *const *endpoints,
                         uint32_t n, uint64_t seq, int *ok)
{
    return put_insync(l, ids, endpoints, n, 1, seq, ok, NULL, NULL);
}

void psd_lead_resign(struct psd_lead *l)
{
    if (l->lease != 0)
        psd_etcd_revoke(&l->etcd, l->lease);
    l->lease = 0;
    l->lease_until_ms = 0;
}

/* ---- a stable identity ------------------------------------------------------- */

int psd_lead_name_check(const char *name, char *err, size_t errlen)
{
    size_t n = strlen(name);
    if (n == 0 || n > PSD_REPLICA_NAME_MAX)
        return ps_errf(PS_EINVAL, err, errlen, "--replica-name '%s': 1 to %u characters", name,
                       PSD_REPLICA_NAME_MAX);
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return ps_errf(PS_EINVAL, err, errlen,
                           "--replica-name '%s': character %zu is not a letter, a digit, '.', '_' "
                           "or '-'",
                           name, i + 1);
    }
    return 0;
}

uint64_t psd_lead_name_id(const char *name)
{
    uint8_t h[8];
    crypto_generichash(h, sizeof h, (const unsigned char *)name, strlen(name), NULL, 0);
    uint64_t id = 0;
    for (size_t i = 0; i < sizeof h; i++)
        id = id << 8 | h[i];
    return id != 0 ? id : 1;
}

int psd_lead_claim(struct psd_lead *l, const char *name, char *holder, size_t holderlen)
{
    holder[0] = '\0';
    snprintf(l->name, sizeof l->name, "%s", name);
    /* the shard's keys' prefix: the leader key without its last part */
    size_t base = strlen(l->leader_key) - strlen("leader");
    snprintf(l->member_key, sizeof l->member_key, "%.*smember-%s", (int)base, l->leader_key, name);
    int rc;
    int64_t granted = 0;
    uint64_t asked = (uint64_t)ps_mono_ms();
    /* a lease of its own each try: one from a try that failed may have
     * run out while this process waited */
    if ((rc = psd_etcd_grant(&l->etcd, l->ttl_s, &l->member_lease, &granted)) != 0) {
        l->member_lease = 0;
        return rc;
    }
    l->member_granted_s = granted;
    l->member_renewed_ms = asked;
    char id[24];
    snprintf(id, sizeof id, "%016" PRIx64, l->id);
    json_t *o = json_pack("{s:s, s:s}", "id", id, "endpoint", l->endpoint);
    char *value = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (value == NULL)
        return PS_ENOMEM;
    struct psd_etcd_cmp cmp = {.key = l->member_key, .target = PSD_ETCD_CREATE};
    struct psd_etcd_put put = {l->member_key, value, l->member_lease};
    int ok = 0;
    rc = psd_etcd_txn(&l->etcd, &cmp, 1, &put, 1, &ok);
    free(value);
    if (rc == 0 && ok)
        return 0;
    struct psd_etcd_kv *kv = rc == 0 ? malloc(sizeof *kv) : NULL;
    if (kv != NULL && (rc = psd_etcd_get(&l->etcd, l->member_key, kv)) == 0 && !kv->found)
        rc = PS_EAGAIN; /* its holder's lease ran out just now: try again */
    if (kv != NULL && rc == 0) {
        json_t *j = json_loads(kv->value, 0, NULL);
        const char *ep = json_string_value(json_object_get(j, "endpoint"));
        snprintf(holder, holderlen, "%s", ep ? ep : "an unknown endpoint");
        json_decref(j);
        rc = PS_EBUSY;
    }
    free(kv);
    psd_etcd_revoke(&l->etcd, l->member_lease); /* this try's: not needed */
    l->member_lease = 0;
    return rc != 0 ? rc : PS_ENOMEM;
}

int psd_lead_member_due(const struct psd_lead *l, uint64_t now_ms)
{
    return due(l->member_lease, l->member_granted_s, l->member_renewed_ms, l->member_tried_ms,
               now_ms);
}

static void on_member_keepalive(void *ctx, int rc, int64_t ttl)
{
    struct psd_lead *l = ctx;
    if (rc == 0 && ttl <= 0) {
        l->member_lease = 0;
        snprintf(l->etcd.err, sizeof l->etcd.err,
                 "etcd no longer holds the lease of this replica's name");
        rc = PS_ESTATE;
    } else if (rc == 0) {
        l->member_renewed_ms = l->member_tried_ms;
    }
    l->member_done(l->member_ctx, rc, 0);
}

int psd_lead_member_renew_async(struct psd_lead *l, uint64_t now_ms, psd_etcd_done_fn done,
                                void *ctx)
{
    if (l->member_lease == 0)
        return PS_ESTATE;
    l->member_tried_ms = now_ms;
    l->member_done = done;
    l->member_ctx = ctx;
    return psd_etcd_keepalive_async(&l->etcd, l->member_lease, on_member_keepalive, l);
}

void psd_lead_unclaim(struct psd_lead *l)
{
    if (l->member_lease != 0)
        psd_etcd_revoke(&l->etcd, l->member_lease); /* the name's key goes with it */
    l->member_lease = 0;
}

int psd_lead_claim_at_start(struct psd_lead *l, const char *name, struct ps_log *log, char *err,
                            size_t errlen)
{
    uint64_t deadline = (uint64_t)ps_mono_ms() + 2000u * (uint64_t)l->ttl_s + 1000u;
    char holder[PS_ENDPOINT_MAX];
    int rc, said = 0;
    while ((rc = psd_lead_claim(l, name, holder, sizeof holder)) != 0 &&
           (uint64_t)ps_mono_ms() < deadline) {
        if (!said++)
            PS_LOG(log, PS_LOG_WARN, S0727,
                   "--replica-name %s is held by %s: waiting up to %llu ms for its lease to run "
                   "out (a process that stopped lets it go; one that runs keeps it)",
                   name, rc == PS_EBUSY ? holder : l->etcd.err,
                   (unsigned long long)(deadline - (uint64_t)ps_mono_ms()));
        struct timespec ts = {0, 100 * 1000000L}; /* etcd is asked again every 100 ms */
        nanosleep(&ts, NULL);
    }
    if (rc == PS_EBUSY) {
        PS_LOG(log, PS_LOG_ERROR, S0726,
               "--replica-name %s is held by the process at %s: two processes may not share "
               "one",
               name, holder);
        return ps_errf(PS_EBUSY, err, errlen,
                       "--replica-name %s: held by the process at %s, which runs (etcd key %s)",
                       name, holder, l->member_key);
    }
    if (rc != 0)
        return ps_errf(rc, err, errlen, "--replica-name %s: cannot claim it in etcd: %s", name,
                       l->etcd.err);
    return 0;
}
