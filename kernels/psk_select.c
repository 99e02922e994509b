/* Top-k selection by magnitude (psk_select.h). */
#include "psk_select.h"

#include "ps_err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The k-th largest of a[0..n) (1-based k), rearranging a: Hoare's
 * quickselect, expected O(n), median-of-three pivots. */
static float kth_largest(float *a, size_t n, size_t k)
{
    size_t lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        float x = a[lo], y = a[mid], z = a[hi];
        float p = x > y ? (y > z ? y : (x > z ? z : x)) : (x > z ? x : (y > z ? z : y));
        size_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] > p)
                i++;
            while (a[j] < p)
                j--;
            if (i <= j) {
                float t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++;
                if (j == 0)
                    break;
                j--;
            }
        }
        if (want <= j)
            hi = j;
        else if (want >= i)
            lo = i;
        else
            break;
    }
    return a[want];
}

/* Takes the entries of pos[0..m) (indices into v, ascending) whose
 * magnitude is above thr, and ties at thr in index order until k are
 * taken: into idx and val, zeroed in v and u. */
static void take(const size_t *pos, size_t m, float thr, size_t above, float *v, float *u, size_t k,
                 uint64_t *idx, float *val)
{
    size_t ties = k - above, got = 0;
    for (size_t j = 0; j < m && got < k; j++) {
        size_t i = pos != NULL ? pos[j] : j;
        float a = fabsf(v[i]);
        if (a > thr || (a == thr && ties > 0)) {
            if (a == thr)
                ties--;
            idx[got] = i;
            val[got] = v[i];
            got++;
            v[i] = 0.0f;
            if (u != NULL)
                u[i] = 0.0f;
        }
    }
}

int psk_topk_exact(size_t n, float *v, float *u, size_t k, uint64_t *idx, float *val)
{
    float *mag = malloc(n * sizeof *mag);
    if (mag == NULL)
        return PS_ENOMEM;
    for (size_t i = 0; i < n; i++)
        mag[i] = fabsf(v[i]);
    float thr = kth_largest(mag, n, k);
    free(mag);
    size_t above = 0;
    for (size_t i = 0; i < n; i++)
        above += fabsf(v[i]) > thr;
    take(NULL, n, thr, above, v, u, k, idx, val);
    return 0;
}

/* A sample's position j of s over n: one entry of each stride, at an
 * offset a hash of j picks, so that a period in the data (a matrix's
 * rows) does not line up with the sample. */
static size_t sample_at(size_t j, size_t stride)
{
    uint64_t h = (uint64_t)j * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    return j * stride + (size_t)(h % stride);
}

/* The r-th largest of a[0..n) (1-based r, r <= SMALL_RANK), leaving a
 * as it is: a min-heap of the r largest seen, so that an entry below the
 * heap's least (nearly all of them) costs one comparison. The same value
 * kth_largest gives. */
#define SMALL_RANK 256
static float rth_largest_small(const float *a, size_t n, size_t r)
{
    float h[SMALL_RANK];
    for (size_t i = 0; i < r; i++) { /* sift up */
        size_t c = i;
        while (c > 0 && h[(c - 1) / 2] > a[i]) {
            h[c] = h[(c - 1) / 2];
            c = (c - 1) / 2;
        }
        h[c] = a[i];
    }
    for (size_t i = r; i < n; i++) {
        float x = a[i];
        if (!(x > h[0]))
            continue;
        size_t c = 0; /* sift x down from the root */
        for (;;) {
            size_t l = 2 * c + 1, m = l + 1 < r && h[l + 1] < h[l] ? l + 1 : l;
            if (l >= r || !(h[m] < x))
                break;
            h[c] = h[m];
            c = m;
        }
        h[c] = x;
    }
    return h[0];
}

/* The r-th largest of the sample mag[0..s), keeping its entries (in some
 * order). */
static float sample_rank(float *mag, size_t s, size_t r)
{
    r = r < 1 ? 1 : r > s ? s : r;
    return r <= SMALL_RANK ? rth_largest_small(mag, s, r) : kth_largest(mag, s, r);
}

