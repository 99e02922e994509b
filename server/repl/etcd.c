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

static void async_free(struct psd_etcd *e);

void psd_etcd_fini(struct psd_etcd *e)
{
    async_free(e);
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

/* POSTs text to url/v3/path over a stand-in transport
 * (psd_etcd_set_transport): the answer in body, *len bytes. */
static int standin_post(struct psd_etcd *e, const char *path, const char *text, char *body,
                        size_t *len, long *status)
{
    int rc = e->post(e->post_ctx, path, text, body, PSD_ETCD_BODY_MAX, len, status);
    if (rc == PS_ELIMIT)
        return fail(e, rc, "etcd %s: answer longer than %u bytes", path, PSD_ETCD_BODY_MAX);
    if (rc != 0)
        return fail(e, rc, "etcd %s (%s): no answer", path, e->url);
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
    return standin_post(e, path, text, e->body, &e->body_len, status);
}

/* etcd's answer to path in body (len bytes, NUL after them), with HTTP
 * status: the JSON object in *out, or a PS_E* code. */
static int parse_answer(struct psd_etcd *e, const char *path, const char *body, size_t len,
                        long status, json_t **out)
{
    *out = NULL;
    json_error_t je;
    json_t *ans = json_loadb(body, len, 0, &je);
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

/* POSTs req (taken) to url/v3/path, holding the caller; the parsed
 * answer in *out. */
static int call(struct psd_etcd *e, const char *path, json_t *req, json_t **out)
{
    *out = NULL;
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (text == NULL)
        return fail(e, PS_ENOMEM, "etcd %s: out of memory", path);
    long status = 0;
    e->blocking++;
    int rc = post(e, path, text, &status);
    free(text);
    if (rc != 0)
        return rc;
    e->body[e->body_len] = '\0';
    return parse_answer(e, path, e->body, e->body_len, status, out);
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

static json_t *keepalive_request(int64_t lease)
{
    return json_pack("{s:o}", "ID", num_text(lease));
}

/* What is left of the lease, from keepalive's answer. */
static int64_t keepalive_ttl(json_t *ans)
{
    return num(json_object_get(ans, "result"), "TTL");
}

int psd_etcd_keepalive(struct psd_etcd *e, int64_t lease, int64_t *ttl_s)
{
    json_t *ans;
    int rc = call(e, "lease/keepalive", keepalive_request(lease), &ans);
    if (rc != 0)
        return rc;
    *ttl_s = keepalive_ttl(ans);
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

static json_t *txn_request(const struct psd_etcd_cmp *cmp, size_t ncmp,
                           const struct psd_etcd_put *put, size_t nput)
{
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
    return json_pack("{s:o, s:o}", "compare", cmps, "success", puts);
}

int psd_etcd_txn(struct psd_etcd *e, const struct psd_etcd_cmp *cmp, size_t ncmp,
                 const struct psd_etcd_put *put, size_t nput, int *ok)
{
    *ok = 0;
    json_t *ans;
    int rc = call(e, "kv/txn", txn_request(cmp, ncmp, put, nput), &ans);
    if (rc != 0)
        return rc;
    *ok = json_is_true(json_object_get(ans, "succeeded"));
    json_decref(ans);
    return 0;
}

/* ---- asynchronous calls: libcurl's multi interface on a libuv loop ---------- */

enum { ASYNC_KEEPALIVE = 1, ASYNC_TXN = 2 };

static size_t on_async_body(char *p, size_t size, size_t n, void *arg)
{
    struct psd_etcd_async *a = arg;
    size_t len = size * n;
    if (a->body_len + len > PSD_ETCD_BODY_MAX) {
        a->body_over = 1;
        return 0;
    }
    memcpy(a->body + a->body_len, p, len);
    a->body_len += len;
    return len;
}

/* The call ended (rc: the transport's verdict): its answer parsed, and
 * the caller told. */
static void async_end(struct psd_etcd *e, int rc, long status)
{
    struct psd_etcd_async *a = e->async;
    json_t *ans = NULL;
    int64_t value = 0;
    if (rc == 0) {
        a->body[a->body_len] = '\0';
        rc = parse_answer(e, a->path, a->body, a->body_len, status, &ans);
    }
    if (rc == 0)
        value = a->kind == ASYNC_KEEPALIVE ? keepalive_ttl(ans)
                                           : json_is_true(json_object_get(ans, "succeeded"));
    json_decref(ans);
    free(a->request);
    a->request = NULL;
    a->busy = 0;
    a->done(a->ctx, rc, value); /* may start the next call */
}

static void check_done(struct psd_etcd *e)
{
    struct psd_etcd_async *a = e->async;
    CURLMsg *m;
    int left;
    while (a->busy && (m = curl_multi_info_read(a->multi, &left)) != NULL) {
        if (m->msg != CURLMSG_DONE)
            continue;
        CURLcode cc = m->data.result;
        long status = 0;
        curl_easy_getinfo(a->easy, CURLINFO_RESPONSE_CODE, &status);
        curl_multi_remove_handle(a->multi, a->easy);
        int rc = 0;
        if (a->body_over)
            rc = fail(e, PS_ELIMIT, "etcd %s: answer longer than %u bytes", a->path,
                      PSD_ETCD_BODY_MAX);
        else if (cc != CURLE_OK)
            rc = fail(e, cc == CURLE_OPERATION_TIMEDOUT ? PS_ETIMEDOUT : PS_EIO, "etcd %s (%s): %s",
                      a->path, e->url, curl_easy_strerror(cc));
        async_end(e, rc, status);
    }
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    struct psd_etcd_sock *k = h->data;
    struct psd_etcd_async *a = k->e->async;
    int flags = status < 0 ? CURL_CSELECT_ERR : 0;
    if (status == 0 && (events & UV_READABLE))
        flags |= CURL_CSELECT_IN;
    if (status == 0 && (events & UV_WRITABLE))
        flags |= CURL_CSELECT_OUT;
    int running = 0;
    curl_multi_socket_action(a->multi, k->fd, flags, &running);
    check_done(k->e);
}

static void on_sock_closed(uv_handle_t *h)
{
    struct psd_etcd_sock *k = h->data;
    k->fd = -1;
}

/* CURLMOPT_SOCKETFUNCTION: which sockets to watch, and for what. */
static int on_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    (void)easy;
    (void)socketp;
    struct psd_etcd *e = userp;
    struct psd_etcd_async *a = e->async;
    if (a->closed)
        return 0;
    struct psd_etcd_sock *k = NULL, *free_one = NULL;
    for (uint32_t i = 0; i < PSD_ETCD_SOCKS; i++) {
        if (a->socks[i].open && a->socks[i].fd == s)
            k = &a->socks[i];
        else if (!a->socks[i].open && a->socks[i].fd == -1 && free_one == NULL)
            free_one = &a->socks[i];
    }
    if (what == CURL_POLL_REMOVE) {
        if (k != NULL) {
            k->open = 0;
            uv_close((uv_handle_t *)&k->poll, on_sock_closed);
        }
        return 0;
    }
    if (k == NULL) {
        if (free_one == NULL || uv_poll_init_socket(a->loop, &free_one->poll, s) != 0)
            return -1; /* curl fails the call */
        k = free_one;
        k->fd = s;
        k->open = 1;
        k->poll.data = k;
    }
    int ev = (what & CURL_POLL_IN ? UV_READABLE : 0) | (what & CURL_POLL_OUT ? UV_WRITABLE : 0);
    uv_poll_start(&k->poll, ev, on_poll);
    return 0;
}

static void on_timeout(uv_timer_t *t)
{
    struct psd_etcd *e = t->data;
    int running = 0;
    curl_multi_socket_action(e->async->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    check_done(e);
}

/* CURLMOPT_TIMERFUNCTION: when curl wants to be called without a socket. */
static int on_curl_timer(CURLM *multi, long timeout_ms, void *userp)
{
    (void)multi;
    struct psd_etcd *e = userp;
    struct psd_etcd_async *a = e->async;
    if (a->closed)
        return 0;
    if (timeout_ms < 0)
        uv_timer_stop(&a->timer);
    else
        uv_timer_start(&a->timer, on_timeout, (uint64_t)timeout_ms, 0);
    return 0;
}

int psd_etcd_async_start(struct psd_etcd *e, uv_loop_t *loop, long timeout_ms, char *err,
                         size_t errlen)
{
    struct psd_etcd_async *a = calloc(1, sizeof *a);
    if (a == NULL || (a->body = malloc(PSD_ETCD_BODY_MAX + 1)) == NULL ||
        (a->multi = curl_multi_init()) == NULL || (a->easy = curl_easy_init()) == NULL) {
        if (a != NULL) {
            if (a->multi != NULL)
                curl_multi_cleanup(a->multi);
            free(a->body);
        }
        free(a);
        return ps_errf(PS_ENOMEM, err, errlen, "out of memory for the etcd client's loop side");
    }
    a->loop = loop;
    e->async_timeout_ms = timeout_ms;
    for (uint32_t i = 0; i < PSD_ETCD_SOCKS; i++) {
        a->socks[i].fd = -1;
        a->socks[i].e = e;
    }
    uv_timer_init(loop, &a->timer);
    a->timer.data = e;
    curl_multi_setopt(a->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(a->multi, CURLMOPT_SOCKETDATA, e);
    curl_multi_setopt(a->multi, CURLMOPT_TIMERFUNCTION, on_curl_timer);
    curl_multi_setopt(a->multi, CURLMOPT_TIMERDATA, e);
    e->async = a;
    return 0;
}

int psd_etcd_busy(const struct psd_etcd *e)
{
    return e->async != NULL && e->async->busy;
}

/* Starts req (taken) to url/v3/path. */
static int async_call(struct psd_etcd *e, const char *path, json_t *req, int kind,
                      psd_etcd_done_fn done, void *ctx)
{
    struct psd_etcd_async *a = e->async;
    if (a == NULL || a->closed || a->busy) {
        json_decref(req);
        return a == NULL || a->closed ? PS_ESTATE : PS_EBUSY;
    }
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (text == NULL)
        return fail(e, PS_ENOMEM, "etcd %s: out of memory", path);
    e->calls++;
    snprintf(a->path, sizeof a->path, "%s", path);
    a->request = text;
    a->kind = kind;
    a->done = done;
    a->ctx = ctx;
    a->body_len = 0;
    a->body_over = 0;
    a->busy = 1;
    if (e->post != NULL) { /* a stand-in: at once */
        long status = 0;
        int rc = standin_post(e, path, text, a->body, &a->body_len, &status);
        async_end(e, rc, status); /* status is set by the call above */
        return 0;
    }
    char url[PSD_ETCD_URL_MAX + 32];
    snprintf(url, sizeof url, "%s/v3/%s", e->url, path);
    CURL *c = a->easy;
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, a->request);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, e->async_timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, e->async_timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_async_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, a);
    if (curl_multi_add_handle(a->multi, c) != CURLM_OK) {
        free(a->request);
        a->request = NULL;
        a->busy = 0;
        return fail(e, PS_ENOMEM, "etcd %s: libcurl cannot start the call", path);
    }
    return 0;
}

int psd_etcd_keepalive_async(struct psd_etcd *e, int64_t lease, psd_etcd_done_fn done, void *ctx)
{
    return async_call(e, "lease/keepalive", keepalive_request(lease), ASYNC_KEEPALIVE, done, ctx);
}

int psd_etcd_txn_async(struct psd_etcd *e, const struct psd_etcd_cmp *cmp, size_t ncmp,
                       const struct psd_etcd_put *put, size_t nput, psd_etcd_done_fn done,
                       void *ctx)
{
    return async_call(e, "kv/txn", txn_request(cmp, ncmp, put, nput), ASYNC_TXN, done, ctx);
}

void psd_etcd_async_close(struct psd_etcd *e)
{
    struct psd_etcd_async *a = e->async;
    if (a == NULL || a->closed)
        return;
    a->closed = 1; /* curl's callbacks touch no handle from here on */
    if (a->busy && e->post == NULL)
        curl_multi_remove_handle(a->multi, a->easy);
    a->busy = 0;
    for (uint32_t i = 0; i < PSD_ETCD_SOCKS; i++)
        if (a->socks[i].open) {
            a->socks[i].open = 0;
            uv_close((uv_handle_t *)&a->socks[i].poll, on_sock_closed);
        }
    uv_close((uv_handle_t *)&a->timer, NULL);
}

static void async_free(struct psd_etcd *e)
{
    struct psd_etcd_async *a = e->async;
    if (a == NULL)
        return;
    a->closed = 1;
    if (a->busy && e->post == NULL)
        curl_multi_remove_handle(a->multi, a->easy);
    curl_multi_cleanup(a->multi);
    curl_easy_cleanup(a->easy);
    free(a->body);
    free(a->request);
    free(a);
    e->async = NULL;
}
