/* A helper thread that takes pieces of one thread's work: psworker's big
 * GEMMs (--compute-threads), psd's big applies (--apply-threads).
 *
 * ps_pool_run(p, fn, ctx, n) runs fn(ctx, i) for every i in [0, n) on the
 * calling thread and the helper together: each takes the next piece not
 * yet taken until none is left, and the call returns when all are done.
 * Which thread runs a piece changes from run to run; what a piece computes
 * must not depend on it (the model's GEMMs and psd's applies are cut into
 * fixed pieces, so results are the same bits whoever computes them). When
 * the helper is busy elsewhere (its core is psd's too), the calling thread
 * simply takes more pieces: nothing waits for a thread that is not
 * running, unlike a BLAS split into fixed halves. */
#ifndef PS_POOL_H
#define PS_POOL_H

struct ps_pool;

/* fn returns 0 or an error code; the first error is what run returns. */
typedef int (*ps_piece_fn)(void *ctx, int i);

/* After a run the helper looks for the next one for this long before it
 * sleeps (tests/bench/HISTORY.md, "The helper looks for the next
 * product before it sleeps"). */
#define PS_POOL_SPIN_NS 30000L

/* Starts the helper (it runs where the calling thread may); spin_ns: how
 * long it looks for the next run, yielding its core each time, before it
 * sleeps until woken (0: it sleeps at once); name: the thread's name (at
 * most 15 characters, as top shows it). 0, or -1 with errno. */
int ps_pool_start(struct ps_pool **out, long spin_ns, const char *name);
/* p NULL: the calling thread runs the pieces in order. */
int ps_pool_run(struct ps_pool *p, ps_piece_fn fn, void *ctx, int n);
/* How many pieces the helper has run (0 for NULL). */
unsigned long ps_pool_helped(struct ps_pool *p);
/* How many times the helper went to sleep waiting for a run. */
unsigned long ps_pool_sleeps(struct ps_pool *p);
/* Stops and joins the helper; NULL is fine. */
void ps_pool_stop(struct ps_pool *p);

#endif