/* Buckets of kth_above's histogram. */
#define HIST_BUCKETS 1024

static uint32_t f32_bits(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

/* The k-th largest of the magnitudes a[0..m) (1-based k), all at or above
 * lo, rearranging a, and into *above how many are larger than it.
 * Non-negative floats order as their bits do: one pass counts them in
 * HIST_BUCKETS buckets of equal width over [lo, the largest], the buckets
 * from the top say which holds the k-th, and a quickselect runs over that
 * bucket's entries only (a tenth of the candidates or fewer, where a
 * quickselect over all of them cost most of the selection's time). */
static float kth_above(float *a, size_t m, size_t k, float lo, size_t *above)
{
    uint32_t base = f32_bits(lo), top = base;
    for (size_t j = 0; j < m; j++) {
        uint32_t b = f32_bits(a[j]);
        top = b > top ? b : top;
    }
    unsigned shift = 0;
    while (((top - base) >> shift) >= HIST_BUCKETS)
        shift++;
    uint32_t count[HIST_BUCKETS] = {0};
    for (size_t j = 0; j < m; j++)
        count[(f32_bits(a[j]) - base) >> shift]++;
    size_t over = 0, bucket = (top - base) >> shift;
    while (over + count[bucket] < k)
        over += count[bucket--];
    size_t w = 0; /* the bucket's entries to the front */
    for (size_t j = 0; j < m; j++)
        if (((f32_bits(a[j]) - base) >> shift) == bucket)
            a[w++] = a[j];
    float thr = kth_largest(a, w, k - over);
    for (size_t j = 0; j < w; j++)
        over += a[j] > thr;
    *above = over;
    return thr;
}

/* Entries scanned at a time for candidates. */
#define SELECT_BLOCK 16

/* The positions i of v[0..n) with |v[i]| >= est, ascending, into pos:
 * their count, or a count past cap as soon as there are more (pos has
 * SELECT_BLOCK entries' room past cap). From i0 on, one at a time. */
static size_t scan_from(const float *v, size_t i0, size_t n, float est, size_t *pos, size_t m,
                        size_t cap)
{
    for (size_t i = i0; i < n && m <= cap; i++) {
        pos[m] = i;
        m += fabsf(v[i]) >= est;
    }
    return m;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* The bits of a block of 16 at or above est, one per entry: compilers do
 * not vectorise the comparison's reduction, so it is written in lanes,
 * SSE2 (the baseline) or AVX2 where the CPU has it, as ps_first_nonfinite
 * chooses. A block without candidates (most of them) costs its loads and
 * one branch; the positions of one with candidates come from its bits. */
#define SCAN_BLOCKS(bits_of)                                                                       \
    size_t m = 0, b = 0;                                                                           \
    for (; b + SELECT_BLOCK <= n && m <= cap; b += SELECT_BLOCK) {                                 \
        unsigned bits = bits_of;                                                                   \
        while (bits != 0) {                                                                        \
            pos[m++] = b + (size_t)__builtin_ctz(bits);                                            \
            bits &= bits - 1;                                                                      \
        }                                                                                          \
    }                                                                                              \
    return scan_from(v, b, n, est, pos, m, cap)

static inline unsigned block_bits_sse2(const float *x, __m128 t)
{
    const __m128 abs = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    unsigned bits = 0;
    for (int j = 0; j < 4; j++)
        bits |= (unsigned)_mm_movemask_ps(_mm_cmpge_ps(_mm_and_ps(_mm_loadu_ps(x + 4 * j), abs), t))
                << (4 * j);
    return bits;
}

static size_t scan_sse2(const float *v, size_t n, float est, size_t *pos, size_t cap)
{
    const __m128 t = _mm_set1_ps(est);
    SCAN_BLOCKS(block_bits_sse2(v + b, t));
}

__attribute__((target("avx2"))) static inline unsigned block_bits_avx2(const float *x, __m256 t)
{
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 lo = _mm256_and_ps(_mm256_loadu_ps(x), abs),
           hi = _mm256_and_ps(_mm256_loadu_ps(x + 8), abs);
    return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(lo, t, _CMP_GE_OQ)) |
           (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(hi, t, _CMP_GE_OQ)) << 8;
}

__attribute__((target("avx2"))) static size_t scan_avx2(const float *v, size_t n, float est,
                                                        size_t *pos, size_t cap)
{
    const __m256 t = _mm256_set1_ps(est);
    SCAN_BLOCKS(block_bits_avx2(v + b, t));
}

/* The error feedback's update and the first scan in one pass: v += g,
 * or with u, u = mom u + g and v += u, each lane rounded as psk_scale's
 * and psk_axpy's loops round it (a product, then sums), so v and u come
 * out bit for bit as those three passes leave them; then v's candidates
 * at or above est, as scan. Every entry is updated; positions stop at a
 * count past cap. */
__attribute__((target("avx2"))) static size_t accum_scan_avx2(size_t n, const float *g, float mom,
                                                              float *u, float *v, float est,
                                                              size_t *pos, size_t cap)
{
    const __m256 t = _mm256_set1_ps(est), mm = _mm256_set1_ps(mom);
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    size_t m = 0, b = 0;
    for (; b + SELECT_BLOCK <= n; b += SELECT_BLOCK) {
        unsigned bits = 0;
        for (size_t h = 0; h < SELECT_BLOCK; h += 8) {
            __m256 d = _mm256_loadu_ps(g + b + h);
            if (u != NULL) {
                d = _mm256_add_ps(d, _mm256_mul_ps(_mm256_loadu_ps(u + b + h), mm));
                _mm256_storeu_ps(u + b + h, d);
            }
            __m256 x = _mm256_add_ps(d, _mm256_loadu_ps(v + b + h));
            _mm256_storeu_ps(v + b + h, x);
            bits |=
                (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(x, abs), t, _CMP_GE_OQ))
                << h;
        }
        if (m <= cap)
            while (bits != 0) {
                pos[m++] = b + (size_t)__builtin_ctz(bits);
                bits &= bits - 1;
            }
    }
    for (size_t i = b; i < n; i++) {
        float d = g[i];
        if (u != NULL)
            d = u[i] = d + u[i] * mom;
        v[i] = d + v[i];
    }
    return scan_from(v, b, n, est, pos, m, cap);
}
#define ACCUM_AVX2 1

