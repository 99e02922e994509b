/* CPU backend against naive double-precision loops, plus the shared
 * per-element math (psk_math.h) that the CUDA kernels compile too. */
#include "psk.h"
#include "psk_math.h"
#include "psk_select.h"

#include "ps_err.h"
#include "ps_half.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void naive_gemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                       const float *b, int ldb, float beta, float *c, int ldc)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                double x = ta ? a[p * lda + i] : a[i * lda + p];
                double y = tb ? b[j * ldb + p] : b[p * ldb + j];
                s += x * y;
            }
            c[i * ldc + j] = (float)(alpha * s + beta * c[i * ldc + j]);
        }
}

static void test_gemm(void **state)
{
    (void)state;
    struct psk_backend *b = NULL;
    char err[256];
    assert_int_equal(psk_open("cpu", &b, err, sizeof err), 0);
    assert_int_equal(psk_kind_of(b), PSK_CPU);
    const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {64, 10, 256}, {0, 4, 4}};
    uint64_t seed = 1;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        for (int ta = 0; ta < 2; ta++) {
            for (int tb = 0; tb < 2; tb++) {
                int m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
                size_t asz = (size_t)m * k + 1, bsz = (size_t)k * n + 1, csz = (size_t)m * n + 1;
                float *A = malloc(asz * 4), *B = malloc(bsz * 4), *C = malloc(csz * 4),
                      *R = malloc(csz * 4);
                for (size_t i = 0; i < asz; i++)
                    A[i] = frand(&seed);
                for (size_t i = 0; i < bsz; i++)
                    B[i] = frand(&seed);
                for (size_t i = 0; i < csz; i++)
                    C[i] = R[i] = frand(&seed);
                int lda = ta ? m : k, ldb = tb ? k : n;
                assert_int_equal(psk_gemm(b, ta, tb, m, n, k, 0.5f, A, lda > 0 ? lda : 1, B,
                                          ldb > 0 ? ldb : 1, 0.25f, C, n > 0 ? n : 1),
                                 0);
                naive_gemm(ta, tb, m, n, k, 0.5f, A, lda, B, ldb, 0.25f, R, n);
                for (int i = 0; i < m * n; i++)
                    assert_float_equal(C[i], R[i], 1e-4 * (1 + k));
                free(A);
                free(B);
                free(C);
                free(R);
            }
        }
    }
    psk_close(b);
}

static void test_axpy_scale(void **state)
{
    (void)state;
    struct psk_backend *b = NULL;
    char err[256];
    assert_int_equal(psk_open("auto", &b, err, sizeof err), 0); /* CPU here */
    size_t n = 1001;
    float *x = NULL, *y = NULL;
    assert_int_equal(psk_alloc(b, n * 4, (void **)&x), 0);
    assert_int_equal(psk_alloc(b, n * 4, (void **)&y), 0);
    float hx[1001], hy[1001], out[1001];
    uint64_t seed = 5;
    for (size_t i = 0; i < n; i++) {
        hx[i] = frand(&seed);
        hy[i] = frand(&seed);
    }
    assert_int_equal(psk_upload(b, x, hx, n * 4), 0);
    assert_int_equal(psk_upload(b, y, hy, n * 4), 0);
    assert_int_equal(psk_copy(b, y, x, n * 4), 0);
    assert_int_equal(psk_download(b, out, y, n * 4), 0);
    assert_memory_equal(out, hx, n * 4);
    assert_int_equal(psk_upload(b, y, hy, n * 4), 0);
    assert_int_equal(psk_axpy(b, n, 2.0f, x, y), 0);
    assert_int_equal(psk_scale(b, n, -0.5f, y), 0);
    assert_int_equal(psk_download(b, out, y, n * 4), 0);
    for (size_t i = 0; i < n; i++)
        assert_true(out[i] == (2.0f * hx[i] + hy[i]) * -0.5f);
    psk_free(b, x);
    psk_free(b, y);
    psk_close(b);
}

static void test_open_errors(void **state)
{
    (void)state;
    struct psk_backend *b = NULL;
    char err[256];
    assert_int_equal(psk_open("tpu", &b, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "'tpu'"));
    assert_int_equal(psk_open("cuda:x", &b, err, sizeof err), PS_EINVAL);
    assert_null(b);
    /* No GPU on this machine: asking for CUDA explicitly fails clearly. */
    if (psk_open("cuda", &b, err, sizeof err) == 0) {
        psk_close(b); /* a GPU machine: nothing to check here */
        return;
    }
    assert_true(strlen(err) > 0);
    assert_null(b);
}

