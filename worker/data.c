/* Data loading, shuffling and normalisation for image classification. */
#include "data.h"
#include "ps_limits.h"

#include "ps_err.h"
#include "ps_init.h"
#include "ps_shard.h"

#include <stdio.h>
#include <string.h>

/* Fashion-MNIST's pixel mean and standard deviation (of x / 255). */
#define PIXEL_MEAN 0.2860f
#define PIXEL_STD  0.3530f

int psw_data_load(const char *dir, const char *prefix, int classes, struct psw_split *out,
                  char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    char path[PS_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, prefix);
    int rc = psw_idx_load(path, &out->images, err, errlen);
    if (rc != 0)
        return rc;
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, prefix);
    rc = psw_idx_load(path, &out->labels, err, errlen);
    if (rc != 0) {
        psw_data_free(out);
        return rc;
    }
    if (out->images.ndims != 3 || out->labels.ndims != 1 ||
        out->images.dims[0] != out->labels.dims[0]) {
        snprintf(err, errlen, "%s/%s: images (%d dims) and labels (%d dims) do not match", dir,
                 prefix, out->images.ndims, out->labels.ndims);
        psw_data_free(out);
        return PS_EPROTO;
    }
    out->n = out->images.dims[0];
    out->pixels = out->images.dims[1] * out->images.dims[2];
    for (uint32_t i = 0; i < out->n; i++) {
        if (out->labels.data[i] >= classes) {
            snprintf(err, errlen, "%s/%s: label %u of example %u is not below %d classes", dir,
                     prefix, out->labels.data[i], i, classes);
            psw_data_free(out);
            return PS_EPROTO;
        }
    }
    return 0;
}

void psw_data_free(struct psw_split *s)
{
    psw_idx_free(&s->images);
    psw_idx_free(&s->labels);
}

void psw_data_permute(uint32_t *perm, uint32_t n, uint64_t seed, uint64_t epoch)
{
    for (uint32_t i = 0; i < n; i++)
        perm[i] = i;
    uint64_t state = ps_mix64(seed ^ ps_mix64(epoch + 1));
    for (uint32_t i = n; i > 1; i--) {
        state = ps_mix64(state);
        uint32_t j = (uint32_t)(ps_unit_double(state) * i);
        uint32_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}

/* Rows fetched ahead of the one converted: the rows are scattered over a
 * data set larger than the caches, so each is a string of misses that
 * the prefetcher cannot guess. */
#define PREFETCH_ROWS 4

static void prefetch_row(const struct psw_split *s, uint32_t i)
{
    const uint8_t *px = s->images.data + (size_t)i * s->pixels;
    for (uint32_t p = 0; p < s->pixels; p += 64)
        __builtin_prefetch(px + p);
}

void psw_data_batch(const struct psw_split *s, const uint32_t *idx, int rows, float *x, int *labels)
{
    const float scale = 1.0f / (255.0f * PIXEL_STD), shift = PIXEL_MEAN / PIXEL_STD;
    for (int r = 0; r < PREFETCH_ROWS && r < rows; r++)
        prefetch_row(s, idx[r]);
    const uint32_t n = s->pixels; /* in a local: the stores below may not change it */
    for (int r = 0; r < rows; r++) {
        if (r + PREFETCH_ROWS < rows)
            prefetch_row(s, idx[r + PREFETCH_ROWS]);
        const uint8_t *restrict px = s->images.data + (size_t)idx[r] * n;
        float *restrict out = x + (size_t)r * n;
        for (uint32_t p = 0; p < n; p++)
            out[p] = (float)px[p] * scale - shift;
        labels[r] = s->labels.data[idx[r]];
    }
}

void psw_data_labels(const struct psw_split *s, const uint32_t *idx, int rows, int *labels)
{
    for (int r = 0; r < rows; r++)
        labels[r] = s->labels.data[idx[r]];
}