static size_t scan(const float *v, size_t n, float est, size_t *pos, size_t cap)
{
    return __builtin_cpu_supports("avx2") ? scan_avx2(v, n, est, pos, cap)
                                          : scan_sse2(v, n, est, pos, cap);
}
#else
static size_t scan(const float *v, size_t n, float est, size_t *pos, size_t cap)
{
    return scan_from(v, 0, n, est, pos, 0, cap);
}
#endif

/* The update psk_topk_host_accum makes, in plain passes: psk_scale's and
 * psk_axpy's loops (psk_math.h's psk_axpy1). */
static void accum_plain(size_t n, const float *g, float mom, float *u, float *v)
{
    if (u != NULL) {
        for (size_t i = 0; i < n; i++)
            u[i] *= mom;
        for (size_t i = 0; i < n; i++)
            u[i] = 1.0f * g[i] + u[i];
    }
    const float *d = u != NULL ? u : g;
    for (size_t i = 0; i < n; i++)
        v[i] = 1.0f * d[i] + v[i];
}

/* |v[i]| as it is, or (g not NULL) as the update will leave it */
static float mag_at(size_t i, const float *g, float mom, const float *u, const float *v)
{
    if (g == NULL)
        return fabsf(v[i]);
    float d = g[i];
    if (u != NULL)
        d = d + u[i] * mom;
    return fabsf(d + v[i]);
}

/* psk_topk_sampled, and with g not NULL psk_topk_host_accum: the first scan
 * makes the update where a fused pass exists (else it is made first). */
