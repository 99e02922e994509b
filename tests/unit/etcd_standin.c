/* A stand-in for etcd at the HTTP boundary (etcd_standin.h). */
#include "etcd_standin.h"

#include "ps_err.h"

#include <inttypes.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void standin_init(struct standin *s)
{
    memset(s, 0, sizeof *s);
    s->rev = 1;
    s->next_lease = 7000;
    s->min_ttl = 1;
}

static int64_t num(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    if (json_is_integer(v))
        return (int64_t)json_integer_value(v);
    const char *t = json_string_value(v);
    return t != NULL ? strtoll(t, NULL, 10) : 0;
}

static json_t *num_text(int64_t v)
{
    char t[32];
    snprintf(t, sizeof t, "%" PRId64, v);
    return json_string(t);
}

/* Base64 text of o[k] decoded into out (NUL-terminated); its length, or
 * -1 when it is missing or not base64. */
static long unb64(json_t *o, const char *k, char *out, size_t cap)
{
    const char *t = json_string_value(json_object_get(o, k));
    size_t len = 0;
    if (t == NULL || sodium_base642bin((unsigned char *)out, cap - 1, t, strlen(t), NULL, &len,
                                       NULL, sodium_base64_VARIANT_ORIGINAL) != 0)
        return -1;
    out[len] = '\0';
    return (long)len;
}

static json_t *b64(const char *p, size_t n)
{
    char t[8192];
    sodium_bin2base64(t, sizeof t, (const unsigned char *)p, n, sodium_base64_VARIANT_ORIGINAL);
    return json_string(t);
}

static struct standin_kv *find(struct standin *s, const char *key)
{
    for (size_t i = 0; i < s->nkv; i++)
        if (strcmp(s->kv[i].key, key) == 0)
            return &s->kv[i];
    return NULL;
}

const struct standin_kv *standin_get(const struct standin *s, const char *key)
{
    return find((struct standin *)s, key);
}

void standin_del(struct standin *s, const char *key)
{
    struct standin_kv *kv = find(s, key);
    if (kv != NULL) {
        *kv = s->kv[--s->nkv];
        s->rev++;
    }
}

static int lease_index(const struct standin *s, int64_t id)
{
    for (size_t i = 0; i < s->nlease; i++)
        if (s->lease[i].id == id)
            return (int)i;
    return -1;
}

void standin_expire(struct standin *s, int64_t lease)
{
    int i = lease_index(s, lease);
    if (i >= 0)
        s->lease[i] = s->lease[--s->nlease];
    for (size_t k = 0; k < s->nkv;)
        if (s->kv[k].lease == lease) {
            s->kv[k] = s->kv[--s->nkv];
            s->rev++;
        } else {
            k++;
        }
}

static json_t *error(long *status, const char *text)
{
    *status = 400;
    return json_pack("{s:s, s:i}", "error", text, "code", 3);
}

static json_t *grant(struct standin *s, json_t *req)
{
    int64_t ttl = num(req, "TTL");
    if (s->nlease == STANDIN_LEASES_MAX)
        return NULL;
    s->lease[s->nlease].id = s->next_lease++;
    s->lease[s->nlease].ttl = ttl > s->min_ttl ? ttl : s->min_ttl;
    s->nlease++;
    return json_pack("{s:o, s:o}", "ID", num_text(s->lease[s->nlease - 1].id), "TTL",
                     num_text(s->lease[s->nlease - 1].ttl));
}

static json_t *keepalive(struct standin *s, json_t *req)
{
    int64_t id = num(req, "ID");
    int i = lease_index(s, id);
    json_t *r = json_pack("{s:o}", "ID", num_text(id));
    if (i >= 0) /* a lease etcd no longer has comes back without a TTL */
        json_object_set_new(r, "TTL", num_text(s->lease[i].ttl));
    return json_pack("{s:o}", "result", r);
}

static json_t *range(struct standin *s, json_t *req, long *status)
{
    char key[256];
    if (unb64(req, "key", key, sizeof key) < 0)
        return error(status, "key is not base64");
    struct standin_kv *kv = find(s, key);
    if (kv == NULL)
        return json_pack("{s:{s:o}}", "header", "revision", num_text(s->rev));
    json_t *one =
        json_pack("{s:o, s:o, s:o, s:o, s:o}", "key", b64(kv->key, strlen(kv->key)), "value",
                  b64(kv->value, kv->len), "create_revision", num_text(kv->create_rev),
                  "mod_revision", num_text(kv->mod_rev), "lease", num_text(kv->lease));
    return json_pack("{s:[o], s:s}", "kvs", one, "count", "1");
}

