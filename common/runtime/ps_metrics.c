/* The /metrics and /healthz endpoints (libmicrohttpd, its own polling
 * thread). */
#include "ps_metrics.h"
#include "ps_clock.h"

#include "ps_limits.h"

#include "ps_err.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

/* ---- HTTP ------------------------------------------------------------------ */

struct ps_metrics {
    struct MHD_Daemon *d;
    int port;
    pthread_mutex_t mu;
    struct ps_buf text; /* the published copy */
    uint64_t published_ms;
    int ready; /* ps_metrics_set_ready; 1 until told otherwise */
    char ready_why[PS_METRICS_WHY_MAX];
};

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status, const char *type,
                               const char *body, size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ok = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_len, void **con_cls)
{
    (void)version;
    (void)upload;
    (void)con_cls;
    struct ps_metrics *m = cls;
    static const char plain[] = "text/plain; charset=utf-8";
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
        *upload_len = 0; /* any body is read and dropped */
        static const char msg[] = "only GET and HEAD\n";
        return respond(conn, MHD_HTTP_METHOD_NOT_ALLOWED, plain, msg, sizeof msg - 1);
    }
    if (strcmp(url, "/metrics") == 0) {
        pthread_mutex_lock(&m->mu);
        enum MHD_Result r = respond(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
                                    m->text.p != NULL ? m->text.p : "", m->text.len);
        pthread_mutex_unlock(&m->mu);
        return r;
    }
    if (strcmp(url, "/readyz") == 0) {
        char msg[PS_METRICS_WHY_MAX + 32];
        pthread_mutex_lock(&m->mu);
        int ready = m->ready;
        int n = snprintf(msg, sizeof msg, "%s: %s\n", ready ? "ready" : "not ready", m->ready_why);
        pthread_mutex_unlock(&m->mu);
        if (n >= (int)sizeof msg)
            n = (int)sizeof msg - 1;
        return respond(conn, ready ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, plain, msg,
                       (size_t)n);
    }
    if (strcmp(url, "/healthz") == 0) {
        pthread_mutex_lock(&m->mu);
        uint64_t age = (uint64_t)ps_mono_ms() - m->published_ms;
        pthread_mutex_unlock(&m->mu);
        char msg[160];
        if (age < PS_METRICS_STALE_MS)
            return respond(conn, MHD_HTTP_OK, plain, "ok\n", 3);
        int n = snprintf(msg, sizeof msg,
                         "unhealthy: the process has not published its state for %llu ms\n",
                         (unsigned long long)age);
        return respond(conn, MHD_HTTP_SERVICE_UNAVAILABLE, plain, msg, (size_t)n);
    }
    static const char msg[] = "not found: try /metrics, /healthz or /readyz\n";
    return respond(conn, MHD_HTTP_NOT_FOUND, plain, msg, sizeof msg - 1);
}

/* ADDR:PORT or [ADDR6]:PORT into a socket address. */
static int parse_listen(const char *s, struct sockaddr_storage *sa, int *v6, char *err,
                        size_t errlen)
{
    char host[64];
    const char *port;
    memset(sa, 0, sizeof *sa);
    *v6 = s[0] == '[';
    if (*v6) {
        const char *close = strchr(s, ']');
        if (close == NULL || close[1] != ':' || (size_t)(close - s - 1) >= sizeof host) {
            snprintf(err, errlen, "--metrics-listen '%s': expected [IPV6]:PORT", s);
            return PS_EINVAL;
        }
        memcpy(host, s + 1, (size_t)(close - s - 1));
        host[close - s - 1] = '\0';
        port = close + 2;
    } else {
        const char *colon = strrchr(s, ':');
        if (colon == NULL || (size_t)(colon - s) >= sizeof host) {
            snprintf(err, errlen, "--metrics-listen '%s': expected ADDR:PORT (e.g. 127.0.0.1:9100)",
                     s);
            return PS_EINVAL;
        }
        memcpy(host, s, (size_t)(colon - s));
        host[colon - s] = '\0';
        if (host[0] == '\0')
            snprintf(host, sizeof host, "0.0.0.0");
        port = colon + 1;
    }
    char *end;
    errno = 0;
    unsigned long p = strtoul(port, &end, 10);
    if (port[0] < '0' || port[0] > '9' || *end != '\0' || errno != 0 || p > 65535) {
        snprintf(err, errlen, "--metrics-listen '%s': port '%s' is not a number in 0..65535", s,
                 port);
        return PS_EINVAL;
    }
    int ok;
    if (*v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)sa;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)p);
        ok = inet_pton(AF_INET6, host, &a->sin6_addr);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)sa;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)p);
        ok = inet_pton(AF_INET, host, &a->sin_addr);
    }
    if (ok != 1) {
        snprintf(err, errlen, "--metrics-listen '%s': '%s' is not a numeric IPv%d address", s, host,
                 *v6 ? 6 : 4);
        return PS_EINVAL;
    }
    return 0;
}