static void test_layer_ops_cpu(void **state)
{
    (void)state;
    struct psk_backend *b = NULL;
    char err[256];
    assert_int_equal(psk_open("cpu", &b, err, sizeof err), 0);
    enum { R = 5, C = 4 };
    float x[R * C], y[R * C], d[R * C], loss[R], cs[C];
    const float bias[C] = {0.5f, -1.0f, 0.0f, 2.0f};
    int lab[R] = {0, 3, 2, 1, 7 /* out of range: no gradient */}, pred[R];
    uint64_t seed = 3;
    for (int i = 0; i < R * C; i++)
        x[i] = y[i] = 3.0f * frand(&seed);
    assert_int_equal(psk_bias_add(b, R, C, bias, y), 0);
    for (int i = 0; i < R * C; i++)
        assert_true(y[i] == x[i] + bias[i % C]);
    assert_int_equal(psk_relu(b, R * C, y, y), 0);
    for (int i = 0; i < R * C; i++)
        assert_true(y[i] == (x[i] + bias[i % C] > 0 ? x[i] + bias[i % C] : 0.0f));
    assert_int_equal(psk_softmax_xent(b, R, C, x, lab, 0.5f, d, loss, pred), 0);
    for (int r = 0; r < R; r++) {
        double m = -1e30, s = 0;
        int arg = 0;
        for (int c = 0; c < C; c++)
            if (x[r * C + c] > m) {
                m = x[r * C + c];
                arg = c;
            }
        for (int c = 0; c < C; c++)
            s += exp(x[r * C + c] - m);
        assert_int_equal(pred[r], arg);
        if (r == R - 1) {
            assert_true(loss[r] == 0.0f);
            for (int c = 0; c < C; c++)
                assert_true(d[r * C + c] == 0.0f);
            continue;
        }
        assert_float_equal(loss[r], log(s) + m - x[r * C + lab[r]], 1e-5);
        for (int c = 0; c < C; c++) {
            double p = exp(x[r * C + c] - m) / s;
            assert_float_equal(d[r * C + c], (p - (c == lab[r])) * 0.5, 1e-6);
        }
    }
    assert_int_equal(psk_col_sum(b, R, C, x, cs), 0);
    for (int c = 0; c < C; c++) {
        double s = 0;
        for (int r = 0; r < R; r++)
            s += x[r * C + c];
        assert_float_equal(cs[c], s, 1e-5);
    }
    memcpy(d, x, sizeof d);
    assert_int_equal(psk_relu_backward(b, R * C, y, d), 0);
    for (int i = 0; i < R * C; i++)
        assert_true(d[i] == (y[i] > 0 ? x[i] : 0.0f));
    psk_close(b);
}

static int cmp_desc_abs(const void *a, const void *b)
{
    float x = fabsf(*(const float *)a), y = fabsf(*(const float *)b);
    return (x < y) - (x > y);
}

static void test_topk_cpu(void **state)
{
    (void)state;
    struct psk_backend *b = NULL;
    char err[256];
    assert_int_equal(psk_open("cpu", &b, err, sizeof err), 0);
    enum { N = 1000 };
    static float v[N], u[N], ref[N], val[N];
    static uint64_t idx[N];
    uint64_t seed = 9;
    const size_t ks[] = {1, 7, 10, 500, N};
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
        size_t k = ks[t];
        for (int i = 0; i < N; i++) {
            /* coarse values: many ties at every magnitude */
            v[i] = (float)((int)(frand(&seed) * 20)) / 4.0f;
            u[i] = 1.0f;
            ref[i] = v[i];
        }
        float orig[N];
        memcpy(orig, v, sizeof orig);
        qsort(ref, N, sizeof *ref, cmp_desc_abs);
        float thr = fabsf(ref[k - 1]);
        assert_int_equal(psk_topk(b, N, v, u, k, idx, val), 0);
        for (size_t j = 0; j < k; j++) {
            assert_true(j == 0 || idx[j] > idx[j - 1]); /* increasing indices */
            assert_true(val[j] == orig[idx[j]]);
            assert_true(fabsf(val[j]) >= thr);
            assert_true(v[idx[j]] == 0.0f && u[idx[j]] == 0.0f);
        }
        size_t zeroed = 0;
        for (int i = 0; i < N; i++) {
            zeroed += u[i] == 0.0f;
            if (u[i] != 0.0f) /* not taken: unchanged and not above the threshold */
                assert_true(v[i] == orig[i] && fabsf(orig[i]) <= thr);
        }
        assert_int_equal(zeroed, k);
    }
    assert_int_equal(psk_topk(b, 4, v, NULL, 5, idx, val), PS_EINVAL);
    assert_int_equal(psk_topk(b, 4, v, NULL, 0, idx, val), 0);
    psk_close(b);
}

