/* Shared regions (common/protocol/ps_shm.h, server/core/regions.h): what a shard takes from
 * its fd socket, how a hello binds a region to a connection, push values
 * read from and pull values written into it through an in-process psd,
 * and the refusals: no region on this connection, bytes past its end, a
 * sparse table, bits an op does not allow. */
#define _GNU_SOURCE
#include "catalog.h"
#include "counters.h"
#include "psd.h"
#include "regions.h"
#include "waits.h"

#include "ps_err.h"
#include "ps_limits.h"
#include "ps_shm.h"

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "inproc.h"

#define REGION (64u * 1024u)
#define N      1000u /* table elements */

/* Sends 16 bytes (magic + token unless bad_magic) with the given fds over
 * one end of a socket pair; returns what ps_shm_take makes of it. */
static int hand(const int *fds, int nfds, int bad_magic, uint64_t *token, void **base, size_t *size)
{
    int sp[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sp), 0);
    unsigned char msg[16] = {'P', 'S', 'D', 'S', 'H', 'M', '0', '1'};
    if (bad_magic)
        msg[0] = 'X';
    uint64_t t = 0x1234;
    memcpy(msg + 8, &t, 8);
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(4 * sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {msg, sizeof msg};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > 0) {
        mh.msg_control = ctl.buf;
        mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
    }
    char err[200];
    assert_int_equal(ps_shm_take(sp[1], token, base, size, err, sizeof err), PS_SHM_PENDING);
    assert_int_equal(sendmsg(sp[0], &mh, 0), (ssize_t)sizeof msg);
    int rc = ps_shm_take(sp[1], token, base, size, err, sizeof err);
    if (rc != 0)
        print_message("refused: %s\n", err);
    close(sp[0]);
    close(sp[1]);
    return rc;
}

