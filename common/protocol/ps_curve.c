/* CURVE key files and allow lists. */
#include "ps_curve.h"

#include "ps_err.h"
#include "ps_limits.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

static int write_file(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    if (fd < 0)
        return PS_EIO;
    size_t len = strlen(text);
    int ok = write(fd, text, len) == (ssize_t)len;
    ok = (fsync(fd) == 0) && ok;
    ok = (close(fd) == 0) && ok;
    return ok ? 0 : PS_EIO;
}

int ps_curve_keygen(const char *path, char *err, size_t errlen)
{
    char pub[41], sec[41], text[128], pubpath[4096];
    if (zmq_curve_keypair(pub, sec) != 0) {
        snprintf(err, errlen, "keygen: %s (libzmq without CURVE?)", zmq_strerror(errno));
        return PS_EZMQ;
    }
    snprintf(text, sizeof text, "public: %s\nsecret: %s\n", pub, sec);
    if (write_file(path, text, 0600) != 0) {
        snprintf(err, errlen, "keygen: cannot write '%s': %s", path, strerror(errno));
        return PS_EIO;
    }
    snprintf(pubpath, sizeof pubpath, "%s.pub", path);
    snprintf(text, sizeof text, "public: %s\n", pub);
    if (write_file(pubpath, text, 0644) != 0) {
        snprintf(err, errlen, "keygen: cannot write '%s': %s", pubpath, strerror(errno));
        return PS_EIO;
    }
    return 0;
}

/* Copies the 40-character Z85 value after "label:" on one of the lines. */
static int field(const char *text, const char *label, char *out)
{
    const char *p = strstr(text, label);
    if (p == NULL)
        return 0;
    p += strlen(label);
    while (*p == ' ' || *p == '\t')
        p++;
    size_t n = strcspn(p, " \t\r\n");
    if (n != PS_CURVE_KEY_LEN)
        return -1;
    memcpy(out, p, n);
    out[n] = '\0';
    unsigned char bin[32];
    return zmq_z85_decode(bin, out) != NULL ? 1 : -1;
}

/* A key file's text (PS_CURVE_FILE_MAX bytes at most) into text. */
static int read_text(const char *path, char *text, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "cannot open key file '%s': %s", path, strerror(errno));
        return PS_EIO;
    }
    size_t n = fread(text, 1, PS_CURVE_FILE_MAX + 1, f);
    fclose(f);
    if (n > PS_CURVE_FILE_MAX) {
        snprintf(err, errlen, "key file '%s' is over %d bytes", path, PS_CURVE_FILE_MAX);
        return PS_ELIMIT;
    }
    text[n] = '\0';
    return 0;
}

/* The "workers:" line of an allow file ("0-3,7": ids or ranges, each in
 * [0, PS_WORKERS_MAX)) into ids; none: n 0 (any id). 0, or PS_EINVAL. */
static int parse_ids(const char *text, const char *path, struct ps_curve_ids *ids, char *err,
                     size_t errlen)
{
    ids->n = 0;
    const char *p = strstr(text, "workers:");
    if (p == NULL)
        return 0;
    p += strlen("workers:");
    while (*p == ' ' || *p == '\t')
        p++;
    while (*p != '\0' && *p != '\n' && *p != '\r') {
        char *end = NULL;
        unsigned long lo = strtoul(p, &end, 10), hi = lo;
        if (end == p)
            break;
        if (*end == '-') {
            const char *q = end + 1;
            hi = strtoul(q, &end, 10);
            if (end == q)
                break;
        }
        if (lo > hi || hi >= PS_WORKERS_MAX || ids->n >= PS_CURVE_ID_RANGES_MAX)
            break;
        ids->lo[ids->n] = (uint32_t)lo;
        ids->hi[ids->n++] = (uint32_t)hi;
        p = end;
        if (*p == ',')
            p++;
        else
            while (*p == ' ' || *p == '\t')
                p++;
    }
    if (*p != '\0' && *p != '\n' && *p != '\r') {
        snprintf(err, errlen,
                 "key file '%s': 'workers:' takes up to %d ids or ranges in [0, %u) (\"0-3,7\")",
                 path, PS_CURVE_ID_RANGES_MAX, PS_WORKERS_MAX);
        return PS_EINVAL;
    }
    return 0;
}

/* The "admin:" line of an allow file: "yes" or "no" (none: no). 0, or
 * PS_EINVAL naming the file. */
