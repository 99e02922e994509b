/* Top-k selection by magnitude (psk_select.h). */
#include "psk_select.h"

#include "ps_err.h"

#include <math.h>
#include <stdlib.h>

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

int psk_topk_host(size_t n, float *v, float *u, size_t k, uint64_t *idx, float *val)
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
    size_t ties = k - above, m = 0; /* take ties at thr in index order */
    for (size_t i = 0; i < n && m < k; i++) {
        float a = fabsf(v[i]);
        if (a > thr || (a == thr && ties > 0)) {
            if (a == thr)
                ties--;
            idx[m] = i;
            val[m] = v[i];
            m++;
            v[i] = 0.0f;
            if (u != NULL)
                u[i] = 0.0f;
        }
    }
    return 0;
}