/* One compare of a transaction: 1 when it holds. */
static int holds(struct standin *s, json_t *c)
{
    char key[256], value[4096];
    if (unb64(c, "key", key, sizeof key) < 0)
        return 0;
    const char *target = json_string_value(json_object_get(c, "target"));
    const char *result = json_string_value(json_object_get(c, "result"));
    if (target == NULL || result == NULL || strcmp(result, "EQUAL") != 0)
        return 0;
    struct standin_kv *kv = find(s, key);
    if (strcmp(target, "VALUE") == 0) {
        long n = unb64(c, "value", value, sizeof value);
        return kv != NULL && n >= 0 && (size_t)n == kv->len &&
               memcmp(value, kv->value, kv->len) == 0;
    }
    if (strcmp(target, "CREATE") == 0)
        return (kv ? kv->create_rev : 0) == num(c, "create_revision");
    if (strcmp(target, "MOD") == 0)
        return (kv ? kv->mod_rev : 0) == num(c, "mod_revision");
    return 0;
}

static json_t *txn(struct standin *s, json_t *req, long *status)
{
    s->txns++;
    json_t *cmps = json_object_get(req, "compare"), *puts = json_object_get(req, "success");
    int ok = 1;
    for (size_t i = 0; i < json_array_size(cmps); i++)
        ok &= holds(s, json_array_get(cmps, i));
    if (!ok)
        return json_pack("{s:b}", "succeeded", 0);
    int64_t rev = ++s->rev; /* every put of one transaction gets its revision */
    for (size_t i = 0; i < json_array_size(puts); i++) {
        json_t *p = json_object_get(json_array_get(puts, i), "request_put");
        char key[256];
        static char value[4096];
        long n = p ? unb64(p, "value", value, sizeof value) : -1;
        if (unb64(p, "key", key, sizeof key) < 0 || n < 0)
            return error(status, "a put without a base64 key and value");
        int64_t lease = num(p, "lease");
        if (lease != 0 && lease_index(s, lease) < 0)
            return error(status, "etcdserver: requested lease not found");
        struct standin_kv *kv = find(s, key);
        if (kv == NULL) {
            if (s->nkv == STANDIN_KEYS_MAX)
                return error(status, "stand-in: too many keys");
            kv = &s->kv[s->nkv++];
            memset(kv, 0, sizeof *kv);
            snprintf(kv->key, sizeof kv->key, "%s", key);
            kv->create_rev = rev;
        }
        memcpy(kv->value, value, (size_t)n + 1);
        kv->len = (size_t)n;
        kv->mod_rev = rev;
        kv->lease = lease;
    }
    return json_pack("{s:b}", "succeeded", 1);
}

int standin_post(void *ctx, const char *path, const char *request, char *answer, size_t answer_max,
                 size_t *answer_len, long *status)
{
    struct standin *s = ctx;
    s->calls++;
    if (s->down)
        return PS_ETIMEDOUT;
    *status = 200;
    json_t *req = json_loads(request, 0, NULL), *ans = NULL;
    if (req == NULL)
        ans = error(status, "the request is not JSON");
    else if (strcmp(path, "lease/grant") == 0)
        ans = grant(s, req);
    else if (strcmp(path, "lease/keepalive") == 0)
        ans = keepalive(s, req);
    else if (strcmp(path, "lease/revoke") == 0) {
        standin_expire(s, num(req, "ID"));
        ans = json_object();
    } else if (strcmp(path, "kv/range") == 0)
        ans = range(s, req, status);
    else if (strcmp(path, "kv/txn") == 0)
        ans = txn(s, req, status);
    else {
        *status = 404;
        ans = json_pack("{s:s}", "error", "Not Found");
    }
    json_decref(req);
    char *text = ans != NULL ? json_dumps(ans, JSON_COMPACT) : NULL;
    json_decref(ans);
    if (text == NULL)
        return PS_ENOMEM;
    size_t n = strlen(text);
    if (n > answer_max) {
        free(text);
        return PS_ELIMIT;
    }
    memcpy(answer, text, n);
    *answer_len = n;
    free(text);
    return 0;
}
