/* worker/pool.c and the MLP's GEMM pieces: every piece runs exactly once
 * and errors come back; a model trained with a helper thread gets the same
 * bits as without one, and both agree with a plain double-precision
 * forward and backward pass. */
#include "mlp.h"
#include "ps_pool.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "psk.h"

#include <math.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define PIECES_MAX 1000

struct count {
    atomic_int hits[PIECES_MAX];
    int fail_at;
};

static int count_piece(void *ctx, int i)
{
    struct count *c = ctx;
    atomic_fetch_add(&c->hits[i], 1);
    return i == c->fail_at ? PS_EDEVICE : 0;
}

/* With a helper that sleeps at once, one that looks for the next run for
 * a while (the default), and one that never stops looking. */
static void every_piece_once(long spin_ns)
{
    struct ps_pool *p = NULL;
    assert_int_equal(ps_pool_start(&p, spin_ns, "test-pool"), 0);
    static struct count c;
    const int sizes[] = {1, 2, 7, 64, PIECES_MAX};
    for (int round = 0; round < 50; round++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            memset(&c, 0, sizeof c);
            c.fail_at = -1;
            assert_int_equal(ps_pool_run(round % 2 ? p : NULL, count_piece, &c, sizes[s]), 0);
            for (int i = 0; i < PIECES_MAX; i++)
                assert_int_equal(atomic_load(&c.hits[i]), i < sizes[s]);
        }
    }
    memset(&c, 0, sizeof c);
    c.fail_at = 5;
    assert_int_equal(ps_pool_run(p, count_piece, &c, 64), PS_EDEVICE);
    for (int i = 0; i < 64; i++) /* the others ran all the same */
        assert_int_equal(atomic_load(&c.hits[i]), 1);
    assert_int_equal(ps_pool_run(p, count_piece, &c, 0), 0);
    ps_pool_stop(p);
    ps_pool_stop(NULL);
}

#define SPIN_FOREVER (3600L * 1000000000L)

static void test_every_piece_once(void **state)
{
    (void)state;
    every_piece_once(0);
    every_piece_once(PS_POOL_SPIN_NS);
    every_piece_once(SPIN_FOREVER);
}

struct meet {
    atomic_int started;
};

/* Waits (10 s at most) until the other piece has started too. */
static int meet_piece(void *ctx, int i)
{
    (void)i;
    struct meet *m = ctx;
    atomic_fetch_add(&m->started, 1);
    long long deadline = ps_mono_ms() + 10000;
    while (atomic_load(&m->started) < 2 && ps_mono_ms() < deadline)
        sched_yield();
    return 0;
}

/* A helper that looks for the next run before it sleeps joins runs that
 * follow each other without being woken; one that does not look sleeps
 * after each run. Stopping a helper that is looking does not wait for the
 * look to end. */
static void test_helper_looks_before_it_sleeps(void **state)
{
    (void)state;
    static struct count c;
    struct ps_pool *p = NULL;
    assert_int_equal(ps_pool_start(&p, SPIN_FOREVER, "test-pool"), 0);
    for (int run = 0; run < 2000; run++) {
        memset(&c, 0, sizeof c);
        c.fail_at = -1;
        assert_int_equal(ps_pool_run(p, count_piece, &c, 64), 0);
    }
    assert_int_equal(ps_pool_sleeps(p), 0);
    /* a run of two pieces that each wait for the other: the helper took
     * one, so it looks for a run after this one when stop comes */
    static struct meet m;
    atomic_store(&m.started, 0);
    assert_int_equal(ps_pool_run(p, meet_piece, &m, 2), 0);
    assert_int_equal(atomic_load(&m.started), 2);
    ps_pool_stop(p); /* returns: the helper sees stop while it looks */

    assert_int_equal(ps_pool_start(&p, 0, "test-pool"), 0);
    long long deadline = ps_mono_ms() + 10000; /* its first sleep, before any run */
    while (ps_pool_sleeps(p) < 1 && ps_mono_ms() < deadline)
        sched_yield();
    for (unsigned long run = 0; run < 5; run++) {
        memset(&c, 0, sizeof c);
        c.fail_at = -1;
        assert_int_equal(ps_pool_run(p, count_piece, &c, 64), 0);
        /* it sleeps after each run (and did once before the first) */
        deadline = ps_mono_ms() + 10000;
        while (ps_pool_sleeps(p) < run + 2 && ps_mono_ms() < deadline)
            sched_yield();
        assert_true(ps_pool_sleeps(p) >= run + 2);
    }
    ps_pool_stop(p);
}

