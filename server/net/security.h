/* psd's CURVE security: encryption with the server's key pair, and a ZAP
 * handler that admits only the public keys in the allow list.
 *
 * Both the ZAP handler (a REP socket on inproc://zeromq.zap.01) and a
 * monitor of the ROUTER (handshake failures, which is how a plaintext
 * client that never reaches ZAP is seen) run on the server's own loop, so
 * every refusal is logged by the process that refused it. Off unless
 * --curve-secret is given. */
#ifndef PSD_SECURITY_H
#define PSD_SECURITY_H

#include "ps_curve.h"
#include "ps_log.h"
#include "ps_zsock.h"

#include <stdint.h>
#include <uv.h>

struct psd_security {
    struct ps_log *log;
    struct ps_curve_keys keys;
    struct ps_curve_allow *allow; /* owned */
    void *zap, *monitor;
    struct ps_zsock zap_zs, mon_zs;
    uint64_t admitted, refused;
    int replicas; /* admit this shard's own key: its replicas share the key pair (repl.h) */
};

/* Loads the key file and the allow directory. 0 or PS_E* with err. */
int psd_security_load(struct psd_security *sec, struct ps_log *log, const char *secret_file,
                      const char *allow_dir, char *err, size_t errlen);
/* Before the ROUTER binds: the ZAP handler in ctx, on the loop. */
int psd_security_start(struct psd_security *sec, void *ctx, uv_loop_t *loop, char *err,
                       size_t errlen);
/* Makes router a CURVE server and monitors its handshakes. */
int psd_security_apply(struct psd_security *sec, void *ctx, void *router, uv_loop_t *loop,
                       char *err, size_t errlen);
/* 1 when the client whose ZAP user id is `user` (its public key, Z85, as
 * the handler admitted it) may use worker id w (its allow file's
 * "workers:" line, or any id without one). */
int psd_security_may_use(const struct psd_security *sec, const char *user, uint32_t w);
/* Closes the loop handles (before the loop ends) ... */
void psd_security_stop(struct psd_security *sec);
/* ... and the sockets (after it ended, before the context terminates). */
void psd_security_fini(struct psd_security *sec);

#endif
