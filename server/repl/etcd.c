/* etcd's v3 HTTP/JSON gateway (etcd.h). */
#include "etcd.h"

#include "ps_err.h"

#include <curl/curl.h>
#include <inttypes.h>
#include <jansson.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(struct psd_etcd *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(struct psd_etcd *e, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->err, sizeof e->err, fmt, ap);
    va_end(ap);
    e->failures++;
    return code;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    struct psd_etcd *e = arg;
    size_t len = size * n;
    if (e->body_len + len > PSD_ETCD_BODY_MAX) {
        e->body_over = 1;
        return 0; /* curl stops with CURLE_WRITE_ERROR */
    }
    memcpy(e->body + e->body_len, p, len);
    e->body_len += len;
    return len;
}

int psd_etcd_init(struct psd_etcd *e, const char *url, long timeout_ms, char *err, size_t errlen)
{
    memset(e, 0, sizeof *e);
    if (strncmp(url, "http://", 7) != 0 || strlen(url) >= PSD_ETCD_URL_MAX - 16)
        return ps_errf(PS_EINVAL, err, errlen,
                       "--etcd: '%s' is not http://HOST:PORT (at most %u bytes)", url,
                       PSD_ETCD_URL_MAX - 17);
    snprintf(e->url, sizeof e->url, "%s", url);
    size_t n = strlen(e->url);
    if (n > 0 && e->url[n - 1] == '/')
        e->url[n - 1] = '\0';
    e->timeout_ms = timeout_ms;
    if (sodium_init() < 0 || curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return ps_errf(PS_ENOMEM, err, errlen, "cannot start libcurl or libsodium");
    e->body = malloc(PSD_ETCD_BODY_MAX + 1);
    e->curl = curl_easy_init();
    if (e->body == NULL || e->curl == NULL) {
        psd_etcd_fini(e);
        return ps_errf(PS_ENOMEM, err, errlen, "out of memory for the etcd client");
    }
    return 0;
}

void psd_etcd_fini(struct psd_etcd *e)
{
    if (e->curl != NULL)
        curl_easy_cleanup(e->curl);
    free(e->body);
    e->curl = NULL;
    e->body = NULL;
}

void psd_etcd_set_transport(struct psd_etcd *e, psd_etcd_post_fn post, void *ctx)
{
    e->post = post;
    e->post_ctx = ctx;
}

/* libcurl's psd_etcd_post_fn. */
static int curl_post(struct psd_etcd *e, const char *path, const char *text, long *status)
{
    char url[PSD_ETCD_URL_MAX + 32];
    snprintf(url, sizeof url, "%s/v3/%s", e->url, path);
    CURL *c = e->curl;
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, e->timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, e->timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, e);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    if (e->body_over)
        return fail(e, PS_ELIMIT, "etcd %s: answer longer than %u bytes", path, PSD_ETCD_BODY_MAX);
    if (rc != CURLE_OK)
        return fail(e, rc == CURLE_OPERATION_TIMEDOUT ? PS_ETIMEDOUT : PS_EIO, "etcd %s (%s): %s",
                    path, e->url, curl_easy_strerror(rc));
    return 0;
}

/* POSTs text to url/v3/path over the transport: the answer in e->body. */
static int post(struct psd_etcd *e, const char *path, const char *text, long *status)
{
    e->body_len = 0;
    e->body_over = 0;
    e->calls++;
    if (e->post == NULL)
        return curl_post(e, path, text, status);
    int rc = e->post(e->post_ctx, path, text, e->body, PSD_ETCD_BODY_MAX, &e->body_len, status);
    if (rc == PS_ELIMIT)
        return fail(e, rc, "etcd %s: answer longer than %u bytes", path, PSD_ETCD_BODY_MAX);
    if (rc != 0)
        return fail(e, rc, "etcd %s (%s): no answer", path, e->url);
    return 0;
}

/* POSTs req (taken) to url/v3/path; the parsed answer in *out. */
static int call(struct psd_etcd *e, const char *path, json_t *req, json_t **out)
{
    *out = NULL;
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (text == NULL)
        return fail(e, PS_ENOMEM, "etcd %s: out of memory", path);
    long status = 0;
    int rc = post(e, path, text, &status);
    free(text);
    if (rc != 0)
        return rc;
    e->body[e->body_len] = '\0';
    json_error_t je;
    json_t *ans = json_loadb(e->body, e->body_len, 0, &je);
    if (ans == NULL || !json_is_object(ans)) {
        json_decref(ans);
        return fail(e, PS_EPROTO, "etcd %s: HTTP %ld, the answer is not a JSON object", path,
                    status);
    }
    const char *msg = json_string_value(json_object_get(ans, "error"));
    if (status != 200 || msg != NULL) {
        int code = fail(e, PS_EREMOTE, "etcd %s: HTTP %ld: %s", path, status,
                        msg ? msg : "(no error text)");
        json_decref(ans);
        return code;
    }
    *out = ans;
    return 0;
}