int ps_metrics_start(struct ps_metrics **out, const char *listen, char *err, size_t errlen)
{
    struct sockaddr_storage sa;
    int v6;
    *out = NULL;
    int rc = parse_listen(listen, &sa, &v6, err, errlen);
    if (rc != 0)
        return rc;
    struct ps_metrics *m = calloc(1, sizeof *m);
    if (m == NULL) {
        snprintf(err, errlen, "--metrics-listen: out of memory");
        return PS_ENOMEM;
    }
    pthread_mutex_init(&m->mu, NULL);
    m->published_ms = (uint64_t)ps_mono_ms();
    m->ready = 1;
    snprintf(m->ready_why, sizeof m->ready_why, "serving");
    /* One address cannot take every connection (a slow client holding
     * them would fail the orchestrator's /healthz), and a connection
     * silent for PS_METRICS_IDLE_S is closed. */
    m->d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | (v6 ? MHD_USE_IPv6 : 0), 0, NULL, NULL,
        on_request, m, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT,
        PS_METRICS_CONNS_MAX, MHD_OPTION_PER_IP_CONNECTION_LIMIT, PS_METRICS_CONNS_PER_ADDR_MAX,
        MHD_OPTION_CONNECTION_TIMEOUT, PS_METRICS_IDLE_S, MHD_OPTION_END);
    if (m->d == NULL) {
        snprintf(err, errlen, "--metrics-listen '%s': cannot listen there (%s)", listen,
                 errno ? strerror(errno) : "libmicrohttpd refused");
        pthread_mutex_destroy(&m->mu);
        free(m);
        return PS_EIO;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_BIND_PORT);
    m->port = info != NULL ? info->port : 0;
    *out = m;
    return 0;
}

int ps_metrics_port(const struct ps_metrics *m)
{
    return m->port;
}

void ps_metrics_publish(struct ps_metrics *m, struct ps_buf *b)
{
    if (b->oom) { /* keep serving the last whole text */
        b->len = 0;
        b->oom = 0;
        return;
    }
    pthread_mutex_lock(&m->mu);
    struct ps_buf old = m->text;
    m->text = *b;
    m->published_ms = (uint64_t)ps_mono_ms();
    pthread_mutex_unlock(&m->mu);
    *b = old;
    b->len = 0;
    if (b->p != NULL)
        b->p[0] = '\0';
}

void ps_metrics_set_ready(struct ps_metrics *m, int ready, const char *why)
{
    pthread_mutex_lock(&m->mu);
    m->ready = ready != 0;
    snprintf(m->ready_why, sizeof m->ready_why, "%s", why);
    pthread_mutex_unlock(&m->mu);
}

void ps_metrics_stop(struct ps_metrics *m)
{
    if (m == NULL)
        return;
    MHD_stop_daemon(m->d);
    pthread_mutex_destroy(&m->mu);
    ps_buf_free(&m->text);
    free(m);
}
