/* psw_pool: one helper thread, pieces taken from a shared counter. */
#define _GNU_SOURCE
#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

struct psw_pool {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    /* the run in progress, set under mu */
    uint32_t gen;
    psw_piece_fn fn;
    void *ctx;
    int n;
    /* run number << 32 | next piece: a thread still inside an earlier run
     * cannot take a piece of this one */
    _Atomic uint64_t ticket;
    atomic_int done, err;
};

/* Takes pieces of run gen until none is left. */
static void work(struct psw_pool *p, uint32_t gen, psw_piece_fn fn, void *ctx, int n)
{
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
        t = atomic_load(&p->ticket);
    }
}

static void *helper_main(void *arg)
{
    struct psw_pool *p = arg;
    uint32_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop)
            break;
        seen = p->gen;
        psw_piece_fn fn = p->fn;
        void *ctx = p->ctx;
        int n = p->n;
        pthread_mutex_unlock(&p->mu);
        work(p, seen, fn, ctx, n);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int psw_pool_start(struct psw_pool **out)
{
    struct psw_pool *p = calloc(1, sizeof *p);
    if (p == NULL)
        return -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    int rc = pthread_create(&p->thread, NULL, helper_main, p);
    if (rc != 0) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p);
        errno = rc;
        return -1;
    }
    pthread_setname_np(p->thread, "psworker-help");
    *out = p;
    return 0;
}

int psw_pool_run(struct psw_pool *p, psw_piece_fn fn, void *ctx, int n)
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
    uint32_t gen = ++p->gen;
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

void psw_pool_stop(struct psw_pool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