/* The selection as it was before sampling, spelled out: the k-th
 * magnitude by sorting, then in index order every entry above it and the
 * ties at it until k are taken. */
static void topk_reference(size_t n, float *v, float *u, size_t k, uint64_t *idx, float *val)
{
    float *m = malloc(n * sizeof *m);
    assert_non_null(m);
    for (size_t i = 0; i < n; i++)
        m[i] = fabsf(v[i]);
    qsort(m, n, sizeof *m, cmp_desc_abs);
    float thr = m[k - 1];
    free(m);
    size_t above = 0, got = 0;
    for (size_t i = 0; i < n; i++)
        above += fabsf(v[i]) > thr;
    size_t ties = k - above;
    for (size_t i = 0; i < n && got < k; i++) {
        float a = fabsf(v[i]);
        if (a > thr || (a == thr && ties > 0 && ties--)) {
            idx[got] = i;
            val[got++] = v[i];
            v[i] = 0.0f;
            if (u != NULL)
                u[i] = 0.0f;
        }
    }
}

/* The sampled selection and its exact fallback against the reference,
 * bit for bit (indices, values, and what is left in v and u), on inputs
 * that take the sampled path and on inputs that must fall back. */
static void test_topk_sampled_is_exact(void **state)
{
    (void)state;
    enum { N = 200003 };
    float *v0 = malloc(N * sizeof(float)), *v[3], *u[3], *val[3];
    uint64_t *idx[3];
    for (int j = 0; j < 3; j++) {
        v[j] = malloc(N * sizeof(float));
        u[j] = malloc(N * sizeof(float));
        val[j] = malloc(N * sizeof(float));
        idx[j] = malloc(N * sizeof(uint64_t));
        assert_true(v[j] && u[j] && val[j] && idx[j]);
    }
    assert_non_null(v0);
    /* kind: 0 smooth, 1 cubed (heavy tails), 2 a period of 784 (a
     * matrix's rows, one hot column), 3 coarse (ties everywhere), 4
     * mostly zeros, 5 all equal */
    const struct {
        int kind;
        size_t n, k;
        int fallback; /* the path each must take: -1 either */
    } cases[] = {
        {0, N, N / 100, 0}, {1, N, N / 100, 0},     {2, N, N / 100, 0},   {0, N, N / 500, 0},
        {0, N, 1, -1},      {0, N, N / 10, -1},     {0, N, N / 1000, -1}, {3, N, N / 100, 1},
        {4, N, N / 100, 1}, {5, N, N / 100, 1},     {0, 4000, 1000, 1},   {0, 1000, 7, 1},
        {0, N, N, 1},       {1, 100000, 30000, -1},
    };
    uint64_t seed = 17;
    int paths[3] = {0, 0, 0};
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        size_t n = cases[t].n, k = cases[t].k;
        for (size_t i = 0; i < n; i++) {
            float g = frand(&seed) - 0.5f;
            switch (cases[t].kind) {
            case 1:
                v0[i] = g * g * g;
                break;
            case 2:
                v0[i] = i % 784 == 3 ? 4.0f * g : g;
                break;
            case 3:
                v0[i] = (float)((int)(g * 4)) / 2.0f;
                break;
            case 4:
                v0[i] = i % 97 == 0 ? g : 0.0f;
                break;
            case 5:
                v0[i] = 0.25f;
                break;
            default:
                v0[i] = g;
                break;
            }
        }
        for (int j = 0; j < 3; j++) {
            memcpy(v[j], v0, n * sizeof(float));
            for (size_t i = 0; i < n; i++)
                u[j][i] = 1.0f + (float)i;
        }
        topk_reference(n, v[0], u[0], k, idx[0], val[0]);
        assert_int_equal(psk_topk_exact(n, v[1], u[1], k, idx[1], val[1]), 0);
        int path = -1;
        assert_int_equal(psk_topk_sampled(n, v[2], u[2], k, idx[2], val[2], &path), 0);
        int exact = path == PSK_TOPK_PATH_EXACT;
        if (cases[t].fallback >= 0 && exact != cases[t].fallback)
            fail_msg("case %zu: the %s path was taken", t, exact ? "exact" : "sampled");
        paths[path]++;
        for (int j = 1; j < 3; j++) {
            assert_memory_equal(idx[j], idx[0], k * sizeof(uint64_t));
            assert_memory_equal(val[j], val[0], k * sizeof(float));
            assert_memory_equal(v[j], v[0], n * sizeof(float));
            assert_memory_equal(u[j], u[0], n * sizeof(float));
        }
    }
    /* a threshold that missed (fewer than k at or above it) is tried once
     * more, lower: many small draws, so that some take that path */
    for (int t = 0; t < 300; t++) {
        size_t n = 20000, k = 200;
        for (size_t i = 0; i < n; i++)
            v0[i] = frand(&seed) - 0.5f;
        for (int j = 0; j < 3; j++) {
            memcpy(v[j], v0, n * sizeof(float));
            for (size_t i = 0; i < n; i++)
                u[j][i] = (float)i;
        }
        topk_reference(n, v[0], u[0], k, idx[0], val[0]);
        int path = -1;
        assert_int_equal(psk_topk_sampled(n, v[2], u[2], k, idx[2], val[2], &path), 0);
        assert_true(path >= 0 && path <= 2);
        paths[path]++;
        assert_memory_equal(idx[2], idx[0], k * sizeof(uint64_t));
        assert_memory_equal(val[2], val[0], k * sizeof(float));
        assert_memory_equal(v[2], v[0], n * sizeof(float));
        assert_memory_equal(u[2], u[0], n * sizeof(float));
    }
    /* every path was checked */
    assert_true(paths[PSK_TOPK_PATH_SAMPLED] >= 4 && paths[PSK_TOPK_PATH_EXACT] >= 4 &&
                paths[PSK_TOPK_PATH_RETRIED] >= 1);
    for (int j = 0; j < 3; j++) {
        free(v[j]);
        free(u[j]);
        free(val[j]);
        free(idx[j]);
    }
    free(v0);
}

