/* Tickets: waiting for one (driving the sends, the replies, failover
 * and heartbeats while it waits), canceling one, and the errors they
 * leave. The slots behind them are slots.c's. */
#include "client_impl.h"

#include "ps_clock.h"
#include "ps_err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Adds the shards sl was sent to and has no reply from to the mask m. */
static void add_missing(const struct slot *sl, uint64_t *m)
{
    for (uint32_t i = 0; i < PS_SHARDS_MAX / 64; i++)
        m[i] |= sl->expected[i] & ~sl->replied[i];
}

/* The shards of mask m, with their endpoints, into buf. */
static void describe_missing(struct psc_client *c, const uint64_t *m, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t s = 0; s < c->nshards && used + 1 < len; s++) {
        if (!((m[s / 64] >> (s % 64)) & 1u))
            continue;
        int n = snprintf(buf + used, len - used, "%s%u (%s)", used ? ", " : "", s, c->endpoints[s]);
        if (n < 0)
            break;
        used += (size_t)n;
    }
}

static int finish(struct psc_client *c, struct slot *sl)
{
    int rc = sl->status;
    c->last_remote = rc == PS_EREMOTE ? sl->remote : 0;
    if (rc != 0)
        psc__set_error(c, rc, "%s", sl->error);
    if (rc == 0 && sl->view && !sl->canceled) {
        sl->held = 1; /* the caller reads it, then psc_view_release */
        return 0;
    }
    psc__slot_release(c, sl);
    return rc;
}

/* The error of a wait for an op that ran out (the caller's timeout_ms),
 * naming the shards of mask m that did not answer (none: zmq still holds
 * a zero-copy buffer). */
static int timed_out(struct psc_client *c, const uint64_t *m, Ps__Op op, int timeout_ms)
{
    char missing[256];
    describe_missing(c, m, missing, sizeof missing);
    return psc__set_error(c, PS_ETIMEDOUT, "%s: no reply within %d ms from shard %s",
                          ps_op_name(op), timeout_ms,
                          missing[0] ? missing : "(zero-copy buffer still held)");
}

/* psc_wait for a request sent as pieces: each piece in turn, within the
 * one deadline. A failed piece fails the ticket, once every piece is in
 * (until then the library still owns the caller's buffers). */
static int wait_pieces(struct psc_client *c, struct slot *sl, int timeout_ms)
{
    int64_t deadline = ps_mono_ms() + (timeout_ms < 0 ? 0 : timeout_ms);
    for (uint32_t i = 0; i < sl->nkids; i++) {
        if (sl->kids[i] == 0)
            continue;
        int64_t left = deadline - ps_mono_ms();
        int rc = psc_wait(c, sl->kids[i], timeout_ms < 0 ? -1 : left > 0 ? (int)left : 0);
        if (rc == PS_ETIMEDOUT) { /* every shard a piece still waits for */
            uint64_t m[PS_SHARDS_MAX / 64] = {0};
            for (uint32_t j = i; j < sl->nkids; j++) {
                const struct slot *k = sl->kids[j] ? psc__slot_lookup(c, sl->kids[j]) : NULL;
                if (k != NULL)
                    add_missing(k, m);
            }
            return timed_out(c, m, sl->op, timeout_ms);
        }
        sl->kids[i] = 0;
        if (rc != 0)
            psc__slot_fail(sl, rc, "%s", c->last_error);
    }
    return finish(c, sl);
}

int psc_wait(struct psc_client *c, uint64_t ticket, int timeout_ms)
{
    struct slot *sl = psc__slot_lookup(c, ticket);
    if (sl == NULL || sl->canceled || sl->held)
        return psc__set_error(c, PS_EINVAL, "ticket %llu is not outstanding",
                              (unsigned long long)ticket);
    psc__flush_all(c);
    if (sl->kind == SUB_PIECES)
        return wait_pieces(c, sl, timeout_ms);
    int64_t deadline = ps_mono_ms() + (timeout_ms < 0 ? 0 : timeout_ms);
    for (unsigned got = 1;;) {
        int64_t left = timeout_ms < 0 ? -1 : deadline - ps_mono_ms();
        if (sl->pending == 0) {
            if (atomic_load(&sl->zc_refs) == 0)
                return finish(c, sl);
            /* Reply came before zmq's I/O thread let go of our buffer: the
             * release is imminent; wait for it without busy-burning much. */
            if (timeout_ms >= 0 && left <= 0)
                break;
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (got == 0 && timeout_ms >= 0 && left <= 0)
            break; /* time is up only once nothing more is waiting (so 0 takes what came) */
        psc__resend_all_due(c);
        psc__failover_poll(c);
        for (uint32_t s = 0; c->reps != NULL && s < c->nshards; s++)
            if (c->reps[s].dropped) { /* what it sent before it went, then another */
                psc__drain_shard(c, s);
                psc__failover_dropped(c, s);
            }
        psc_heartbeat(c);
        int wait = timeout_ms < 0 ? -1 : left > 0 ? (int)left : 0; /* left <= timeout_ms */
        if (c->retry_ms > 0 && (wait < 0 || wait > c->retry_ms))
            wait = c->retry_ms;
        if (c->heartbeat_ms > 0 && (wait < 0 || wait > c->heartbeat_ms))
            wait = c->heartbeat_ms;
        got = psc__await_replies(c, sl, psc__failover_wait_ms(c, wait));
    }
    uint64_t m[PS_SHARDS_MAX / 64] = {0};
    add_missing(sl, m);
    return timed_out(c, m, sl->op, timeout_ms);
}

int psc_cancel(struct psc_client *c, uint64_t ticket)
{
    struct slot *sl = psc__slot_lookup(c, ticket);
    if (sl == NULL)
        return psc__set_error(c, PS_EINVAL, "ticket %llu is not outstanding",
                              (unsigned long long)ticket);
    psc__flush_all(c); /* held requests count as sent: they go, as they would uncorked */
    sl->canceled = 1;
    sl->out = NULL;
    int busy = atomic_load(&sl->zc_refs) != 0;
    for (uint32_t i = 0; i < sl->nkids; i++) {
        if (sl->kids[i] != 0 && psc_cancel(c, sl->kids[i]) != PS_EBUSY)
            sl->kids[i] = 0;
        busy |= sl->kids[i] != 0;
    }
    if (busy)
        return psc__set_error(c, PS_EBUSY, "ticket %llu: zmq still holds its gradient buffer",
                              (unsigned long long)ticket);
    psc__slot_release(c, sl);
    return 0;
}

const char *psc_last_error(const struct psc_client *c)
{
    return c->last_error;
}

int psc_last_remote(const struct psc_client *c)
{
    return c->last_remote;
}

const char *psc_strerror(int code)
{
    return ps_strerror(code);
}

const char *psc_err_name(int code)
{
    return ps_err_name(code);
}