static void test_take_checks_the_region(void **state)
{
    (void)state;
    struct ps_shm r;
    char err[200];
    assert_int_equal(ps_shm_create(REGION, &r, err, sizeof err), 0);
    assert_int_equal(r.size, REGION);
    uint64_t token = 0;
    void *base = NULL;
    size_t size = 0;
    assert_int_equal(hand(&r.fd, 1, 0, &token, &base, &size), 0);
    assert_int_equal(token, 0x1234);
    assert_int_equal(size, REGION);
    /* the same memory on both mappings */
    r.base[100] = 7;
    assert_int_equal(((unsigned char *)base)[100], 7);
    munmap(base, size);
    /* refused: bad magic, no descriptor, two of them */
    assert_int_equal(hand(&r.fd, 1, 1, &token, &base, &size), PS_EPROTO);
    assert_int_equal(hand(NULL, 0, 0, &token, &base, &size), PS_EPROTO);
    int two[2] = {r.fd, r.fd};
    assert_int_equal(hand(two, 2, 0, &token, &base, &size), PS_EPROTO);
    /* a file that could shrink under the shard (no seal) */
    int loose = memfd_create("loose", MFD_CLOEXEC);
    assert_true(loose >= 0);
    assert_int_equal(ftruncate(loose, REGION), 0);
    assert_int_equal(hand(&loose, 1, 0, &token, &base, &size), PS_EPROTO);
    /* sealed, and one byte short of the smallest region; then exactly it */
    int tiny = memfd_create("tiny", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(tiny >= 0);
    assert_int_equal(ftruncate(tiny, PS_SHM_BYTES_MIN - 1), 0);
    assert_int_equal(fcntl(tiny, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    assert_int_equal(hand(&tiny, 1, 0, &token, &base, &size), PS_ELIMIT);
    int least = memfd_create("least", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(least >= 0);
    assert_int_equal(ftruncate(least, PS_SHM_BYTES_MIN), 0);
    assert_int_equal(fcntl(least, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    assert_int_equal(hand(&least, 1, 0, &token, &base, &size), 0);
    assert_int_equal(size, PS_SHM_BYTES_MIN);
    munmap(base, size);
    close(least);
    /* not a regular file */
    int sp[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
    assert_int_equal(hand(&sp[0], 1, 0, &token, &base, &size), PS_EPROTO);
    close(sp[0]);
    close(sp[1]);
    close(loose);
    close(tiny);
    ps_shm_close(&r);
    assert_int_equal(ps_shm_create(PS_SHM_BYTES_MIN - 1, &r, err, sizeof err), PS_ELIMIT);
    assert_int_equal(ps_shm_create(PS_SHM_BYTES_MIN, &r, err, sizeof err), 0);
    ps_shm_close(&r);
}

static void test_set_binds_and_evicts(void **state)
{
    (void)state;
    struct psd_regions *set = psd_regions_create();
    assert_non_null(set);
    void *a = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    psd_regions_offer(set, 11, a, REGION, 1000);
    unsigned char *p = NULL;
    size_t size = 0;
    assert_int_equal(psd_regions_at(set, "r1", 2, 0, 4, 1000, &p, &size), PS_ESHM); /* not bound */
    assert_int_equal(psd_regions_bind(set, 12, "r1", 2, 0, 1000), 0); /* wrong token */
    assert_int_equal(psd_regions_bind(set, 11, "r1", 2, 0, 1000), 1);
    assert_int_equal(psd_regions_bind(set, 11, "r2", 2, 0, 1000), 0); /* bound once only */
    assert_int_equal(psd_regions_at(set, "r1", 2, REGION - 8, 8, 1001, &p, &size), 0);
    assert_ptr_equal(p, (unsigned char *)a + REGION - 8);
    assert_int_equal(psd_regions_at(set, "r1", 2, REGION - 8, 12, 1001, &p, &size), PS_ERANGE);
    assert_int_equal(psd_regions_at(set, "r1", 2, UINT64_MAX - 2, 8, 1001, &p, &size), PS_ERANGE);
    assert_int_equal(psd_regions_at(set, "r2", 2, 0, 4, 1001, &p, &size), PS_ESHM);
    assert_int_equal(psd_regions_bound(set), 1);
    /* a hand-over nobody binds waits PS_SHM_PENDING_MS, no longer */
    void *b = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    void *b2 = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_int_equal(psd_regions_offer(set, 13, b, REGION, 2000), 0);
    assert_int_equal(psd_regions_offer(set, 14, b2, REGION, 2000), 0);
    psd_regions_expire(set, 2000 + PS_SHM_PENDING_MS);
    assert_int_equal(psd_regions_bind(set, 14, "r4", 2, 0, 2000 + PS_SHM_PENDING_MS), 1);
    psd_regions_expire(set, 2000 + PS_SHM_PENDING_MS + 1);
    assert_int_equal(psd_regions_bind(set, 13, "r3", 2, 0, 3000), 0);
    /* a worker's regions go, but for the connection named */
    psd_regions_drop_worker(set, 0, "r1", 2);
    assert_int_equal(psd_regions_bound(set), 1);
    psd_regions_drop_worker(set, 0, NULL, 0);
    assert_int_equal(psd_regions_bound(set), 0);
    /* hand-overs not bound yet push out the oldest of them, never a bound
     * region; with every region bound a new one is refused */
    void *m[PS_SHM_REGIONS_MAX + 2];
    for (uint32_t i = 0; i < PS_SHM_REGIONS_MAX + 2; i++)
        m[i] =
            mmap(NULL, PS_SHM_BYTES_MIN, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    for (uint32_t i = 0; i < PS_SHM_REGIONS_MAX - 1; i++) {
        assert_int_equal(psd_regions_offer(set, 100 + i, m[i], PS_SHM_BYTES_MIN, 5000 + i), 0);
        char route[8];
        snprintf(route, sizeof route, "w%u", i);
        assert_int_equal(psd_regions_bind(set, 100 + i, route, strlen(route), i, 5000 + i), 1);
    }
    uint32_t last = PS_SHM_REGIONS_MAX - 1;
    assert_int_equal(psd_regions_offer(set, 900, m[last], PS_SHM_BYTES_MIN, 6000), 0);
    assert_int_equal(psd_regions_offer(set, 901, m[last + 1], PS_SHM_BYTES_MIN, 6001), 0);
    assert_int_equal(psd_regions_bind(set, 900, "x", 1, 0, 6002), 0); /* pushed out */
    assert_int_equal(psd_regions_bound(set), PS_SHM_REGIONS_MAX - 1);
    assert_int_equal(psd_regions_at(set, "w0", 2, 0, 4, 6003, &p, &size), 0); /* still there */
    assert_int_equal(psd_regions_bind(set, 901, "x", 1, 0, 6004), 1);
    assert_int_equal(psd_regions_bound(set), PS_SHM_REGIONS_MAX);
    assert_int_equal(psd_regions_offer(set, 902, m[last + 2], PS_SHM_BYTES_MIN, 6005), PS_ELIMIT);
    munmap(m[last + 2], PS_SHM_BYTES_MIN); /* refused: still the caller's */
    psd_regions_destroy(set);
}

/* A request on connection `route` through the in-process psd. */
static int request(struct psd *s, const char *route, const Ps__Header *h, const void *vals,
                   size_t bytes, struct psd_reply *rep)
{
    uint8_t buf[512];
    struct ps_frame f[2] = {{buf, ps__header__pack(h, buf)}, {vals, bytes}};
    struct ps_frame r = {route, strlen(route)};
    return psd_dispatch(s, &r, f, vals != NULL ? 2 : 1, rep);
}

/* The status of a reply. */
static int status_of(const struct psd_reply *rep)
{
    Ps__Header *h = ps__header__unpack(NULL, rep->hdr_len, rep->hdr);
    assert_non_null(h);
    int st = h->status;
    ps__header__free_unpacked(h, NULL);
    return st;
}

static void data_header(Ps__Header *h, Ps__Op op, uint64_t id, uint32_t shm, uint64_t in,
                        uint64_t out)
{
    ps_wire_header_init(h, op);
    h->request_id = id;
    h->offset = 100;
    h->count = 200;
    h->shm = shm;
    h->shm_in = in;
    h->shm_out = out;
}

/* An in-process psd with table "t" of N ones and a region r handed to it
 * (not yet bound); the region's token. */
static uint64_t start_with_region(struct psd *s, struct ps_log *log, struct ps_shm *r)
{
    inproc_start(s, log);
    inproc_create_ones(s, N);
    char err[200];
    assert_int_equal(ps_shm_create(REGION, r, err, sizeof err), 0);
    uint64_t token = 0;
    void *base = NULL;
    size_t size = 0;
    assert_int_equal(hand(&r->fd, 1, 0, &token, &base, &size), 0);
    psd_shm_take(s, token, base, size);
    return token;
}

/* A hello on connection `route` binds the region of `token` to it. */
static void bind_region(struct psd *s, const char *route, uint64_t token)
{
    Ps__Header h;
    struct psd_reply rep;
    ps_wire_header_init(&h, PS__OP__OP_HELLO);
    h.shm_token = token;
    assert_int_equal(request(s, route, &h, NULL, 0, &rep), 1);
    Ps__Header *got = ps__header__unpack(NULL, rep.hdr_len, rep.hdr);
    assert_int_equal(got->shm_token, token);
    ps__header__free_unpacked(got, NULL);
    psd_reply_drop(&rep);
}

static void test_requests_through_the_region(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    struct ps_shm r;
    uint64_t token = start_with_region(&s, &log, &r);
    Ps__Header h;
    struct psd_reply rep;
    float *g = (float *)r.base, *w = (float *)(r.base + 4096);

    /* no region bound to this connection yet */
    data_header(&h, PS__OP__OP_PUSH, 1, PS_SHM_IN, 0, 0);
    assert_int_equal(request(&s, "a", &h, NULL, 0, &rep), 1);
    assert_int_equal(status_of(&rep), PS_ESHM);
    psd_reply_drop(&rep);

    /* a hello with the token binds it, and says so */
    bind_region(&s, "a", token);

    /* push-pull: gradient read from the region, weights written into it */
    for (int i = 0; i < 200; i++)
        g[i] = (float)i;
    data_header(&h, PS__OP__OP_PUSH_PULL, 2, PS_SHM_IN | PS_SHM_OUT, 0, 4096);
    assert_int_equal(request(&s, "a", &h, NULL, 0, &rep), 1);
    Ps__Header *got = ps__header__unpack(NULL, rep.hdr_len, rep.hdr);
    assert_int_equal(got->status, 0);
    assert_int_equal(got->shm, PS_SHM_OUT);
    assert_int_equal(got->shm_out, 4096);
    ps__header__free_unpacked(got, NULL);
    assert_null(rep.vals); /* no values frame */
    psd_reply_drop(&rep);
    for (int i = 0; i < 200; i++)
        assert_true(w[i] == 1.0f - (float)i); /* sgd, lr 1 */
    /* a pull in frames agrees with the region */
    data_header(&h, PS__OP__OP_PULL, 3, 0, 0, 0);
    assert_int_equal(request(&s, "a", &h, NULL, 0, &rep), 1);
    assert_int_equal(rep.vals_bytes, 800);
    assert_memory_equal(rep.vals, w, 800);
    psd_reply_drop(&rep);

    /* refusals, and the table is left as it was */
    data_header(&h, PS__OP__OP_PUSH, 4, PS_SHM_IN, REGION - 400, 0);
    assert_int_equal(request(&s, "a", &h, NULL, 0, &rep), 1);
    assert_int_equal(status_of(&rep), PS_ERANGE);
    psd_reply_drop(&rep);
    data_header(&h, PS__OP__OP_PULL, 5, PS_SHM_OUT, REGION, 0);
    h.shm_out = REGION;
    assert_int_equal(request(&s, "a", &h, NULL, 0, &rep), 1);
    assert_int_equal(status_of(&rep), PS_ERANGE);
    psd_reply_drop(&rep);
    data_header(&h, PS__OP__OP_PULL, 6, PS_SHM_IN, 0, 0); /* a pull has no values to read */
    assert_int_equal(request(&s, "a", &h, NULL, 0, &rep), 1);
    assert_int_equal(status_of(&rep), PS_EPROTO);
    psd_reply_drop(&rep);
    data_header(&h, PS__OP__OP_PUSH, 7, PS_SHM_IN, 2, 0); /* not a whole float */
    assert_int_equal(request(&s, "a", &h, NULL, 0, &rep), 1);
    assert_int_equal(status_of(&rep), PS_EPROTO);
    psd_reply_drop(&rep);
    data_header(&h, PS__OP__OP_PUSH, 8, PS_SHM_IN, 0, 0); /* another connection */
    assert_int_equal(request(&s, "b", &h, NULL, 0, &rep), 1);
    assert_int_equal(status_of(&rep), PS_ESHM);
    psd_reply_drop(&rep);
    data_header(&h, PS__OP__OP_PULL, 9, PS_SHM_OUT, 0, 8192);
    h.shm_out = 8192;
    assert_int_equal(request(&s, "a", &h, NULL, 0, &rep), 1);
    assert_memory_equal(w, r.base + 8192, 800); /* unchanged by the refused ones */
    psd_reply_drop(&rep);

    /* the worker says hello from a new process on another connection: the
     * old one's region goes */
    ps_wire_header_init(&h, PS__OP__OP_HELLO);
    h.session = 77;
    assert_int_equal(request(&s, "c", &h, NULL, 0, &rep), 1);
    psd_reply_drop(&rep);
    data_header(&h, PS__OP__OP_PULL, 10, PS_SHM_OUT, 0, 4096);
    assert_int_equal(request(&s, "a", &h, NULL, 0, &rep), 1);
    assert_int_equal(status_of(&rep), PS_EBUSY); /* worker 0 is c's now: refused first */
    psd_reply_drop(&rep);
    h.worker_id = 1000; /* an id outside the rounds, which no hello binds */
    assert_int_equal(request(&s, "a", &h, NULL, 0, &rep), 1);
    assert_int_equal(status_of(&rep), PS_ESHM); /* and a's region went with it */
    psd_reply_drop(&rep);
    psd_fini(&s);
    ps_shm_close(&r);
}

/* A keyed push whose keys (at byte kat of the region, when shm has
 * PS_SHM_KEYS) and values (at vat, with PS_SHM_IN; else `vals` in a frame)
 * lie in the region; the reply's status. */
/* The header of a keyed push of n keys (keys at kat, values at vat in the
 * region where shm says). */
static void keyed_header(Ps__Header *h, uint64_t id, uint32_t shm, uint64_t n, uint64_t kat,
                         uint64_t vat)
{
    ps_wire_header_init(h, PS__OP__OP_PUSH);
    h->request_id = id;
    h->layout = PS__LAYOUT__LAYOUT_KEYS;
    h->count = n;
    h->shm = shm;
    h->shm_keys = kat;
    h->shm_in = vat;
}

static int keyed_push(struct psd *s, const char *route, uint64_t id, uint32_t shm, uint64_t n,
                      uint64_t kat, uint64_t vat, const float *vals)
{
    Ps__Header h;
    keyed_header(&h, id, shm, n, kat, vat);
    struct psd_reply rep;
    assert_int_equal(request(s, route, &h, vals, vals ? n * sizeof(float) : 0, &rep), 1);
    int st = status_of(&rep);
    psd_reply_drop(&rep);
    return st;
}

/* The table's N weights, pulled in frames. */
static void pull_all(struct psd *s, float *out)
{
    Ps__Header h;
    struct psd_reply rep;
    ps_wire_header_init(&h, PS__OP__OP_PULL);
    h.count = N;
    assert_int_equal(request(s, "a", &h, NULL, 0, &rep), 1);
    assert_int_equal(rep.vals_bytes, N * sizeof(float));
    memcpy(out, rep.vals, N * sizeof(float));
    psd_reply_drop(&rep);
}

/* A keyed push into a dense table with its keys and values in the region
 * (PS_SHM_KEYS, PS_SHM_IN): applied as from frames; keys that are out of
 * order, outside the shard or past the region refused, the table kept. */
static void test_keys_through_the_region(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    struct ps_shm r;
    uint64_t token = start_with_region(&s, &log, &r);
    bind_region(&s, "a", token);
    enum { KAT = 16384, VAT = 20480, M = 5 };
    uint64_t *k = (uint64_t *)(r.base + KAT);
    float *v = (float *)(r.base + VAT), want[N], w[N];
    const uint64_t keys[M] = {0, 3, 10, 11, N - 1};
    for (int i = 0; i < M; i++) {
        k[i] = keys[i];
        v[i] = (float)(i + 1);
    }
    for (uint32_t i = 0; i < N; i++)
        want[i] = 1.0f;

    /* keys and values in the region, no frames: sgd at lr 1 */
    assert_int_equal(keyed_push(&s, "a", 1, PS_SHM_KEYS | PS_SHM_IN, M, KAT, VAT, NULL), 0);
    for (int i = 0; i < M; i++)
        want[keys[i]] -= (float)(i + 1);
    pull_all(&s, w);
    assert_memory_equal(w, want, sizeof w);
    /* keys in the region, values in a frame */
    const float fv[M] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
    assert_int_equal(keyed_push(&s, "a", 2, PS_SHM_KEYS, M, KAT, 0, fv), 0);
    for (int i = 0; i < M; i++)
        want[keys[i]] -= 0.5f;
    pull_all(&s, w);
    assert_memory_equal(w, want, sizeof w);

    /* refused, and the table stays as it is */
    k[3] = 10; /* a repeat: keys must increase */
    assert_int_equal(keyed_push(&s, "a", 3, PS_SHM_KEYS | PS_SHM_IN, M, KAT, VAT, NULL), PS_EPROTO);
    k[3] = 11;
    k[4] = N; /* past the table */
    assert_int_equal(keyed_push(&s, "a", 4, PS_SHM_KEYS | PS_SHM_IN, M, KAT, VAT, NULL), PS_ERANGE);
    k[4] = N - 1;
    /* psd copies and checks the keys in blocks of 2,048: a repeat across
     * the first boundary (keys past the table too, found only later) */
    enum { BIG = 5000, BAT = 24576 };
    static float bigv[BIG];
    uint64_t *bk = (uint64_t *)(r.base + BAT);
    for (uint64_t i = 0; i < BIG; i++)
        bk[i] = i;
    bk[2048] = 2047;
    assert_int_equal(keyed_push(&s, "a", 9, PS_SHM_KEYS, BIG, BAT, 0, bigv), PS_EPROTO);
    bk[2048] = 2048;
    assert_int_equal(keyed_push(&s, "a", 10, PS_SHM_KEYS, BIG, BAT, 0, bigv), PS_ERANGE);
    /* keys that end at the region's end are read; 8 bytes further is past it */
    memcpy(r.base + REGION - sizeof keys, keys, sizeof keys);
    assert_int_equal(keyed_push(&s, "a", 11, PS_SHM_KEYS, M, REGION - sizeof keys, 0, fv), 0);
    for (int i = 0; i < M; i++)
        want[keys[i]] -= 0.5f;
    assert_int_equal(keyed_push(&s, "a", 5, PS_SHM_KEYS, M, REGION - sizeof keys + 8, 0, fv),
                     PS_ERANGE);
    assert_int_equal(keyed_push(&s, "a", 6, PS_SHM_KEYS, M, KAT + 4, 0, fv), PS_EPROTO);
    assert_int_equal(keyed_push(&s, "b", 7, PS_SHM_KEYS, M, KAT, 0, fv), PS_ESHM);
    assert_int_equal(keyed_push(&s, "a", 8, PS_SHM_IN, M, KAT, REGION - 8, NULL), PS_EFRAMES);
    /* bits a request may not carry, refused by the decoder; a keyed push a
     * dense table does not take, by the table */
    Ps__Header h;
    struct psd_reply rep;
    ps_wire_header_init(&h, PS__OP__OP_PUSH); /* keys bit on a range push */
    h.count = M;
    h.shm = PS_SHM_KEYS | PS_SHM_IN;
    assert_int_equal(request(&s, "a", &h, NULL, 0, &rep), 1);
    assert_int_equal(status_of(&rep), PS_EPROTO);
    psd_reply_drop(&rep);
    h.layout = PS__LAYOUT__LAYOUT_KEYS; /* a keyed push of dim 2 into a dense table: the */
    h.dim = 2;                          /* wire takes it (sparse rows may), the table not */
    assert_int_equal(request(&s, "a", &h, NULL, 0, &rep), 1);
    assert_int_equal(status_of(&rep), PS_ENOTSUP);
    psd_reply_drop(&rep);
    pull_all(&s, w);
    assert_memory_equal(w, want, sizeof w);
    psd_fini(&s);
    ps_shm_close(&r);
}

/* Weights when a reply went through the sender (ctx: the psd). */
static float w_at_send[2];
static unsigned sends;

static void note_send(void *ctx, const void *route, size_t route_len, struct psd_reply *rep)
{
    const struct psd *s = ctx;
    (void)route;
    (void)route_len;
    memcpy(w_at_send, psd_table_at(s, 0)->w + 100, sizeof w_at_send);
    sends++;
    psd_reply_drop(rep);
}

/* A push whose values lie in the region is answered after its step, as
 * the dispatch's reply: once answered, the client may write the region
 * again. The same push from a frame is answered first, through the
 * sender (asp applies on arrival). Keys alone in the region are copied
 * out, so such a push is answered first too. */
static void test_region_values_answered_after_the_step(void **state)
{
    (void)state;
    static struct psd s;
    struct ps_log log;
    struct ps_shm r;
    uint64_t token = start_with_region(&s, &log, &r);
    psd_set_sender(&s, note_send, &s);
    bind_region(&s, "a", token);
    float *g = (float *)r.base;
    for (int i = 0; i < 200; i++)
        g[i] = 1.0f;
    Ps__Header h;
    struct psd_reply rep;
    sends = 0;
    data_header(&h, PS__OP__OP_PUSH, 1, PS_SHM_IN, 0, 0);
    assert_int_equal(request(&s, "a", &h, NULL, 0, &rep), 1);
    assert_int_equal(status_of(&rep), 0);
    psd_reply_drop(&rep);
    assert_int_equal(sends, 0);
    assert_true(psd_table_at(&s, 0)->w[100] == 0.0f); /* 1 - 1 */

    data_header(&h, PS__OP__OP_PUSH, 2, 0, 0, 0);
    assert_int_equal(request(&s, "a", &h, g, 200 * sizeof(float), &rep), 0);
    assert_int_equal(sends, 1);
    assert_true(w_at_send[0] == 0.0f);                 /* answered before the step */
    assert_true(psd_table_at(&s, 0)->w[100] == -1.0f); /* done by the return */

    enum { KAT = 16384, VAT = 20480 };
    uint64_t *k = (uint64_t *)(r.base + KAT);
    k[0] = 100;
    k[1] = 101;
    float *v = (float *)(r.base + VAT);
    v[0] = v[1] = 1.0f;
    assert_int_equal(keyed_push(&s, "a", 3, PS_SHM_KEYS | PS_SHM_IN, 2, KAT, VAT, NULL), 0);
    assert_int_equal(sends, 1);
    assert_true(psd_table_at(&s, 0)->w[100] == -2.0f);
    keyed_header(&h, 4, PS_SHM_KEYS, 2, KAT, 0);
    assert_int_equal(request(&s, "a", &h, v, 2 * sizeof(float), &rep), 0);
    assert_int_equal(sends, 2);
    assert_true(w_at_send[0] == -2.0f && w_at_send[1] == -2.0f);
    assert_true(psd_table_at(&s, 0)->w[100] == -3.0f && psd_table_at(&s, 0)->w[101] == -3.0f);
    psd_fini(&s);
    ps_shm_close(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_take_checks_the_region),
        cmocka_unit_test(test_set_binds_and_evicts),
        cmocka_unit_test(test_requests_through_the_region),
        cmocka_unit_test(test_keys_through_the_region),
        cmocka_unit_test(test_region_values_answered_after_the_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