/* The gateway writes 64-bit numbers as strings; absent fields are 0. */
static int64_t num(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    if (json_is_integer(v))
        return (int64_t)json_integer_value(v);
    const char *s = json_string_value(v);
    return s != NULL ? strtoll(s, NULL, 10) : 0;
}

static json_t *num_text(int64_t v)
{
    char s[32];
    snprintf(s, sizeof s, "%" PRId64, v);
    return json_string(s);
}

static json_t *b64(const void *p, size_t n)
{
    size_t cap = sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_ORIGINAL);
    char *s = malloc(cap);
    if (s == NULL)
        return NULL;
    sodium_bin2base64(s, cap, p, n, sodium_base64_VARIANT_ORIGINAL);
    json_t *j = json_string(s);
    free(s);
    return j;
}

int psd_etcd_grant(struct psd_etcd *e, int64_t ttl_s, int64_t *lease, int64_t *granted_s)
{
    json_t *ans;
    int rc = call(e, "lease/grant", json_pack("{s:o}", "TTL", num_text(ttl_s)), &ans);
    if (rc != 0)
        return rc;
    *lease = num(ans, "ID");
    *granted_s = num(ans, "TTL");
    json_decref(ans);
    if (*lease == 0 || *granted_s <= 0)
        return fail(e, PS_EPROTO, "etcd lease/grant: no lease in the answer");
    return 0;
}

int psd_etcd_keepalive(struct psd_etcd *e, int64_t lease, int64_t *ttl_s)
{
    json_t *ans;
    int rc = call(e, "lease/keepalive", json_pack("{s:o}", "ID", num_text(lease)), &ans);
    if (rc != 0)
        return rc;
    *ttl_s = num(json_object_get(ans, "result"), "TTL");
    json_decref(ans);
    return 0;
}

int psd_etcd_revoke(struct psd_etcd *e, int64_t lease)
{
    json_t *ans;
    int rc = call(e, "lease/revoke", json_pack("{s:o}", "ID", num_text(lease)), &ans);
    json_decref(ans);
    return rc;
}

int psd_etcd_get(struct psd_etcd *e, const char *key, struct psd_etcd_kv *kv)
{
    memset(kv, 0, sizeof *kv - sizeof kv->value);
    kv->value[0] = '\0';
    json_t *ans;
    int rc = call(e, "kv/range", json_pack("{s:o}", "key", b64(key, strlen(key))), &ans);
    if (rc != 0)
        return rc;
    json_t *one = json_array_get(json_object_get(ans, "kvs"), 0);
    if (one != NULL) {
        const char *v = json_string_value(json_object_get(one, "value"));
        size_t len = 0;
        if (v != NULL &&
            sodium_base642bin((unsigned char *)kv->value, PSD_ETCD_VALUE_MAX, v, strlen(v), NULL,
                              &len, NULL, sodium_base64_VARIANT_ORIGINAL) != 0) {
            json_decref(ans);
            return fail(e, PS_EPROTO, "etcd: the value of %s is not base64 of at most %u bytes",
                        key, PSD_ETCD_VALUE_MAX);
        }
        kv->value[len] = '\0';
        kv->len = len;
        kv->found = 1;
        kv->create_rev = num(one, "create_revision");
        kv->mod_rev = num(one, "mod_revision");
        kv->lease = num(one, "lease");
    }
    json_decref(ans);
    return 0;
}

int psd_etcd_txn(struct psd_etcd *e, const struct psd_etcd_cmp *cmp, size_t ncmp,
                 const struct psd_etcd_put *put, size_t nput, int *ok)
{
    *ok = 0;
    json_t *cmps = json_array(), *puts = json_array();
    for (size_t i = 0; i < ncmp; i++) {
        const struct psd_etcd_cmp *c = &cmp[i];
        int create = c->target == PSD_ETCD_CREATE, value = c->target == PSD_ETCD_VALUE;
        json_array_append_new(
            cmps, json_pack("{s:o, s:s, s:s, s:o}", "key", b64(c->key, strlen(c->key)), "target",
                            value    ? "VALUE"
                            : create ? "CREATE"
                                     : "MOD",
                            "result", "EQUAL",
                            value    ? "value"
                            : create ? "create_revision"
                                     : "mod_revision",
                            value ? b64(c->value, strlen(c->value)) : num_text(c->rev)));
    }
    for (size_t i = 0; i < nput; i++) {
        json_t *p = json_pack("{s:o, s:o}", "key", b64(put[i].key, strlen(put[i].key)), "value",
                              b64(put[i].value, strlen(put[i].value)));
        if (p != NULL && put[i].lease != 0)
            json_object_set_new(p, "lease", num_text(put[i].lease));
        json_array_append_new(puts, json_pack("{s:o}", "request_put", p));
    }
    json_t *ans;
    int rc = call(e, "kv/txn", json_pack("{s:o, s:o}", "compare", cmps, "success", puts), &ans);
    if (rc != 0)
        return rc;
    *ok = json_is_true(json_object_get(ans, "succeeded"));
    json_decref(ans);
    return 0;
}