/* The error feedback's update fused with the selection against the
 * backend's passes (psk_scale, psk_axpy) and then psk_topk, bit for bit:
 * with and without momentum, on sizes that take the fused pass, one not
 * a whole number of blocks, and one selected exactly. */
static void test_topk_accum(void **state)
{
    (void)state;
    struct psk_backend *b = NULL;
    char err[256];
    assert_int_equal(psk_open("cpu", &b, err, sizeof err), 0);
    const size_t sizes[][2] = {{200000, 2000}, {65543, 655}, {1000, 7}};
    uint64_t seed = 23;
    for (size_t t = 0; t < 3; t++)
        for (int with_u = 0; with_u < 2; with_u++) {
            size_t n = sizes[t][0], k = sizes[t][1];
            float *g = malloc(n * sizeof *g), *v[2], *u[2], *val[2];
            uint64_t *idx[2];
            assert_non_null(g);
            for (int j = 0; j < 2; j++) {
                v[j] = malloc(n * sizeof(float));
                u[j] = malloc(n * sizeof(float));
                val[j] = malloc(k * sizeof(float));
                idx[j] = malloc(k * sizeof(uint64_t));
                assert_true(v[j] && u[j] && val[j] && idx[j]);
            }
            for (size_t i = 0; i < n; i++) {
                g[i] = frand(&seed) - 0.5f;
                v[0][i] = v[1][i] = 0.3f * (frand(&seed) - 0.5f);
                u[0][i] = u[1][i] = frand(&seed) - 0.5f;
            }
            float *u0 = with_u ? u[0] : NULL, *u1 = with_u ? u[1] : NULL;
            for (int step = 0; step < 3; step++) { /* the residual carries over */
                if (u0 != NULL) {
                    assert_int_equal(psk_scale(b, n, 0.9f, u0), 0);
                    assert_int_equal(psk_axpy(b, n, 1.0f, g, u0), 0);
                }
                assert_int_equal(psk_axpy(b, n, 1.0f, u0 != NULL ? u0 : g, v[0]), 0);
                assert_int_equal(psk_topk(b, n, v[0], u0, k, idx[0], val[0]), 0);
                assert_int_equal(psk_topk_accum(b, n, g, 0.9f, u1, v[1], k, idx[1], val[1]), 0);
                assert_memory_equal(idx[1], idx[0], k * sizeof(uint64_t));
                assert_memory_equal(val[1], val[0], k * sizeof(float));
                assert_memory_equal(v[1], v[0], n * sizeof(float));
                assert_memory_equal(u[1], u[0], n * sizeof(float));
            }
            free(g);
            for (int j = 0; j < 2; j++) {
                free(v[j]);
                free(u[j]);
                free(val[j]);
                free(idx[j]);
            }
        }
    float one = 1.0f, zero = 0.0f;
    uint64_t i0;
    assert_int_equal(psk_topk_accum(b, 1, &one, 0.9f, NULL, &zero, 2, &i0, &one), PS_EINVAL);
    psk_close(b);
}

