/* ps_pool: one helper thread, pieces taken from a shared counter. */
#define _GNU_SOURCE
#include "ps_pool.h"

#include "ps_clock.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

struct ps_pool {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    long spin_ns;         /* how long the helper looks for the next run before it sleeps */
    unsigned long sleeps; /* times it slept (waited on cv) */
    atomic_ulong helped;  /* pieces the helper ran */
    /* the run in progress, set under mu */
    uint32_t gen;
    ps_piece_fn fn;
    void *ctx;
    int n;
    /* run number << 32 | next piece: a thread still inside an earlier run
     * cannot take a piece of this one */
    _Atomic uint64_t ticket;
    atomic_int done, err;
};

/* Takes pieces of run gen until none is left; returns how many it took. */
static unsigned long work(struct ps_pool *p, uint32_t gen, ps_piece_fn fn, void *ctx, int n)
{
    unsigned long took = 0;
    uint64_t t = atomic_load(&p->ticket);
    while ((uint32_t)(t >> 32) == gen && (uint32_t)t < (uint32_t)n) {
        if (!atomic_compare_exchange_weak(&p->ticket, &t, t + 1))
            continue; /* t was reloaded */
        int rc = fn(ctx, (int)(uint32_t)t);
        if (rc != 0) {
            int zero = 0;
            atomic_compare_exchange_strong(&p->err, &zero, rc);
        }
        atomic_fetch_add(&p->done, 1);
        took++;
        t = atomic_load(&p->ticket);
    }
    return took;
}

/* Before it sleeps, the helper looks for the next run for up to spin_ns,
 * giving up the core each time it looks (sched_yield: psd, or any thread
 * that shares the core, runs first). The products of one step follow each
 * other within microseconds; a wake-up through the condition variable
 * costs about as long again on these machines. Called without mu held;
 * returns with it held. */
static void await_run(struct ps_pool *p, uint32_t seen)
{
    if (p->spin_ns > 0) {
        int64_t until = ps_mono_ns() + p->spin_ns;
        while (__atomic_load_n(&p->gen, __ATOMIC_RELAXED) == seen &&
               !__atomic_load_n(&p->stop, __ATOMIC_RELAXED) && ps_mono_ns() < until)
            sched_yield();
    }
    pthread_mutex_lock(&p->mu);
    while (!p->stop && p->gen == seen) {
        p->sleeps++;
        pthread_cond_wait(&p->cv, &p->mu);
    }
}

static void *helper_main(void *arg)
{
    struct ps_pool *p = arg;
    uint32_t seen = 0;
    for (;;) {
        await_run(p, seen); /* mu held from here */
        if (p->stop)
            break;
        seen = p->gen;
        ps_piece_fn fn = p->fn;
        void *ctx = p->ctx;
        int n = p->n;
        pthread_mutex_unlock(&p->mu);
        atomic_fetch_add(&p->helped, work(p, seen, fn, ctx, n));
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int ps_pool_start(struct ps_pool **out, long spin_ns, const char *name)
{
    struct ps_pool *p = calloc(1, sizeof *p);
    if (p == NULL)
        return -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->spin_ns = spin_ns;
    int rc = pthread_create(&p->thread, NULL, helper_main, p);
    if (rc != 0) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p);
        errno = rc;
        return -1;
    }
    pthread_setname_np(p->thread, name); /* ERANGE past 15 characters: the name stays */
    *out = p;
    return 0;
}

int ps_pool_run(struct ps_pool *p, ps_piece_fn fn, void *ctx, int n)
{
    if (n <= 0)
        return 0;
    if (p == NULL) { /* no helper: the same pieces, one after the other */
        for (int i = 0; i < n; i++) {
            int rc = fn(ctx, i);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    pthread_mutex_lock(&p->mu);
    uint32_t gen = p->gen + 1;
    __atomic_store_n(&p->gen, gen, __ATOMIC_RELAXED); /* a spinning helper reads it unlocked */
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    atomic_store(&p->done, 0);
    atomic_store(&p->err, 0);
    atomic_store(&p->ticket, (uint64_t)gen << 32);
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    work(p, gen, fn, ctx, n);
    /* the pieces the helper took: this core has nothing else to do */
    while (atomic_load(&p->done) < n)
        sched_yield();
    return atomic_load(&p->err);
}

unsigned long ps_pool_helped(struct ps_pool *p)
{
    return p == NULL ? 0 : atomic_load(&p->helped);
}

unsigned long ps_pool_sleeps(struct ps_pool *p)
{
    pthread_mutex_lock(&p->mu);
    unsigned long n = p->sleeps;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void ps_pool_stop(struct ps_pool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELAXED);
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
