/* psd's CURVE security: encryption with the server's key pair, and a ZAP
 * handler that admits only the public keys in the allow list.
 *
 * The ZAP handler (a REP socket on inproc://zeromq.zap.01) runs on the
 * server's own loop, and the ROUTER's monitor (net.c) hands it the failed
 * handshakes (which is how a plaintext client that never reaches ZAP is
 * seen), so every refusal is logged by the process that refused it. Off
 * unless --curve-secret is given. */
#ifndef PSD_SECURITY_H
#define PSD_SECURITY_H

#include "ps_curve.h"
#include "ps_log.h"
#include "ps_zsock.h"

#include <stdint.h>
#include <uv.h>
#include <zmq.h>

struct psd_security {
    struct ps_log *log;
    struct ps_curve_keys keys;
    struct ps_curve_allow *allow; /* owned */
    void *zap;
    struct ps_zsock zap_zs;
    uint64_t admitted, refused;
    int replicas; /* admit this shard's own key: its replicas share the key pair (repl.h) */
};

/* Loads the key file and the allow directory. 0 or PS_E* with err. */
int psd_security_load(struct psd_security *sec, struct ps_log *log, const char *secret_file,
                      const char *allow_dir, char *err, size_t errlen);
/* Before the ROUTER binds: the ZAP handler in ctx, on the loop. */
int psd_security_start(struct psd_security *sec, void *ctx, uv_loop_t *loop, char *err,
                       size_t errlen);
/* Makes router a CURVE server. */
int psd_security_apply(struct psd_security *sec, void *router, char *err, size_t errlen);
/* The monitor's events for it (net.c), and one of them: a handshake that
 * failed on endpoint ep. */
#define PSD_SECURITY_EVENTS                                                                        \
    (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |                  \
     ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
void psd_security_handshake_failed(struct psd_security *sec, int event, const char *ep);
/* 1 when the client whose ZAP user id is `user` (its public key, Z85, as
 * the handler admitted it) may use worker id w (its allow file's
 * "workers:" line, or any id without one). */
int psd_security_may_use(const struct psd_security *sec, const char *user, uint32_t w);
/* Whether the admitted key user (Z85) has "admin: yes" in its allow file. */
int psd_security_is_admin(const struct psd_security *sec, const char *user);
/* Closes the loop handles (before the loop ends) ... */
void psd_security_stop(struct psd_security *sec);
/* ... and the sockets (after it ended, before the context terminates). */
void psd_security_fini(struct psd_security *sec);

#endif