static int select_sampled(size_t n, const float *g, float mom, float *v, float *u, size_t k,
                          uint64_t *idx, float *val, int *path)
{
    /* a sample expected to hold PSK_TOPK_SAMPLE_HITS of the top k, at
     * most a quarter of v */
    size_t s = (size_t)((double)PSK_TOPK_SAMPLE_HITS * (double)n / (double)k);
    if (s < PSK_TOPK_SAMPLE_MIN)
        s = PSK_TOPK_SAMPLE_MIN;
    if (s > n / 4)
        s = n / 4;
    if (path != NULL)
        *path = PSK_TOPK_PATH_EXACT;
#ifdef ACCUM_AVX2
    int fused = g != NULL && __builtin_cpu_supports("avx2");
#else
    int fused = 0;
#endif
    if (g != NULL && !fused) {
        accum_plain(n, g, mom, u, v);
        g = NULL;
    }
    /* too small to be worth it, or too few of the top k in the sample for
     * an estimate: select exactly */
    if (n < 4 * PSK_TOPK_SAMPLE_MIN || (double)k * (double)s / (double)n < PSK_TOPK_SAMPLE_FEW) {
        if (g != NULL)
            accum_plain(n, g, mom, u, v);
        return psk_topk_exact(n, v, u, k, idx, val);
    }
    size_t stride = n / s;
    size_t cap = 3 * k + 1024; /* candidates kept; more: the estimate was too low */
    float *mag = malloc((s > cap ? s : cap) * sizeof *mag);
    size_t *pos = malloc((cap + SELECT_BLOCK) * sizeof *pos);
    if (mag == NULL || pos == NULL) {
        free(mag);
        free(pos);
        return PS_ENOMEM;
    }
    for (size_t j = 0; j < s; j++)
        mag[j] = mag_at(sample_at(j, stride), g, mom, u, v);
    /* the threshold: below the sample's estimate of the k-th magnitude
     * (its rank times the slack), so that at least k entries pass it
     * nearly always; when fewer pass, once more at PSK_TOPK_SAMPLE_RETRY
     * times that rank, which costs one more pass instead of the exact
     * selection's quickselect over all of v */
    double r = PSK_TOPK_SAMPLE_SLACK * (double)k * (double)s / (double)n;
    size_t m = 0;
    int tries = 0;
    float est;
    for (;;) {
        est = sample_rank(mag, s, (size_t)r);
#ifdef ACCUM_AVX2
        if (g != NULL) {
            m = accum_scan_avx2(n, g, mom, u, v, est, pos, cap);
            g = NULL;
        } else
#endif
            m = scan(v, n, est, pos, cap);
        if (m >= k || ++tries == 2 || (size_t)r >= s)
            break;
        r *= PSK_TOPK_SAMPLE_RETRY;
    }
    if (m < k || m > cap) { /* the estimate missed: exact selection */
        free(mag);
        free(pos);
        return psk_topk_exact(n, v, u, k, idx, val);
    }
    if (path != NULL)
        *path = tries > 0 ? PSK_TOPK_PATH_RETRIED : PSK_TOPK_PATH_SAMPLED;
    /* every entry at or above the k-th magnitude is a candidate (at least
     * k are at or above est): the candidates' k-th is the whole's */
    for (size_t j = 0; j < m; j++)
        mag[j] = fabsf(v[pos[j]]);
    size_t above = 0;
    float thr = kth_above(mag, m, k, est, &above);
    take(pos, m, thr, above, v, u, k, idx, val);
    free(mag);
    free(pos);
    return 0;
}

int psk_topk_sampled(size_t n, float *v, float *u, size_t k, uint64_t *idx, float *val, int *path)
{
    return select_sampled(n, NULL, 0.0f, v, u, k, idx, val, path);
}

int psk_topk_host_accum(size_t n, const float *g, float mom, float *u, float *v, size_t k,
                        uint64_t *idx, float *val, int *path)
{
    return select_sampled(n, g, mom, v, u, k, idx, val, path);
}

int psk_topk_host(size_t n, float *v, float *u, size_t k, uint64_t *idx, float *val)
{
    return psk_topk_sampled(n, v, u, k, idx, val, NULL);
}
