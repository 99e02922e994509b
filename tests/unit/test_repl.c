/* Replication as units (server/repl/): the record encoding a backup
 * reads, the pieces of a state transfer, the primary's backlog and
 * the resumes it feeds, the in-sync set's rules
 * (backups.h), and leadership through etcd (lead.h) with etcd replaced
 * by a stand-in at the HTTP boundary (etcd_standin.h): who may take a
 * shard, who may take over, fencing a deposed primary, renewing and
 * losing the lease, and etcd not answering. */
#include "backlog.h"
#include "backups.h"
#include "etcd_standin.h"
#include "lead.h"
#include "record.h"
#include "transfer.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_limits.h"
#include "ps_wire.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

static unsigned char arena_buf[4 * PS_HEADER_BYTES_MAX];

/* h packed and unpacked again as a backup reads it. */
static Ps__Header *round_trip(const Ps__Header *h, struct ps_arena *a)
{
    static uint8_t buf[PS_HEADER_BYTES_MAX];
    int64_t n = ps_wire_header_pack(h, buf, sizeof buf);
    assert_true(n > 0);
    ps_arena_init(a, arena_buf, sizeof arena_buf);
    return psd_record_unpack(a, buf, (size_t)n);
}

static void test_record_round_trip(void **state)
{
    (void)state;
    struct ps_arena a;
    Ps__Header h;
    psd_record_header(&h, PS__RECORD__REC_REQUEST, 7, 42);
    h.route.data = (uint8_t *)"\0conn";
    h.route.len = 5;
    h.user = "client-key";
    Ps__Header *o = round_trip(&h, &a);
    assert_non_null(o);
    assert_int_equal(o->op, PS__OP__OP_REPLICATE);
    assert_int_equal(o->record, PS__RECORD__REC_REQUEST);
    assert_int_equal(o->epoch, 7);
    assert_int_equal(o->seq, 42);
    assert_int_equal(o->route.len, 5);
    assert_memory_equal(o->route.data, "\0conn", 5);
    assert_string_equal(o->user, "client-key");

    psd_record_header(&h, PS__RECORD__REC_SNAPSHOT, 3, 9);
    h.offset = 16u << 20;
    h.count = UINT64_C(5) << 30;
    h.last = 1;
    o = round_trip(&h, &a);
    assert_non_null(o);
    assert_int_equal(o->record, PS__RECORD__REC_SNAPSHOT);
    assert_int_equal(o->offset, 16u << 20);
    assert_int_equal(o->count, UINT64_C(5) << 30);
    assert_true(o->last);

    psd_record_header(&h, PS__RECORD__REC_DROP, 3, 10);
    h.worker_id = 4095;
    o = round_trip(&h, &a);
    assert_non_null(o);
    assert_int_equal(o->record, PS__RECORD__REC_DROP);
    assert_int_equal(o->worker_id, 4095);
}

/* A header frame one byte past PS_HEADER_BYTES_MAX is refused before it
 * is read, one at the limit is read; bytes that are no header are
 * refused. */
static void test_record_refused(void **state)
{
    (void)state;
    struct ps_arena a;
    ps_arena_init(&a, arena_buf, sizeof arena_buf);
    static uint8_t big[PS_HEADER_BYTES_MAX + 1];
    memset(big, 0xff, sizeof big);
    assert_null(psd_record_unpack(&a, big, sizeof big));
    assert_null(psd_record_unpack(&a, big, PS_HEADER_BYTES_MAX)); /* read, and not a header */
    const uint8_t junk[] = {0x0a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80};
    assert_null(psd_record_unpack(&a, junk, sizeof junk));
}

/* A state transfer's pieces: in order, within the size they declare,
 * and that size at most PSD_TRANSFER_BYTES_MAX. */