enum { B = 37, L = 3 };
static const int dims[L + 1] = {301, 203, 70, 10};

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffff) / 65536.0f - 0.5f;
}

/* The chunks a chunked pass reported: (layer, first row, end row). */
struct chunks {
    int n;
    int at[256][3];
};

static int note_chunk(void *arg, int l, int r0, int r1)
{
    struct chunks *c = arg;
    if (c->n < 256) {
        c->at[c->n][0] = l;
        c->at[c->n][1] = r0;
        c->at[c->n][2] = r1;
    }
    c->n++;
    return 0;
}

/* Forward, loss and backward of one batch; the logits and every gradient
 * copied out (flat, in table order). chunk_bytes > 0: in chunks of about
 * that size, forward and backward reporting them to *seen (backward's
 * after forward's). */
static size_t run_chunked(struct ps_pool *pool, float *out, size_t chunk_bytes, struct chunks *seen)
{
    struct psk_backend *be;
    char err[256];
    assert_int_equal(psk_open("cpu", &be, err, sizeof err), 0);
    struct psw_mlp m;
    assert_int_equal(psw_mlp_init(&m, be, dims, L, B, err, sizeof err), 0);
    psw_mlp_set_pool(&m, pool);
    uint64_t seed = 42;
    for (int k = 0; k < 2 * L; k++) {
        float *w = psw_mlp_param(&m, k);
        for (uint64_t i = 0; i < psw_mlp_table_size(&m, k); i++)
            w[i] = frand(&seed) * 0.2f;
    }
    for (int i = 0; i < B * dims[0]; i++)
        m.act[0][i] = frand(&seed);
    int labels[B];
    for (int r = 0; r < B; r++)
        labels[r] = r % dims[L];
    double loss;
    int ok;
    if (chunk_bytes > 0) {
        psw_mlp_set_chunk_bytes(&m, chunk_bytes);
        assert_int_equal(psw_mlp_forward_ready(&m, B, note_chunk, seen), 0);
    } else {
        assert_int_equal(psw_mlp_forward(&m, B), 0);
    }
    assert_int_equal(psw_mlp_loss(&m, B, labels, &loss, &ok), 0);
    assert_int_equal(psw_mlp_backward(&m, B, chunk_bytes > 0 ? note_chunk : NULL, seen), 0);
    size_t n = 0;
    memcpy(out, m.act[L], (size_t)B * dims[L] * sizeof(float));
    n += (size_t)B * dims[L];
    for (int k = 0; k < 2 * L; k++) {
        size_t e = (size_t)psw_mlp_table_size(&m, k);
        memcpy(out + n, psw_mlp_grad(&m, k), e * sizeof(float));
        n += e;
    }
    psw_mlp_fini(&m);
    psk_close(be);
    return n;
}

/* Floats run_chunked writes: the logits and every gradient. */
static size_t out_floats(void)
{
    size_t n = (size_t)B * dims[L];
    for (int l = 0; l < L; l++)
        n += (size_t)dims[l + 1] * dims[l] + (size_t)dims[l + 1];
    return n;
}

static size_t run_model(struct ps_pool *pool, float *out)
{
    return run_chunked(pool, out, 0, NULL);
}

/* The same model in double precision, plainly: logits and the first two
 * weight gradients, into the layout run_model writes. */
