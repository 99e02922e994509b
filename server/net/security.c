/* ZAP handler for CURVE, and what the ROUTER's monitor says of handshakes. */
#include "security.h"

#include "ps_err.h"
#include "ps_zmsg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define ZAP_PARTS 8

int psd_security_load(struct psd_security *sec, struct ps_log *log, const char *secret_file,
                      const char *allow_dir, char *err, size_t errlen)
{
    memset(sec, 0, sizeof *sec);
    sec->log = log;
    if (!zmq_has("curve")) {
        snprintf(err, errlen, "--curve-secret: this libzmq has no CURVE support");
        return PS_ENOTSUP;
    }
    int rc = ps_curve_read(secret_file, 1, &sec->keys, err, errlen);
    if (rc != 0)
        return rc;
    if (allow_dir == NULL) {
        snprintf(err, errlen, "--curve-secret needs --curve-allow DIR (the admitted keys)");
        return PS_EINVAL;
    }
    sec->allow = malloc(sizeof *sec->allow);
    if (sec->allow == NULL)
        return PS_ENOMEM;
    return ps_curve_allow_load(allow_dir, sec->allow, err, errlen);
}

static void send_str(void *sock, const void *data, size_t len, int more)
{
    zmq_send(sock, data, len, more ? ZMQ_SNDMORE : 0);
}

/* One ZAP request: [version][request id][domain][address][identity]
 * [mechanism][credentials...]; the reply says 200 or 400. */
static int on_zap(struct ps_zsock *zs, void *arg)
{
    struct psd_security *sec = arg;
    zmq_msg_t parts[ZAP_PARTS];
    size_t kept = 0, total = 0;
    if (ps_zmsg_recv(zs->sock, ZMQ_DONTWAIT, parts, ZAP_PARTS, &kept, &total, NULL) != 0)
        return -1;
    const char *status = "400", *text = "malformed ZAP request";
    char user[PS_CURVE_KEY_LEN + 1] = "", addr[64] = "?";
    if (kept >= 7) {
        size_t alen =
            zmq_msg_size(&parts[3]) < sizeof addr - 1 ? zmq_msg_size(&parts[3]) : sizeof addr - 1;
        memcpy(addr, zmq_msg_data(&parts[3]), alen);
        addr[alen] = '\0';
        int curve =
            zmq_msg_size(&parts[5]) == 5 && memcmp(zmq_msg_data(&parts[5]), "CURVE", 5) == 0;
        if (curve && zmq_msg_size(&parts[6]) == 32) {
            zmq_z85_encode(user, zmq_msg_data(&parts[6]), 32);
            if (ps_curve_allowed(sec->allow, zmq_msg_data(&parts[6])) ||
                (sec->replicas && strcmp(user, sec->keys.pub) == 0)) { /* another replica */
                status = "200";
                text = "OK";
            } else {
                text = "key not allowed";
            }
        } else {
            text = "not a CURVE client";
        }
    }
    /* a peer can open connections at will: the lines are sampled, the
     * counts are not */
    if (status[0] == '2') {
        if (ps_log_sampled(++sec->admitted))
            PS_LOG(sec->log, PS_LOG_INFO, S0500, "admitted CURVE client %s from %s (%llu so far)",
                   user, addr, (unsigned long long)sec->admitted);
    } else if (ps_log_sampled(++sec->refused)) {
        PS_LOG(sec->log, PS_LOG_WARN, S0501, "refused client %s from %s: %s (%llu refused so far)",
               user[0] ? user : "(no key)", addr, text, (unsigned long long)sec->refused);
    }
    const char *version = "1.0";
    send_str(zs->sock, version, 3, 1);
    if (kept >= 2)
        send_str(zs->sock, zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), 1);
    else
        send_str(zs->sock, "", 0, 1);
    send_str(zs->sock, status, 3, 1);
    send_str(zs->sock, text, strlen(text), 1);
    send_str(zs->sock, user, strlen(user), 1);
    send_str(zs->sock, "", 0, 0);
    for (size_t i = 0; i < kept; i++)
        zmq_msg_close(&parts[i]);
    return 0;
}

/* A handshake that failed: a plaintext client meeting a CURVE server, a
 * bad key, or garbage. */
void psd_security_handshake_failed(struct psd_security *sec, int event, const char *ep)
{
    /* AUTH ones were counted and logged by ZAP */
    if (event != ZMQ_EVENT_HANDSHAKE_FAILED_AUTH && ps_log_sampled(++sec->refused))
        PS_LOG(sec->log, PS_LOG_WARN, S0502,
               "refused a connection on %s: handshake failed (%s; a plaintext or "
               "non-CURVE client?) (%llu refused so far)",
               ep, event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ? "protocol" : "no detail",
               (unsigned long long)sec->refused);
}

int psd_security_start(struct psd_security *sec, void *ctx, uv_loop_t *loop, char *err,
                       size_t errlen)
{
    sec->zap = zmq_socket(ctx, ZMQ_REP);
    int linger = 0;
    if (sec->zap == NULL || zmq_setsockopt(sec->zap, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_bind(sec->zap, "inproc://zeromq.zap.01") != 0) {
        snprintf(err, errlen, "cannot start the ZAP handler: %s", zmq_strerror(errno));
        return PS_EZMQ;
    }
    return ps_zsock_start(loop, &sec->zap_zs, sec->zap, on_zap, sec);
}

int psd_security_apply(struct psd_security *sec, void *router, char *err, size_t errlen)
{
    int one = 1;
    if (zmq_setsockopt(router, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(router, ZMQ_CURVE_SECRETKEY, sec->keys.sec, PS_CURVE_KEY_LEN + 1) != 0 ||
        zmq_setsockopt(router, ZMQ_ZAP_DOMAIN, "psd", 3) != 0) {
        snprintf(err, errlen, "cannot make the socket a CURVE server: %s", zmq_strerror(errno));
        return PS_EZMQ;
    }
    return 0;
}

int psd_security_may_use(const struct psd_security *sec, const char *user, uint32_t w)
{
    unsigned char key[32];
    if (user == NULL || strlen(user) != PS_CURVE_KEY_LEN || zmq_z85_decode(key, user) == NULL)
        return 0;
    return ps_curve_may_use(sec->allow, key, w);
}

int psd_security_is_admin(const struct psd_security *sec, const char *user)
{
    unsigned char key[32];
    if (user == NULL || strlen(user) != PS_CURVE_KEY_LEN || zmq_z85_decode(key, user) == NULL)
        return 0;
    return ps_curve_is_admin(sec->allow, key);
}

void psd_security_stop(struct psd_security *sec)
{
    if (sec->zap != NULL)
        ps_zsock_close(&sec->zap_zs);
}

void psd_security_fini(struct psd_security *sec)
{
    if (sec->zap != NULL)
        zmq_close(sec->zap);
    free(sec->allow);
    sec->zap = NULL;
    sec->allow = NULL;
}