static void test_transfer_pieces(void **state)
{
    (void)state;
    Ps__Header h;
    psd_record_header(&h, PS__RECORD__REC_SNAPSHOT, 1, 0);
    const struct {
        uint64_t offset, count, piece, have;
        int fits;
    } cases[] = {
        {0, 100, 60, 0, 1},    /* the first */
        {60, 100, 40, 60, 1},  /* the last, to the byte */
        {60, 100, 41, 60, 0},  /* one past the end */
        {0, 100, 40, 60, 0},   /* out of order: again from 0 */
        {61, 100, 1, 60, 0},   /* a gap */
        {0, 0, 0, 0, 1},       /* an empty file */
        {101, 100, 0, 101, 0}, /* past the size it declares */
        {0, PSD_TRANSFER_BYTES_MAX, 1, 0, 1},
        {0, PSD_TRANSFER_BYTES_MAX + 1, 1, 0, 0},
        {UINT64_MAX, UINT64_MAX, 2, UINT64_MAX, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        h.offset = cases[i].offset;
        h.count = cases[i].count;
        if (psd_record_piece_fits(&h, cases[i].piece, cases[i].have) != cases[i].fits)
            fail_msg("case %zu", i);
    }
}

/* ---- the in-sync set ------------------------------------------------------ */

static struct psd_backup *follow(struct psd_backups *set, uint64_t id, const char *ep)
{
    struct psd_backup *b = psd_backups_slot(set, id);
    assert_non_null(b);
    psd_backup_follows(b, id, ep, "route", 5, 1000);
    return b;
}

/* A backup is waited for only once it has acknowledged what its state
 * transfer held; acknowledgements past what was sent, or going back, do
 * not count. */
static void test_backup_joins_after_its_transfer(void **state)
{
    (void)state;
    struct psd_backups set;
    memset(&set, 0, sizeof set);
    struct psd_backup *b = follow(&set, 11, "tcp://b:1");
    assert_int_equal(b->state, PSD_BACKUP_TRANSFER);
    assert_true(psd_backups_waiting(&set));
    assert_false(psd_backup_gets_records(b));
    assert_true(psd_backup_gets_beats(b));
    assert_int_equal(psd_backups_required(&set), UINT64_MAX);
    psd_backup_transferred(b, 10);
    assert_false(psd_backups_waiting(&set));
    assert_true(psd_backup_gets_records(b));
    assert_int_equal(psd_backup_acked(b, 9, 12, 2000), 0);
    assert_int_equal(b->state, PSD_BACKUP_CATCHING_UP);
    assert_int_equal(psd_backups_required(&set), UINT64_MAX);
    assert_int_equal(psd_backup_acked(b, 10, 12, 2000), 1); /* joins: the set is written */
    assert_int_equal(b->state, PSD_BACKUP_IN_SYNC);
    assert_int_equal(psd_backups_required(&set), 10);
    assert_int_equal(psd_backup_acked(b, 50, 12, 2000), 0); /* past what was sent */
    assert_int_equal(b->acked, 10);
    assert_int_equal(psd_backup_acked(b, 8, 12, 2000), 0); /* going back */
    assert_int_equal(b->acked, 10);
    assert_int_equal(psd_backup_acked(b, 12, 12, 2000), 0); /* at what was sent */
    assert_int_equal(b->acked, 12);
    assert_int_equal(psd_backup_lag(b, 15), 3);
    uint64_t ids[PSD_BACKUPS_MAX];
    const char *eps[PSD_BACKUPS_MAX];
    assert_int_equal(psd_backups_in_sync(&set, ids, eps), 1);
    assert_int_equal(ids[0], 11);
    assert_string_equal(eps[0], "tcp://b:1");
}

/* The in-sync set is written while the primary serves: a backup dropped
 * after the write began was in what it wrote, and is waited for until
 * the next write leaves it out. */
static void test_backup_dropped_during_a_set_write_stays(void **state)
{
    (void)state;
    struct psd_backups set;
    memset(&set, 0, sizeof set);
    struct psd_backup *a = follow(&set, 1, "tcp://a:1"), *b = follow(&set, 2, "tcp://b:1");
    psd_backup_transferred(a, 0);
    psd_backup_transferred(b, 0);
    assert_int_equal(psd_backup_acked(a, 5, 9, 1), 1);
    assert_int_equal(psd_backup_acked(b, 7, 9, 1), 1);
    assert_int_equal(psd_backup_drop(a), 1);
    uint64_t ids[PSD_BACKUPS_MAX];
    const char *eps[PSD_BACKUPS_MAX];
    assert_int_equal(psd_backups_in_sync(&set, ids, eps), 1); /* the write begins: b */
    uint32_t mask = psd_backups_leaving_mask(&set);
    assert_int_equal(mask, 1u);
    assert_int_equal(psd_backup_drop(b), 1); /* meanwhile */
    psd_backups_listed(&set, mask);          /* the write ends */
    assert_int_equal(a->state, PSD_BACKUP_FREE);
    assert_int_equal(b->state, PSD_BACKUP_LEAVING);
    assert_int_equal(psd_backups_required(&set), 7); /* b is still waited for */
    assert_int_equal(psd_backups_in_sync(&set, ids, eps), 0);
    psd_backups_listed(&set, psd_backups_leaving_mask(&set));
    assert_int_equal(b->state, PSD_BACKUP_FREE);
    assert_int_equal(psd_backups_required(&set), UINT64_MAX);
}

/* Replies wait for the slowest backup of the set; one dropped from it is
 * still waited for until etcd's set is written without it; one dropped
 * before it joined goes at once. */
static void test_leaving_backup_is_waited_for(void **state)
{
    (void)state;
    struct psd_backups set;
    memset(&set, 0, sizeof set);
    struct psd_backup *a = follow(&set, 1, "tcp://a:1"), *b = follow(&set, 2, "tcp://b:1");
    struct psd_backup *c = follow(&set, 3, "tcp://c:1");
    psd_backup_transferred(a, 0);
    psd_backup_transferred(b, 0);
    psd_backup_transferred(c, 0);
    assert_int_equal(psd_backup_acked(a, 5, 9, 1), 1);
    assert_int_equal(psd_backup_acked(b, 7, 9, 1), 1);
    assert_int_equal(psd_backups_required(&set), 5); /* the slowest */
    assert_int_equal(psd_backup_drop(a), 1);         /* in the set: it leaves */
    assert_int_equal(a->state, PSD_BACKUP_LEAVING);
    assert_true(psd_backups_leaving(&set));
    assert_int_equal(psd_backups_required(&set), 5); /* still waited for */
    assert_false(psd_backup_gets_beats(a));
    assert_false(psd_backup_silent(a, UINT64_MAX / 2, 10, 10));
    assert_int_equal(psd_backup_drop(a), 0); /* dropping it again changes nothing */
    uint64_t ids[PSD_BACKUPS_MAX];
    const char *eps[PSD_BACKUPS_MAX];
    assert_int_equal(psd_backups_in_sync(&set, ids, eps), 1); /* the set to write: b */
    assert_int_equal(ids[0], 2);
    psd_backups_listed(&set, psd_backups_leaving_mask(&set));
    assert_int_equal(a->state, PSD_BACKUP_FREE);
    assert_false(psd_backups_leaving(&set));
    assert_int_equal(psd_backups_required(&set), 7);
    assert_int_equal(psd_backup_drop(c), 0); /* not in the set yet: gone at once */
    assert_int_equal(c->state, PSD_BACKUP_FREE);
    assert_int_equal(psd_backups_required(&set), 7);
}

/* PSD_BACKUPS_MAX backups fill the slots; one more is refused; a replica
 * that follows again gets its own slot back. */
static void test_backup_slots_at_the_limit(void **state)
{
    (void)state;
    struct psd_backups set;
    memset(&set, 0, sizeof set);
    for (uint64_t i = 0; i < PSD_BACKUPS_MAX; i++)
        follow(&set, 100 + i, "tcp://x:1");
    assert_null(psd_backups_slot(&set, 999));
    assert_ptr_equal(psd_backups_slot(&set, 101), &set.b[1]);
    psd_backup_drop(&set.b[0]);
    assert_ptr_equal(psd_backups_slot(&set, 999), &set.b[0]);
}

/* A backup in the set is dropped after timeout_ms of silence, one still
 * loading its state only after catch_up_ms. */
static void test_silent_backups(void **state)
{
    (void)state;
    struct psd_backups set;
    memset(&set, 0, sizeof set);
    struct psd_backup *b = follow(&set, 1, "tcp://b:1"); /* heard at 1000 */
    assert_false(psd_backup_silent(b, 1000 + 30000, 500, 30000));
    assert_true(psd_backup_silent(b, 1000 + 30001, 500, 30000));
    psd_backup_transferred(b, 0);
    psd_backup_acked(b, 0, 0, 2000);
    assert_int_equal(b->state, PSD_BACKUP_IN_SYNC);
    assert_false(psd_backup_silent(b, 2000 + 500, 500, 30000));
    assert_true(psd_backup_silent(b, 2000 + 501, 500, 30000));
}

/* Records made while a state transfer is written are kept for its
 * backups up to a bound in bytes (frames, headers and bookkeeping);
 * past it, PS_ELIMIT (the transfer ends, its backups ask again),
 * counted; ending it lets them all go. */
static void test_transfer_keeps_records_up_to_its_bound(void **state)
{
    (void)state;
    static char mib[1u << 20];
    struct psd_transfer x;
    psd_transfer_init(&x, 4u << 20);
    x.mask = 1; /* under way, for one backup */
    Ps__Header h;
    psd_record_header(&h, PS__RECORD__REC_REQUEST, 1, 0);
    zmq_msg_t f;
    int rc = 0;
    uint32_t n = 0;
    while (rc == 0) {
        h.seq = ++n;
        zmq_msg_init_data(&f, mib, sizeof mib, NULL, NULL); /* shared, not copied */
        rc = psd_transfer_keep(&x, &h, &f, 1);
        zmq_msg_close(&f);
    }
    assert_int_equal(rc, PS_ELIMIT);
    assert_int_equal(x.kept.n, 3); /* the fourth's header and bookkeeping pass 4 MiB */
    assert_true(x.kept.bytes > 3u << 20 && x.kept.bytes <= 4u << 20);
    assert_int_equal(x.over_bound, 1);
    assert_int_equal(x.kept_peak_bytes, x.kept.bytes);
    assert_int_equal(psd_transfer_keep(&x, &h, NULL, 0), 0); /* a small one still fits */
    psd_transfer_end(&x);
    assert_int_equal(x.kept.n, 0);
    assert_int_equal(x.kept.bytes, 0);
    assert_null(x.kept.head);
    x.mask = 1;
    for (rc = 0, n = 0; rc == 0; n++) /* records without frames: their own cost bounds them */
        rc = psd_transfer_keep(&x, &h, NULL, 0);
    assert_int_equal(rc, PS_ELIMIT);
    assert_true(n > 1000);
    assert_int_equal(x.over_bound, 2);
    psd_transfer_end(&x);
    assert_int_equal(x.kept.n, 0);
    assert_false(psd_transfer_busy(&x));
}

/* Record seq with a frame of bytes (shared, not copied) into b. */
static void backlog_add(struct psd_backlog *b, uint64_t seq, size_t bytes)
{
    static char buf[6u << 20];
    Ps__Header h;
    psd_record_header(&h, PS__RECORD__REC_REQUEST, 1, seq);
    uint8_t hdr[PS_HEADER_BYTES_MAX];
    int64_t len = ps_wire_header_pack(&h, hdr, sizeof hdr);
    assert_true(len > 0 && bytes <= sizeof buf);
    zmq_msg_t f;
    zmq_msg_init_data(&f, buf, bytes, NULL, NULL);
    psd_backlog_add(b, seq, hdr, (size_t)len, &f, 1);
    zmq_msg_close(&f);
}

static void test_backlog_keeps_the_newest_up_to_its_bound(void **state)
{
    (void)state;
    struct psd_backlog b;
    psd_backlog_init(&b, 4u << 20);
    assert_true(psd_backlog_covers(&b, 0)); /* a new epoch: its start */
    for (uint64_t seq = 1; seq <= 10; seq++)
        backlog_add(&b, seq, 1u << 20);
    assert_int_equal(b.q.n, 3); /* a fourth's bookkeeping passes 4 MiB */
    assert_true(b.q.bytes > 3u << 20 && b.q.bytes <= 4u << 20);
    assert_int_equal(b.evicted, 7);
    assert_false(psd_backlog_covers(&b, 6)); /* record 7 is gone */
    assert_true(psd_backlog_covers(&b, 7));
    assert_true(psd_backlog_covers(&b, 10));
    assert_false(psd_backlog_covers(&b, 11)); /* not made yet */
    assert_int_equal(psd_backlog_after(&b, 8)->seq, 9);
    assert_null(psd_backlog_after(&b, 10));
    /* a record after a gap starts it over */
    backlog_add(&b, 12, 100);
    assert_int_equal(b.q.n, 1);
    assert_false(psd_backlog_covers(&b, 10));
    assert_true(psd_backlog_covers(&b, 11));
    /* one past the bound is not kept: nothing before it can be brought up */
    backlog_add(&b, 13, 5u << 20);
    assert_int_equal(b.q.n, 0);
    assert_int_equal(b.q.bytes, 0);
    assert_false(psd_backlog_covers(&b, 12));
    assert_true(psd_backlog_covers(&b, 13));
    /* a resume keeps the records after the backup's state for it */
    for (uint64_t seq = 14; seq <= 16; seq++)
        backlog_add(&b, seq, 1000);
    struct psd_transfer x;
    psd_transfer_init(&x, 1u << 20);
    assert_int_equal(psd_transfer_resume(&x, 2, 14, 1, &b, 1, 40), 0);
    assert_true(psd_transfer_busy(&x));
    assert_int_equal(x.kept.n, 2);
    assert_int_equal(x.seq, 14);
    assert_int_equal(x.resume_epoch, 1);
    assert_int_equal(x.resume_seq, 40);
    psd_transfer_end(&x);
    assert_false(psd_transfer_busy(&x));
    assert_int_equal(b.q.n, 3); /* the backlog keeps its own */
    /* ...within the transfer's bound, or not at all */
    psd_transfer_init(&x, 1500);
    assert_int_equal(psd_transfer_resume(&x, 2, 13, 1, &b, 1, 40), PS_ELIMIT);
    assert_false(psd_transfer_busy(&x));
    assert_int_equal(x.kept.n, 0);
    psd_backlog_reset(&b, 0);
    assert_int_equal(b.q.n, 0);
    assert_true(psd_backlog_covers(&b, 0));
    /* a backlog of 0 bytes keeps no record */
    psd_backlog_init(&b, 0);
    backlog_add(&b, 1, 10);
    assert_int_equal(b.q.n, 0);
    assert_false(psd_backlog_covers(&b, 0));
    assert_true(psd_backlog_covers(&b, 1));
}

/* ---- leadership through etcd ------------------------------------------------ */

static struct standin etcd;
static uv_loop_t loop;

/* A replica's leadership, its asynchronous calls on loop (the stand-in
 * answers them at once). */
static void lead(struct psd_lead *l, uint64_t id, const char *ep, int64_t ttl_s)
{
    char err[256];
    assert_int_equal(
        psd_lead_init(l, "http://etcd.test:2379", "/psd", 0, 2, id, ep, ttl_s, err, sizeof err), 0);
    psd_etcd_set_transport(&l->etcd, standin_post, &etcd);
    assert_int_equal(psd_etcd_async_start(&l->etcd, &loop, 1000, err, sizeof err), 0);
}

static void unlead(struct psd_lead *l)
{
    psd_etcd_async_close(&l->etcd);
    uv_run(&loop, UV_RUN_NOWAIT);
    psd_lead_fini(l);
}

struct ended {
    int rc;
    int64_t value;
};

static void call_ended(void *ctx, int rc, int64_t value)
{
    struct ended *e = ctx;
    e->rc = rc;
    e->value = value;
}

/* A primary's renewal as its tick makes it: 0 when none is due, else
 * what the (at once answered) call ended with. */
static int renew(struct psd_lead *l, uint64_t now)
{
    if (l->lease == 0)
        return PS_ESTATE;
    if (!psd_lead_renew_due(l, now))
        return 0;
    struct ended e = {1, 0};
    uint64_t blocking = l->etcd.blocking;
    int rc = psd_lead_renew_async(l, now, call_ended, &e);
    if (rc != 0)
        return rc;
    assert_int_not_equal(e.rc, 1);                /* the stand-in answered at once */
    assert_int_equal(l->etcd.blocking, blocking); /* never a blocking call */
    return e.rc;
}

static void view(struct psd_lead *l, struct psd_lead_view *v)
{
    assert_int_equal(psd_lead_read(l, v), 0);
}

static int campaign(struct psd_lead *l)
{
    struct psd_lead_view v;
    view(l, &v);
    int won = -1;
    assert_int_equal(psd_lead_campaign(l, &v, &won), 0);
    return won;
}

/* The in-sync set written as a primary writes it: on the loop, without
 * a blocking call. */
static void set_insync(struct psd_lead *l, uint64_t id, const char *ep, int want_ok)
{
    struct ended e = {-1, -1};
    uint64_t blocking = l->etcd.blocking;
    assert_int_equal(psd_lead_set_insync_async(l, &id, &ep, 1, call_ended, &e), 0);
    assert_int_equal(e.rc, 0);
    assert_int_equal(e.value, want_ok);
    assert_int_equal(l->etcd.blocking, blocking);
}

/* The first replica of a new shard takes it: epoch 1, the leader key on
 * its lease, the in-sync set holding it alone; its replies may go out
 * for nine tenths of the lease. */
static void test_first_replica_takes_a_new_shard(void **state)
{
    (void)state;
    standin_init(&etcd);
    struct psd_lead a;
    lead(&a, 0xa, "tcp://a:5570", 2);
    uint64_t before = (uint64_t)ps_mono_ms();
    assert_int_equal(campaign(&a), 1);
    assert_int_equal(a.epoch, 1);
    const struct standin_kv *k = standin_get(&etcd, "/psd/shard-0-of-2/leader");
    assert_non_null(k);
    assert_int_equal(k->lease, a.lease);
    assert_non_null(strstr(k->value, "tcp://a:5570"));
    k = standin_get(&etcd, "/psd/shard-0-of-2/insync");
    assert_non_null(k);
    assert_non_null(strstr(k->value, "000000000000000a@tcp://a:5570"));
    assert_true(a.lease_until_ms >= before + 1800 && a.lease_until_ms <= before + 1800 + 1000);
    struct psd_lead_view v;
    view(&a, &v);
    assert_true(v.leader && v.member && v.epoch == 1 && v.leader_id == 0xa);
    unlead(&a);
}

/* Two replicas that both saw no primary: the second's transaction finds
 * the keys changed and it does not win. */
static void test_one_wins_a_race(void **state)
{
    (void)state;
    standin_init(&etcd);
    struct psd_lead a, b;
    lead(&a, 0xa, "tcp://a:5570", 1);
    lead(&b, 0xb, "tcp://b:5570", 1);
    struct psd_lead_view va, vb;
    view(&a, &va);
    view(&b, &vb);
    int won = -1;
    assert_int_equal(psd_lead_campaign(&a, &va, &won), 0);
    assert_int_equal(won, 1);
    assert_int_equal(psd_lead_campaign(&b, &vb, &won), 0);
    assert_int_equal(won, 0);
    view(&b, &vb);
    assert_true(vb.leader && vb.leader_id == 0xa && !vb.member);
    unlead(&a);
    unlead(&b);
}

/* With the primary's lease gone, only a replica of the in-sync set may
 * take over: another does not even ask etcd. */
static void test_only_the_set_takes_over(void **state)
{
    (void)state;
    standin_init(&etcd);
    struct psd_lead a, b, c;
    lead(&a, 0xa, "tcp://a:5570", 1);
    lead(&b, 0xb, "tcp://b:5570", 1);
    lead(&c, 0xc, "tcp://c:5570", 1);
    assert_int_equal(campaign(&a), 1);
    set_insync(&a, 0xb, "tcp://b:5570", 1);
    standin_expire(&etcd, a.lease); /* a stops renewing */
    unsigned txns = etcd.txns;
    assert_int_equal(campaign(&c), 0);
    assert_int_equal(etcd.txns, txns); /* not in the set: no transaction */
    assert_int_equal(campaign(&b), 1);
    assert_int_equal(b.epoch, 2);
    unlead(&a);
    unlead(&b);
    unlead(&c);
}

/* A member of the set that stops hearing its primary takes over while
 * the primary's key still exists (compare and swap on its value); the
 * deposed primary can no longer write the set, so it acknowledges
 * nothing more. */
static void test_takeover_fences_the_old_primary(void **state)
{
    (void)state;
    standin_init(&etcd);
    struct psd_lead a, b;
    lead(&a, 0xa, "tcp://a:5570", 10);
    lead(&b, 0xb, "tcp://b:5570", 10);
    assert_int_equal(campaign(&a), 1);
    set_insync(&a, 0xb, "tcp://b:5570", 1);
    struct psd_lead_view v;
    view(&b, &v);
    assert_true(v.leader && v.member);
    int won = -1;
    assert_int_equal(psd_lead_campaign(&b, &v, &won), 0);
    assert_int_equal(won, 1);
    assert_int_equal(b.epoch, 2);
    set_insync(&a, 0xb, "tcp://b:5570", 0); /* deposed */
    set_insync(&b, 0xa, "tcp://a:5570", 1);
    /* a view read before b took over no longer wins anything */
    assert_int_equal(psd_lead_campaign(&a, &v, &won), 0);
    assert_int_equal(won, 0);
    unlead(&a);
    unlead(&b);
}

/* The lease is renewed once a third of its TTL has passed, not sooner;
 * each renewal moves the time replies may go out to; a lease etcd no
 * longer holds ends the primary's time at once. */
static void test_renewing_and_losing_the_lease(void **state)
{
    (void)state;
    standin_init(&etcd);
    struct psd_lead a;
    lead(&a, 0xa, "tcp://a:5570", 3);
    assert_int_equal(campaign(&a), 1);
    uint64_t t = a.renewed_ms;
    unsigned calls = etcd.calls;
    assert_int_equal(renew(&a, t + 999), 0);
    assert_int_equal(etcd.calls, calls); /* too soon */
    assert_int_equal(renew(&a, t + 1000), 0);
    assert_int_equal(etcd.calls, calls + 1);
    assert_int_equal(a.lease_until_ms, t + 1000 + 3 * 900);
    assert_int_equal(renew(&a, t + 1010), 0); /* renewed just now */
    assert_int_equal(etcd.calls, calls + 1);
    standin_expire(&etcd, a.lease);
    assert_int_equal(renew(&a, t + 2000), PS_ESTATE);
    assert_int_equal(a.lease_until_ms, 0);
    assert_non_null(strstr(a.etcd.err, "no longer holds"));
    assert_int_equal(renew(&a, t + 5000), PS_ESTATE); /* no lease: nothing to renew */
    unlead(&a);
}

/* An etcd that does not answer: reads fail with the reason in err, and a
 * primary's lease runs out at the time it had (no renewal extends it). */
static void test_etcd_not_answering(void **state)
{
    (void)state;
    standin_init(&etcd);
    struct psd_lead a;
    lead(&a, 0xa, "tcp://a:5570", 3);
    assert_int_equal(campaign(&a), 1);
    uint64_t until = a.lease_until_ms, t = a.renewed_ms;
    etcd.down = 1;
    struct psd_lead_view v;
    assert_int_equal(psd_lead_read(&a, &v), PS_ETIMEDOUT);
    assert_non_null(strstr(a.etcd.err, "kv/range"));
    assert_int_equal(renew(&a, t + 1000), PS_ETIMEDOUT);
    assert_int_equal(a.lease_until_ms, until);
    assert_int_equal(renew(&a, t + 1000 + PSD_ETCD_RETRY_MS - 1), 0); /* not again yet */
    etcd.down = 0;
    assert_int_equal(renew(&a, t + 1000 + PSD_ETCD_RETRY_MS), 0);
    assert_true(a.lease_until_ms > until);
    unlead(&a);
}

/* A primary that resigns gives its lease up: a member of its set takes
 * over at once, at the next epoch; etcd's minimum lease is what counts. */
static void test_resigning(void **state)
{
    (void)state;
    standin_init(&etcd);
    etcd.min_ttl = 2;
    struct psd_lead a, b;
    lead(&a, 0xa, "tcp://a:5570", 1);
    lead(&b, 0xb, "tcp://b:5570", 1);
    uint64_t before = (uint64_t)ps_mono_ms();
    assert_int_equal(campaign(&a), 1);
    assert_int_equal(a.granted_s, 2);
    assert_true(a.lease_until_ms >= before + 1800);
    set_insync(&a, 0xb, "tcp://b:5570", 1);
    psd_lead_resign(&a);
    assert_int_equal(a.lease_until_ms, 0);
    assert_null(standin_get(&etcd, "/psd/shard-0-of-2/leader"));
    assert_int_equal(campaign(&b), 1);
    assert_int_equal(b.epoch, 2);
    unlead(&a);
    unlead(&b);
}

/* A clean stop: the primary records its position in the in-sync key
 * (only while it holds the leader key) and resigns. With no leader, a
 * replica outside the set may take over only when it holds that state
 * (v.resume, which the caller sets from its checkpoint); the new set
 * no longer carries the stop. */
static void test_a_clean_stop_lets_the_replica_holding_it_take_over(void **state)
{
    (void)state;
    standin_init(&etcd);
    struct psd_lead a, c, d;
    lead(&a, 0xa, "tcp://a:5570", 1);
    lead(&c, 0xc, "tcp://c:5570", 1); /* restarted processes: new ids */
    lead(&d, 0xd, "tcp://d:5570", 1);
    assert_int_equal(campaign(&a), 1);
    uint64_t b = 0xb;
    const char *eb = "tcp://b:5570";
    int ok = -1;
    assert_int_equal(psd_lead_set_stopped(&a, &b, &eb, 1, 812, &ok), 0);
    assert_int_equal(ok, 1);
    psd_lead_resign(&a);
    struct psd_lead_view v;
    view(&c, &v);
    assert_true(!v.leader && v.insync_found && !v.member && v.stopped);
    assert_int_equal(v.stopped_epoch, 1);
    assert_int_equal(v.stopped_seq, 812);
    assert_non_null(strstr(v.members, "000000000000000b@tcp://b:5570"));
    int won = -1;
    assert_int_equal(psd_lead_campaign(&d, &v, &won), 0); /* another state: not resume */
    assert_int_equal(won, 0);
    v.resume = 1;
    assert_int_equal(psd_lead_campaign(&c, &v, &won), 0);
    assert_int_equal(won, 1);
    assert_int_equal(c.epoch, 2);
    view(&d, &v);
    assert_true(v.leader && v.leader_id == 0xc && !v.stopped);
    /* a deposed primary cannot record a stop */
    assert_int_equal(psd_lead_set_stopped(&a, &b, &eb, 1, 900, &ok), 0);
    assert_int_equal(ok, 0);
    view(&d, &v);
    assert_false(v.stopped);
    unlead(&a);
    unlead(&c);
    unlead(&d);
}

/* An in-sync key that is not JSON is an error naming it, not a view. */
static void test_damaged_insync_key(void **state)
{
    (void)state;
    standin_init(&etcd);
    struct psd_lead a;
    lead(&a, 0xa, "tcp://a:5570", 1);
    assert_int_equal(campaign(&a), 1);
    struct standin_kv *k = (struct standin_kv *)standin_get(&etcd, "/psd/shard-0-of-2/insync");
    snprintf(k->value, sizeof k->value, "not json");
    k->len = strlen(k->value);
    struct psd_lead_view v;
    assert_int_equal(psd_lead_read(&a, &v), PS_EPROTO);
    assert_non_null(strstr(a.etcd.err, "in-sync key"));
    unlead(&a);
}

/* --replica-name: checked, a stable id (never 0, differing between
 * names), and held by one process: a second claim is refused naming the
 * holder's endpoint, until the holder gives it up or its lease runs out;
 * a refused claim leaves no lease behind. */
static void test_a_replica_name_is_held_by_one_process(void **state)
{
    (void)state;
    char err[256], holder[PS_ENDPOINT_MAX];
    assert_int_equal(psd_lead_name_check("psd-3", err, sizeof err), 0);
    assert_int_equal(psd_lead_name_check("", err, sizeof err), PS_EINVAL);
    assert_int_equal(psd_lead_name_check("a/b", err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "character 2"));
    char long_name[PSD_REPLICA_NAME_MAX + 2];
    memset(long_name, 'x', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    assert_int_equal(psd_lead_name_check(long_name, err, sizeof err), PS_EINVAL);
    long_name[PSD_REPLICA_NAME_MAX] = '\0'; /* at the most: taken */
    assert_int_equal(psd_lead_name_check(long_name, err, sizeof err), 0);
    assert_int_equal(psd_lead_name_id("psd-3"), psd_lead_name_id("psd-3"));
    assert_int_not_equal(psd_lead_name_id("psd-3"), psd_lead_name_id("psd-4"));
    assert_int_not_equal(psd_lead_name_id("psd-3"), 0);

    standin_init(&etcd);
    struct psd_lead a, b;
    lead(&a, psd_lead_name_id("psd-3"), "tcp://a:5570", 3);
    lead(&b, psd_lead_name_id("psd-3"), "tcp://b:5570", 3);
    assert_int_equal(psd_lead_claim(&a, "psd-3", holder, sizeof holder), 0);
    assert_string_equal(a.member_key, "/psd/shard-0-of-2/member-psd-3");
    size_t leases = etcd.nlease;
    assert_int_equal(psd_lead_claim(&b, "psd-3", holder, sizeof holder), PS_EBUSY);
    assert_string_equal(holder, "tcp://a:5570");
    assert_int_equal(b.member_lease, 0);
    assert_int_equal(etcd.nlease, leases); /* its try's lease is given back */
    assert_true(psd_lead_member_due(&a, a.member_renewed_ms + 1000));
    assert_false(psd_lead_member_due(&a, a.member_renewed_ms + 999));
    psd_lead_unclaim(&a); /* a clean stop */
    assert_int_equal(psd_lead_claim(&b, "psd-3", holder, sizeof holder), 0);
    standin_expire(&etcd, b.member_lease); /* b killed: its lease runs out */
    assert_int_equal(psd_lead_claim(&a, "psd-3", holder, sizeof holder), 0);
    unlead(&a);
    unlead(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_record_round_trip),
        cmocka_unit_test(test_record_refused),
        cmocka_unit_test(test_transfer_pieces),
        cmocka_unit_test(test_backup_joins_after_its_transfer),
        cmocka_unit_test(test_leaving_backup_is_waited_for),
        cmocka_unit_test(test_backup_dropped_during_a_set_write_stays),
        cmocka_unit_test(test_backup_slots_at_the_limit),
        cmocka_unit_test(test_transfer_keeps_records_up_to_its_bound),
        cmocka_unit_test(test_backlog_keeps_the_newest_up_to_its_bound),
        cmocka_unit_test(test_silent_backups),
        cmocka_unit_test(test_first_replica_takes_a_new_shard),
        cmocka_unit_test(test_one_wins_a_race),
        cmocka_unit_test(test_only_the_set_takes_over),
        cmocka_unit_test(test_takeover_fences_the_old_primary),
        cmocka_unit_test(test_renewing_and_losing_the_lease),
        cmocka_unit_test(test_etcd_not_answering),
        cmocka_unit_test(test_resigning),
        cmocka_unit_test(test_a_clean_stop_lets_the_replica_holding_it_take_over),
        cmocka_unit_test(test_damaged_insync_key),
        cmocka_unit_test(test_a_replica_name_is_held_by_one_process),
    };
    uv_loop_init(&loop);
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    uv_loop_close(&loop);
    return failed;
}