static void reference(double *out, size_t *gw0_at, size_t *gw1_at)
{
    uint64_t seed = 42;
    double *w[L], *b[L], *a[L + 1], *z[L + 1], *dz[L + 1];
    for (int l = 0; l < L; l++) {
        w[l] = malloc((size_t)dims[l + 1] * dims[l] * sizeof(double));
        b[l] = malloc((size_t)dims[l + 1] * sizeof(double));
        for (int i = 0; i < dims[l + 1] * dims[l]; i++)
            w[l][i] = frand(&seed) * 0.2f;
        for (int i = 0; i < dims[l + 1]; i++)
            b[l][i] = frand(&seed) * 0.2f;
    }
    for (int l = 0; l <= L; l++) {
        a[l] = calloc((size_t)B * dims[l], sizeof(double));
        z[l] = calloc((size_t)B * dims[l], sizeof(double));
        dz[l] = calloc((size_t)B * dims[l], sizeof(double));
    }
    for (int i = 0; i < B * dims[0]; i++)
        a[0][i] = frand(&seed);
    for (int l = 0; l < L; l++)
        for (int r = 0; r < B; r++)
            for (int j = 0; j < dims[l + 1]; j++) {
                double s = b[l][j];
                for (int i = 0; i < dims[l]; i++)
                    s += a[l][r * dims[l] + i] * w[l][j * dims[l] + i];
                z[l + 1][r * dims[l + 1] + j] = s;
                a[l + 1][r * dims[l + 1] + j] = l + 1 < L && s < 0 ? 0 : s;
            }
    int c = dims[L];
    for (int r = 0; r < B; r++) { /* softmax cross-entropy, mean over the batch */
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < c; j++)
            mx = fmax(mx, z[L][r * c + j]);
        for (int j = 0; j < c; j++)
            sum += exp(z[L][r * c + j] - mx);
        for (int j = 0; j < c; j++)
            dz[L][r * c + j] = (exp(z[L][r * c + j] - mx) / sum - (j == r % c)) / B;
    }
    for (int l = L - 1; l >= 1; l--) /* dz of layers L-1 .. 1 */
        for (int r = 0; r < B; r++)
            for (int i = 0; i < dims[l]; i++) {
                double s = 0;
                for (int j = 0; j < dims[l + 1]; j++)
                    s += dz[l + 1][r * dims[l + 1] + j] * w[l][j * dims[l] + i];
                dz[l][r * dims[l] + i] = z[l][r * dims[l] + i] > 0 ? s : 0;
            }
    memcpy(out, z[L], (size_t)B * c * sizeof(double));
    size_t at = (size_t)B * c;
    for (int l = 0; l < 2; l++) { /* gW[l] = dz[l+1]^T a[l] */
        *(l == 0 ? gw0_at : gw1_at) = at;
        for (int j = 0; j < dims[l + 1]; j++)
            for (int i = 0; i < dims[l]; i++) {
                double s = 0;
                for (int r = 0; r < B; r++)
                    s += dz[l + 1][r * dims[l + 1] + j] * a[l][r * dims[l] + i];
                out[at + (size_t)j * dims[l] + i] = s;
            }
        at += (size_t)dims[l + 1] * dims[l] + (size_t)dims[l + 1]; /* and the bias */
    }
    for (int l = 0; l <= L; l++) {
        free(a[l]);
        free(z[l]);
        free(dz[l]);
    }
    for (int l = 0; l < L; l++) {
        free(w[l]);
        free(b[l]);
    }
}