static int parse_admin(const char *text, const char *path, unsigned char *admin, char *err,
                       size_t errlen)
{
    *admin = 0;
    const char *p = strstr(text, "admin:");
    if (p == NULL)
        return 0;
    p += strlen("admin:");
    while (*p == ' ' || *p == '\t')
        p++;
    size_t n = strcspn(p, " \t\r\n");
    if (n == 3 && strncmp(p, "yes", 3) == 0)
        *admin = 1;
    else if (!(n == 2 && strncmp(p, "no", 2) == 0)) {
        snprintf(err, errlen, "key file '%s': 'admin:' takes yes or no", path);
        return PS_EINVAL;
    }
    return 0;
}

int ps_curve_read(const char *path, int need_secret, struct ps_curve_keys *out, char *err,
                  size_t errlen)
{
    memset(out, 0, sizeof *out);
    char text[PS_CURVE_FILE_MAX + 1];
    int rc = read_text(path, text, err, errlen);
    if (rc != 0)
        return rc;
    int p = field(text, "public:", out->pub), s = field(text, "secret:", out->sec);
    if (p != 1 || s < 0 || (need_secret && s != 1)) {
        snprintf(err, errlen, "key file '%s' needs a 'public:'%s line with a 40-character Z85 key",
                 path, need_secret ? " and a 'secret:'" : "");
        return PS_EINVAL;
    }
    return 0;
}

int ps_curve_allow_load(const char *dir, struct ps_curve_allow *out, char *err, size_t errlen)
{
    out->n = 0;
    DIR *d = opendir(dir);
    if (d == NULL) {
        snprintf(err, errlen, "cannot open allow directory '%s': %s", dir, strerror(errno));
        return PS_EIO;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (e->d_name[0] == '.' || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (out->n >= PS_CURVE_ALLOW_MAX) {
            snprintf(err, errlen, "allow directory '%s' has more than %d keys", dir,
                     PS_CURVE_ALLOW_MAX);
            rc = PS_ELIMIT;
            break;
        }
        struct ps_curve_keys k;
        char text[PS_CURVE_FILE_MAX + 1];
        rc = ps_curve_read(path, 0, &k, err, errlen);
        if (rc == 0 && (rc = read_text(path, text, err, errlen)) == 0 &&
            (rc = parse_ids(text, path, &out->ids[out->n], err, errlen)) == 0 &&
            (rc = parse_admin(text, path, &out->admin[out->n], err, errlen)) == 0)
            zmq_z85_decode(out->keys[out->n++], k.pub);
    }
    closedir(d);
    return rc;
}

int ps_curve_allowed(const struct ps_curve_allow *a, const unsigned char *key32)
{
    for (size_t i = 0; i < a->n; i++)
        if (memcmp(a->keys[i], key32, 32) == 0)
            return 1;
    return 0;
}

int ps_curve_may_use(const struct ps_curve_allow *a, const unsigned char *key32, uint32_t id)
{
    for (size_t i = 0; i < a->n; i++) {
        if (memcmp(a->keys[i], key32, 32) != 0)
            continue;
        const struct ps_curve_ids *ids = &a->ids[i];
        for (uint32_t r = 0; r < ids->n; r++)
            if (id >= ids->lo[r] && id <= ids->hi[r])
                return 1;
        return ids->n == 0;
    }
    return 0;
}

int ps_curve_is_admin(const struct ps_curve_allow *a, const unsigned char *key32)
{
    for (size_t i = 0; i < a->n; i++)
        if (memcmp(a->keys[i], key32, 32) == 0)
            return a->admin[i];
    return 0;
}

int ps_curve_client(const char *secret_path, const char *server_key_path,
                    struct ps_curve_keys *mine, struct ps_curve_keys *server, char *err,
                    size_t errlen)
{
    memset(mine, 0, sizeof *mine);
    memset(server, 0, sizeof *server);
    if (secret_path == NULL && server_key_path == NULL)
        return 0;
    if (secret_path == NULL || server_key_path == NULL) {
        snprintf(err, errlen, "--curve-secret and --curve-server-key go together");
        return PS_EINVAL;
    }
    int rc = ps_curve_read(secret_path, 1, mine, err, errlen);
    if (rc == 0)
        rc = ps_curve_read(server_key_path, 0, server, err, errlen);
    return rc;
}
