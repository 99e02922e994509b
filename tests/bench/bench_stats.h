/* What the benchmarks report of repeated timings: their median (the mean
 * of the middle two when there are an even number); and the plain row
 * loops sparse tables are measured against. */
#ifndef PS_BENCH_STATS_H
#define PS_BENCH_STATS_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

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

/* The fastest a row store can be: rows of dim floats indexed by the id
 * itself (no hash). A pull copies n rows out; a push takes lr times n
 * gradients from them (SGD). */
static inline void bench_gather(float *out, const float *rows, const uint64_t *keys, size_t n,
                                unsigned dim)
{
    for (size_t i = 0; i < n; i++)
        memcpy(out + i * dim, rows + keys[i] * dim, dim * sizeof(float));
}

static inline void bench_scatter(float *rows, const uint64_t *keys, const float *g, size_t n,
                                 unsigned dim, float lr)
{
    for (size_t i = 0; i < n; i++) {
        float *w = rows + keys[i] * dim;
        for (unsigned j = 0; j < dim; j++)
            w[j] -= lr * g[i * dim + j];
    }
}

/* CPU seconds a process's threads ran, summed from each one's schedstat
 * (in ns: /proc/PID/stat counts in clock ticks, too coarse for short
 * runs). */
static inline double bench_cpu_s(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    double total = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char f[sizeof path + 256 + 16];
        snprintf(f, sizeof f, "%s/%s/schedstat", path, e->d_name);
        FILE *fp = fopen(f, "r");
        unsigned long long ns = 0;
        if (fp != NULL && fscanf(fp, "%llu", &ns) == 1)
            total += (double)ns * 1e-9;
        if (fp != NULL)
            fclose(fp);
    }
    if (d != NULL)
        closedir(d);
    return total;
}

#endif