static void test_shared_math(void **state)
{
    (void)state;
    assert_true(psk_el_relu(-1.0f) == 0.0f && psk_el_relu(2.0f) == 2.0f);
    assert_true(psk_el_relu_grad(0.0f, 3.0f) == 0.0f && psk_el_relu_grad(0.1f, 3.0f) == 3.0f);
    float v = 0.0f;
    assert_float_equal(psk_momentum(1.0f, 0.5f, &v, 0.1f, 0.9f, 0), 0.95f, 1e-7);
    assert_true(v == 0.5f);
    assert_true(psk_decay(1.0f, 2.0f, 0.5f) == 2.0f);
}

/* Equal as bits, or both NaN. */
static int same_float(float a, float b)
{
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y || (isnan(a) && isnan(b));
}

/* The compute rounding (psk_math.h) against the wire's conversions
 * (ps_half.c, written apart from it): every 4099th bit pattern, so each
 * exponent and both signs, and the patterns next to f16's edges. Then the
 * CPU backend's loop (vectorised) against the scalar function, and the
 * count of non-finite values. */
static void test_rounding(void **state)
{
    (void)state;
    const uint32_t edges[] = {0x38800000u, 0x477fe000u, 0x477ff000u, 0x7f800000u, 0x33000000u};
    for (uint64_t i = 0; i <= UINT32_MAX; i += 4099) {
        for (int e = -1; e < 5; e++)
            for (uint32_t d = 0; d < (e < 0 ? 1u : 3u); d++) {
                uint32_t u = e < 0 ? (uint32_t)i : edges[e] - 1u + d + ((uint32_t)i & 0x80000000u);
                float x;
                memcpy(&x, &u, 4);
                if (!same_float(psk_round_f16(x), ps_f16_to_f32(ps_f32_to_f16(x))) ||
                    !same_float(psk_round_bf16(x), ps_bf16_to_f32(ps_f32_to_bf16(x))))
                    fail_msg("bit pattern 0x%08x rounds unlike the wire's conversion", u);
            }
    }
    struct psk_backend *b;
    char err[128];
    assert_int_equal(psk_open("cpu", &b, err, sizeof err), 0);
    enum { N = 1031 };
    float *x = malloc(N * 4), *y = malloc(N * 4);
    uint64_t seed = 5, count = 0;
    for (int p = PSK_PREC_BF16; p <= PSK_PREC_F16; p++) {
        for (int i = 0; i < N; i++)
            x[i] = y[i] = frand(&seed) * ldexpf(1.0f, i % 40) * 1e-6f;
        x[7] = y[7] = INFINITY;
        x[N - 1] = y[N - 1] = NAN;
        assert_int_equal(psk_round(b, p, N, y), 0);
        uint64_t want = 0;
        for (int i = 0; i < N; i++) {
            assert_true(same_float(y[i], psk_round16(p, x[i])));
            want += !isfinite(y[i]);
        }
        assert_int_equal(psk_count_nonfinite(b, N, y, &count), 0);
        assert_int_equal(count, want);
        assert_true(want >= (p == PSK_PREC_F16 ? 3u : 2u)); /* f16 overflowed some */
    }
    assert_int_equal(psk_round(b, PSK_PREC_F32, N, y), 0); /* f32: nothing to do */
    assert_int_equal(psk_precision_parse("bf16"), PSK_PREC_BF16);
    assert_int_equal(psk_precision_parse("fp16"), -1);
    free(x);
    free(y);
    psk_close(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm),        cmocka_unit_test(test_axpy_scale),
        cmocka_unit_test(test_open_errors), cmocka_unit_test(test_layer_ops_cpu),
        cmocka_unit_test(test_topk_cpu),    cmocka_unit_test(test_topk_sampled_is_exact),
        cmocka_unit_test(test_topk_accum),  cmocka_unit_test(test_shared_math),
        cmocka_unit_test(test_rounding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
