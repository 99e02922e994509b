/* What the benchmarks report of repeated timings: their median (the mean
 * of the middle two when there are an even number). */
#ifndef PS_BENCH_STATS_H
#define PS_BENCH_STATS_H

#include <stdlib.h>

static inline int bench_cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v[0..n) (n >= 1) and returns its median. */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif
