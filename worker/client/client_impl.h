/* libpsclient's insides, shared by its files and used by nothing else:
 * the client, its ticket slots and tables, then one section per file,
 * from the bottom of the library's stack up: slots.c, region.c, send.c,
 * failover.c, recv.c, tickets.c, admin.c; psclient.c and the calls in
 * dense.c, rows.c, vote.c on top. No file calls one above it.
 * A client is a DEALER per shard; a ticket is a slot; replies are matched
 * by (request id, socket); large gradients go without a copy. */
#ifndef PSC_CLIENT_IMPL_H
#define PSC_CLIENT_IMPL_H

#include "psclient.h"
#include "sized_impl.h"

#include "ps_limits.h"
#include "ps_shm.h"
#include "ps_wire.h"

#include <poll.h>
#include <stdatomic.h>
#include <zmq.h>

/* The largest request header: a table spec with a name of
 * PS_TABLE_NAME_MAX bytes, a shape and PS_WORKERS_MAX pushers (each a
 * varint of at most 2 bytes below 16384), and the header's other fields. */
#define PSC__REQUEST_HEADER_MAX 12288u
_Static_assert(PS_WORKERS_MAX <= 16384u &&
                   2u * PS_WORKERS_MAX + PS_TABLE_NAME_MAX + 1024u <= PSC__REQUEST_HEADER_MAX,
               "a spec naming every worker as a pusher fits a request header");

/* Request ids are consecutive (a server remembers a window of them per
 * worker, see psd's exactly-once rule); id_map finds an id's slot. */
#define ID_MAP             (4u * PS_CLIENT_TICKETS_MAX)
#define REPLY_PARTS_MAX    (PS_FRAMES_MAX + 1u)
#define CLIENT_ARENA_BYTES (4u * PS_HEADER_BYTES_MAX)

struct table_h {
    char name[PS_TABLE_NAME_MAX + 1];
    uint64_t size;
    int sparse;
    uint32_t dim;
    uint32_t ids[]; /* table id on each shard */
};

enum sub_kind {
    SUB_SYNC = 0,   /* hello, create, stats: never re-sent */
    SUB_RANGE = 1,  /* pull / push / push-pull of a dense range */
    SUB_KEYS = 2,   /* keyed push into a dense table */
    SUB_ROWS = 3,   /* rows of a sparse table */
    SUB_PIECES = 4, /* a dense range sent as pieces: the tickets in kids */
};

/* psc_mirror: a caller's copy of a dense range, and per segment (a
 * shard's part, or a piece of it when the range goes in pieces: a
 * sub-request's range) the table generation and version its values are
 * known to be at least as new as (version 0: unknown, pull it whole).
 * Linked into the client's list, which psc_destroy frees. */
struct mirror_seg {
    uint64_t a, b;
    uint64_t generation, version;
};
struct psc_mirror {
    struct psc_mirror *prev, *next;
    uint32_t table;
    uint64_t offset, count;
    float *vals;
    uint64_t ticket; /* the pull in flight (0: none) */
    uint64_t changed, whole;
    uint32_t nseg;
    struct mirror_seg seg[];
};

struct slot {
    uint64_t seq; /* 0 when free */
    Ps__Op op;
    uint32_t table;
    uint64_t offset, count;
    float *out;
    void *ctx; /* result of a synchronous op */
    uint32_t pending;
    uint64_t replied[PS_SHARDS_MAX / 64];
    int status;
    int remote; /* with status PS_EREMOTE: the shard's own code */
    int canceled;
    atomic_uint zc_refs; /* zero-copy frames zmq still holds */
    void *conv;          /* 16-bit copy of a push's values (grows, reused) */
    size_t conv_cap;
    /* what it takes to send (and re-send) each shard's sub-request */
    int kind; /* enum sub_kind */
    uint64_t clock;
    const float *src32;       /* SUB_RANGE, SUB_KEYS: the caller's f32 values, or NULL */
    const unsigned char *src; /* values as they go on the wire (SUB_RANGE, SUB_KEYS: the
                               * 16-bit copy, made when a shard first needs it), or NULL */
    const uint64_t *keys;     /* SUB_KEYS: the caller's keys */
    size_t nkeys;
    uint64_t expected[PS_SHARDS_MAX / 64]; /* shards sent a sub-request */
    uint64_t via_shm[PS_SHARDS_MAX / 64];  /* ...whose last one named the shared region */
    uint64_t f32_to[PS_SHARDS_MAX / 64];   /* ...or went in f32 (psc__shard_dtype) */
    int64_t sent_ms;
    uint32_t attempts;
    /* row requests: keys grouped by shard, and where each came from */
    int rows;
    uint32_t *order; /* grouped position -> index in the caller's keys */
    uint64_t *skeys; /* keys grouped by shard */
    float *svals;    /* push values grouped like skeys */
    size_t rows_cap; /* entries order/skeys hold; svals holds rows_cap x dim */
    size_t vals_cap;
    uint32_t *grp; /* shard s holds grouped positions [grp[s], grp[s+1]) */
    /* psc_pull_view: each shard's reply message, kept (NULL until the
     * slot's first view; messages are empty when not held) */
    int view;
    int held; /* waited for: values readable until psc_view_release */
    zmq_msg_t *vmsg;
    /* SUB_PIECES: the pieces' tickets, 0 once waited for or canceled */
    uint64_t *kids;
    int continues; /* a push piece after one to the same shard (Header.continues) */
    uint32_t nkids, kids_cap;
    char error[PS_ERROR_TEXT_MAX + 64];
    struct psc_mirror *mirror; /* a mirror's pull (psc_mirror_pull), or NULL */
    /* SUB_SYNC: the header as sent, for sending again to another
     * replica (failover.c) */
    uint8_t *sync_hdr;
    size_t sync_len;
};

/* A shard's replicas (failover.c). */
struct replicas {
    uint32_t n, cur;
    char *eps[PS_REPLICAS_MAX];
    void *mon;     /* ZeroMQ's monitor of the shard's socket, or NULL */
    int confirmed; /* the replica in use answered as primary (or nothing said otherwise) */
    uint64_t probe_id;
    int64_t probe_ms, since_ms;
    int64_t heard_ms; /* the last reply of any kind */
    int64_t tried_ms; /* when probing the replica in use began */
    uint32_t dead;    /* the replica whose connection last dropped, and when */
    int64_t dead_ms;
    int dropped; /* the connection in use dropped: its replies are read, then it moves */
};

/* psc_cork: a shard's header-only data requests held for one message. */
struct batch_q {
    uint32_t n;
    size_t len;     /* bytes of recs used */
    uint64_t named; /* bytes the held requests move through the region (values, keys) */
    uint64_t ids[PS_BATCH_MAX];
    uint8_t recs[PS_BATCH_BYTES_MAX];
};

/* What a stats call fills. */
struct stats_out {
    struct psc_shard_stats *st;
    struct psc_table_stats *list;
    uint32_t cap;
};

struct psc_client {
    uint32_t nshards;
    uint32_t worker_id;
    Ps__DType dtype; /* on the wire */
    size_t piece_bytes;
    int retry_ms;
    int heartbeat_ms;      /* <= 0: never */
    int64_t *last_send_ms; /* per shard */
    uint64_t start_clock;
    uint64_t stale_pushes;
    int outside; /* a stale push reply since the last hello */
    int nonzero_pulls;
    size_t esize;
    void *ctx;
    int own_ctx; /* made by psc_create, terminated by psc_destroy (else cfg.zmq_context) */
    void **socks;
    char **endpoints; /* in use: as given, or the shard's same-host one */
    /* per shard, from its last hello reply: the same-host endpoint it
     * offers ("" none) and its process instance */
    struct offer {
        char local[PS_ENDPOINT_MAX];
        uint64_t instance;
    } * offers;
    uint64_t session;
    /* the region shared with shards on this host (fd -1: none), what of
     * it psc_shm_alloc handed out, the token it was handed over with, and
     * per shard whether the shard took it */
    struct ps_shm shm;
    size_t shm_used;
    uint64_t shm_token;
    unsigned char *shm_on;
    /* per shard, the hello that binds the region again after the shard
     * lost it (0: none under way), and when it went */
    struct rebind {
        uint64_t id;
        int64_t sent_ms;
    } * rebind;
    uint64_t shm_sent, shm_received;
    struct pollfd *pfds; /* the sockets' ZMQ_FDs, for waiting on several */
    struct slot slots[PS_CLIENT_TICKETS_MAX];
    uint16_t free_stack[PS_CLIENT_TICKETS_MAX];
    uint16_t id_map[ID_MAP]; /* id % ID_MAP -> slot index + 1; 0: none */
    uint32_t nfree;
    uint64_t next_seq;
    struct table_h *tables[PS_CLIENT_TABLES_MAX];
    uint32_t ntables;
    uint64_t bytes_sent, bytes_received;
    uint64_t bad_replies;
    uint64_t resends; /* sub-requests sent again */
    int64_t swept_ms; /* last look for requests due a re-send */
    struct ps_arena arena;
    unsigned char *arena_buf;
    /* psc_cork: held requests per shard (NULL until first corked) */
    int corked;
    uint32_t held;
    struct batch_q *batches;
    uint64_t batches_sent;
    struct replicas *reps; /* per shard, NULL when no shard lists replicas */
    uint64_t failovers;
    struct psc_mirror *mirrors;               /* open ones (psc_mirror_open) */
    uint8_t hdr_buf[PSC__REQUEST_HEADER_MAX]; /* requests carry at most a table spec */
    char last_error[512];
    int last_remote; /* the shard's code behind the last PS_EREMOTE, else 0 */
};

/* Whether shard s has replicas and the one in use is not confirmed as
 * its primary: requests wait to be sent until one is (failover.c). */
static inline int psc__failing_over(const struct psc_client *c, uint32_t s)
{
    return c->reps != NULL && c->reps[s].n > 1 && !c->reps[s].confirmed;
}

_Static_assert(PSC_SHAPE_DIMS_MAX == PS_SHAPE_DIMS_MAX, "psclient.h's shape limit is the wire's");
_Static_assert(PSC_TABLE_NAME_MAX == PS_TABLE_NAME_MAX, "psclient.h's name limit is the wire's");
_Static_assert(PS_CLIENT_TICKETS_MAX < UINT16_MAX && (ID_MAP & (ID_MAP - 1)) == 0,
               "slot index + 1 fits in id_map; ID_MAP is a power of 2");

/* What a rows call fills. */
struct rows_out {
    uint64_t offset, max;
    uint32_t dim;
    uint64_t *keys;
    float *vals; /* NULL: not wanted (tombstones) */
    uint64_t got, total;
    int delta; /* psc_rows_delta: next and tick too */
    uint64_t next, tick;
};

/* How long a hand-over of the shared region to a shard that lost it may
 * take, and how long before another is tried. */
enum { REBIND_WAIT_MS = 1000 };

/* slots.c */
int psc__set_error(struct psc_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void psc__slot_fail(struct slot *sl, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void psc__zc_release(void *data, void *hint);
struct slot *psc__slot_alloc(struct psc_client *c, Ps__Op op, uint64_t *id);
void psc__view_drop(struct psc_client *c, struct slot *sl);
void psc__slot_release(struct psc_client *c, struct slot *sl);
struct slot *psc__slot_lookup(struct psc_client *c, uint64_t id);
int psc__shard_replied(const struct slot *sl, uint32_t shard);
int psc__range_part(const struct psc_client *c, const struct slot *sl, uint32_t s, uint64_t *a,
                    uint64_t *b);
/* The segment of m that is exactly [a, b), or NULL. */
struct mirror_seg *psc__mirror_seg(struct psc_mirror *m, uint64_t a, uint64_t b);

/* region.c */
int psc__in_region(const struct psc_client *c, const void *p, size_t bytes);
int psc__region_has(const struct psc_client *c, uint32_t s, const void *p, size_t bytes,
                    size_t align);
int psc__shm_in_region(const struct psc_client *c, uint32_t s, const void *p, size_t bytes);
const uint64_t *psc__rows_keys(const struct psc_client *c, const struct slot *sl);
Ps__DType psc__shard_dtype(const struct psc_client *c, uint32_t s);
Ps__DType psc__sent_dtype(const struct psc_client *c, const struct slot *sl, uint32_t s);
int psc__shm_out_at(const struct psc_client *c, const struct slot *sl, uint32_t s, uint64_t a,
                    uint64_t b, uint64_t *off);

/* send.c */
void psc__flush_all(struct psc_client *c);
int psc__send_frames(struct psc_client *c, uint32_t shard, const Ps__Header *h, const void *keys,
                     size_t kbytes, const void *vals, size_t vbytes, struct slot *sl, int resend);
const unsigned char *psc__wire_values(struct psc_client *c, struct slot *sl, const float *v,
                                      size_t n);
/* What psc__send_sub did, when it did not fail. */
enum psc__sub_sent {
    PSC_SUB_SENT = 0, /* shard s's part went out */
    PSC_SUB_NONE = 1, /* nothing of the request is on shard s */
};
/* Sends shard s's part of the slot's request (again, when resend), by
 * the slot's kind (send.c's send_part). Returns an enum psc__sub_sent, or
 * a PS_E* code (the slot failed). */
int psc__send_sub(struct psc_client *c, struct slot *sl, uint32_t s, int resend);
int psc__send_all(struct psc_client *c, struct slot *sl, uint64_t id, uint64_t *ticket);
void psc__resend_all_due(struct psc_client *c);

/* recv.c */
/* Takes in what shard s's socket holds now, without waiting: replies a
 * replica sent before its connection dropped are read before the client
 * moves to another (zmq_disconnect would drop them). */
void psc__drain_shard(struct psc_client *c, uint32_t s);
unsigned psc__await_replies(struct psc_client *c, const struct slot *sl, int wait_ms);

/* failover.c */
int psc__replicas_init(struct psc_client *c, const struct psc_config *cfg, char *err,
                       size_t errlen);
void psc__replicas_fini(struct psc_client *c);
void psc__replicas_watch(struct psc_client *c);
/* A PS_ENOTPRIMARY reply from shard s: 1 when the shard has replicas to
 * move between (the request stays outstanding), else 0. */
int psc__not_primary(struct psc_client *c, uint32_t s, const Ps__Header *h);
/* Shard s's connection in use dropped (psc__failover_poll saw it, and the
 * replies it holds were read): to the next replica, and a probe. */
void psc__failover_dropped(struct psc_client *c, uint32_t s);
/* 1 when h answers shard s's probe. */
int psc__probe_answered(struct psc_client *c, uint32_t s, const Ps__Header *h);
void psc__failover_poll(struct psc_client *c);
int psc__failover_wait_ms(const struct psc_client *c, int wait);

/* admin.c */
int psc__call_sync(struct psc_client *c, Ps__Header *h, uint32_t s0, uint32_t s1, void *ctx,
                   int timeout_ms);

#endif
