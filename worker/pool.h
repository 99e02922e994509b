/* A helper thread that takes pieces of the training thread's work.
 *
 * psw_pool_run(p, fn, ctx, n) runs fn(ctx, i) for every i in [0, n) on the
 * calling thread and the helper together: each takes the next piece not
 * yet taken until none is left, and the call returns when all are done.
 * Which thread runs a piece changes from run to run; what a piece computes
 * must not depend on it (the model's GEMMs are cut into fixed pieces, so
 * results are the same bits whoever computes them). When the helper is
 * busy elsewhere (its core is psd's too), the calling thread simply takes
 * more pieces: nothing waits for a thread that is not running, unlike a
 * BLAS split into fixed halves. */
#ifndef PSW_POOL_H
#define PSW_POOL_H

struct psw_pool;

/* fn returns 0 or an error code; the first error is what run returns. */
typedef int (*psw_piece_fn)(void *ctx, int i);

/* After a run the helper looks for the next one for this long before it
 * sleeps (tests/bench/README.md, 29.). */
#define PSW_POOL_SPIN_NS 30000L

/* Starts the helper (it runs where the calling thread may); spin_ns: how
 * long it looks for the next run, yielding its core each time, before it
 * sleeps until woken (0: it sleeps at once). 0, or -1 with errno. */
int psw_pool_start(struct psw_pool **out, long spin_ns);
/* p NULL: the calling thread runs the pieces in order. */
int psw_pool_run(struct psw_pool *p, psw_piece_fn fn, void *ctx, int n);
/* How many times the helper went to sleep waiting for a run. */
unsigned long psw_pool_sleeps(struct psw_pool *p);
/* Stops and joins the helper; NULL is fine. */
void psw_pool_stop(struct psw_pool *p);

#endif
