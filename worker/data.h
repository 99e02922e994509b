/* The image classification data a worker trains on: IDX images + labels
 * (Fashion-MNIST layout: train-images-idx3-ubyte[.gz], ...), with the
 * per-epoch shuffle and the normalisation to floats. */
#ifndef PSW_DATA_H
#define PSW_DATA_H

#include "idx.h"

#include <stddef.h>
#include <stdint.h>

struct psw_split {
    struct psw_idx images, labels;
    uint32_t n;      /* examples */
    uint32_t pixels; /* per example */
};

/* Loads DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]; checks that
 * images and labels agree and that every label is below `classes`. */
int psw_data_load(const char *dir, const char *prefix, int classes, struct psw_split *out,
                  char *err, size_t errlen);
void psw_data_free(struct psw_split *s);

/* The epoch's order: a Fisher-Yates shuffle of 0..n-1 seeded by (seed,
 * epoch), identical on every worker. */
void psw_data_permute(uint32_t *perm, uint32_t n, uint64_t seed, uint64_t epoch);

/* Writes rows idx[0..rows) as normalised floats and their labels. */
void psw_data_batch(const struct psw_split *s, const uint32_t *idx, int rows, float *x,
                    int *labels);

/* The labels of rows idx[0..rows) alone (a pipeline's last stage). */
void psw_data_labels(const struct psw_split *s, const uint32_t *idx, int rows, int *labels);

#endif