static void test_model_same_bits_with_a_helper(void **state)
{
    (void)state;
    size_t cap = out_floats();
    float *alone = malloc(cap * sizeof(float)), *helped = malloc(cap * sizeof(float));
    double *ref = calloc(cap, sizeof(double));
    struct ps_pool *p = NULL;
    assert_int_equal(ps_pool_start(&p, PS_POOL_SPIN_NS, "test-pool"), 0);
    size_t n = run_model(NULL, alone);
    assert_int_equal(n, cap);
    for (int round = 0; round < 5; round++) {
        assert_int_equal(run_model(p, helped), cap);
        assert_memory_equal(alone, helped, cap * sizeof(float));
    }
    ps_pool_stop(p);
    size_t gw0, gw1;
    reference(ref, &gw0, &gw1);
    /* the logits and the two weight gradients cut into pieces */
    size_t spans[3][2] = {{0, (size_t)B * dims[L]},
                          {gw0, gw0 + (size_t)dims[1] * dims[0]},
                          {gw1, gw1 + (size_t)dims[2] * dims[1]}};
    for (int s = 0; s < 3; s++) {
        double big = 1e-6;
        for (size_t i = spans[s][0]; i < spans[s][1]; i++)
            big = fmax(big, fabs(ref[i]));
        for (size_t i = spans[s][0]; i < spans[s][1]; i++)
            if (fabs(alone[i] - ref[i]) > 1e-4 * big)
                fail_msg("span %d element %zu: %.9g, the reference %.9g", s, i - spans[s][0],
                         (double)alone[i], ref[i]);
    }
    free(alone);
    free(helped);
    free(ref);
}

/* Backward's chunks of layer l in *c: in order from row 0 to the last,
 * whole pieces except the last; returns how many. */
static int backward_chunks(const struct chunks *c, int l)
{
    int n = 0, next = 0;
    for (int i = 0; i < c->n && i < 256; i++) {
        if (c->at[i][0] != l || c->at[i][1] == c->at[i][2])
            continue; /* another layer, or forward's bias */
        if (next == dims[l + 1])
            next = 0; /* forward's chunks, then backward's */
        assert_int_equal(c->at[i][1], next);
        int rows = c->at[i][2] - c->at[i][1];
        assert_true(rows > 0);
        if (c->at[i][2] != dims[l + 1])
            assert_int_equal(rows % PSW_PIECE_ROWS, 0);
        next = c->at[i][2];
        n++;
    }
    assert_int_equal(next, dims[l + 1]);
    return n / 2; /* forward's and backward's are the same */
}

/* psworker sends larger chunks through shared memory: the chunk size
 * changes how a pass is cut into chunks, never its results. */
static void test_chunk_size_same_bits(void **state)
{
    (void)state;
    size_t cap = out_floats();
    float *whole = malloc(cap * sizeof(float)), *cut = malloc(cap * sizeof(float));
    struct ps_pool *p = NULL;
    assert_int_equal(ps_pool_start(&p, PS_POOL_SPIN_NS, "test-pool"), 0);
    assert_int_equal(run_model(NULL, whole), cap);
    const size_t sizes[] = {4096, 16384, PSW_CHUNK_BYTES, PSW_CHUNK_BYTES_SHM};
    int before = 1 << 30;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (int helped = 0; helped < 2; helped++) {
            struct chunks seen = {0};
            assert_int_equal(run_chunked(helped ? p : NULL, cut, sizes[i], &seen), cap);
            assert_memory_equal(whole, cut, cap * sizeof(float));
            assert_true(seen.n <= 256);
            int n0 = backward_chunks(&seen, 0);
            for (int l = 1; l < L; l++)
                (void)backward_chunks(&seen, l);
            if (helped == 0) { /* smaller chunks, more of them; 244 KB is one */
                assert_true(n0 <= before);
                if (sizes[i] >= PSW_CHUNK_BYTES)
                    assert_int_equal(n0, 1);
                else
                    assert_true(n0 > 1);
                before = n0;
            }
        }
    }
    ps_pool_stop(p);
    free(whole);
    free(cut);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_piece_once),
        cmocka_unit_test(test_helper_looks_before_it_sleeps),
        cmocka_unit_test(test_model_same_bits_with_a_helper),
        cmocka_unit_test(test_chunk_size_same_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
