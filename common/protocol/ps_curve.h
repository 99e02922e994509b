/* CURVE keys for ZeroMQ encryption and access control.
 *
 * A key file holds two lines, "public: Z85" and "secret: Z85" (40
 * characters each; the secret may be absent in a .pub file). Secret files
 * are written with mode 0600. An allow directory holds one public key file
 * per admitted client, with an optional line "workers: 0-3,7" naming the
 * worker ids that key may say hello as (none: any), and an optional line
 * "admin: yes" letting it ask for what changes who serves (psctl
 * recover). Files are small and
 * read with a size ceiling; a bad one is refused with a sentence naming
 * it. No zmq socket is touched here. */
#ifndef PS_CURVE_H
#define PS_CURVE_H

#include <stddef.h>
#include <stdint.h>

#define PS_CURVE_KEY_LEN   40 /* Z85 characters */
#define PS_CURVE_ALLOW_MAX 4096
#define PS_CURVE_FILE_MAX  4096

struct ps_curve_keys {
    char pub[PS_CURVE_KEY_LEN + 1];
    char sec[PS_CURVE_KEY_LEN + 1]; /* "" when the file had none */
};

#define PS_CURVE_ID_RANGES_MAX 16

/* Worker ids a key may use: n ranges [lo, hi]; n 0: any id. */
struct ps_curve_ids {
    uint32_t n;
    uint32_t lo[PS_CURVE_ID_RANGES_MAX], hi[PS_CURVE_ID_RANGES_MAX];
};

struct ps_curve_allow {
    size_t n;
    unsigned char keys[PS_CURVE_ALLOW_MAX][32]; /* binary public keys */
    struct ps_curve_ids ids[PS_CURVE_ALLOW_MAX];
    unsigned char admin[PS_CURVE_ALLOW_MAX]; /* "admin: yes" */
};

/* Generates a key pair and writes PATH (both, 0600) and PATH.pub. */
int ps_curve_keygen(const char *path, char *err, size_t errlen);
/* Reads a key file; need_secret makes a missing secret an error. */
int ps_curve_read(const char *path, int need_secret, struct ps_curve_keys *out, char *err,
                  size_t errlen);
/* A client's keys from --curve-secret and --curve-server-key (they go
 * together; both NULL: no CURVE, and both outputs are set to ""). */
int ps_curve_client(const char *secret_path, const char *server_key_path,
                    struct ps_curve_keys *mine, struct ps_curve_keys *server, char *err,
                    size_t errlen);
/* Loads every regular file of dir as a public key file. */
int ps_curve_allow_load(const char *dir, struct ps_curve_allow *out, char *err, size_t errlen);
/* 1 when the 32-byte binary key is in the list. */
int ps_curve_allowed(const struct ps_curve_allow *a, const unsigned char *key32);
/* 1 when the key is in the list and may use worker id `id`. */
int ps_curve_may_use(const struct ps_curve_allow *a, const unsigned char *key32, uint32_t id);
/* 1 when the key is in the list with "admin: yes". */
int ps_curve_is_admin(const struct ps_curve_allow *a, const unsigned char *key32);

#endif
