/* Binary classification over sparse (hashed, categorical) features
 * through psd, in two variants:
 *   linear (embed_dim 0): logistic regression; weights in a sparse table
 *     "lr.weight" (a row of 1 per feature key), bias in a dense "lr.bias";
 *     the sparse dot products run on the CPU (nothing to offload).
 *   embedding (embed_dim D): each example's feature rows of the sparse
 *     table "emb.weight" (D floats per key) are summed, weighted by the
 *     feature values, and fed to an MLP D -> hidden -> 2 (softmax, i.e. a
 *     logistic output) on the compute backend; the input gradient flows
 *     back into the embedding rows.
 * Each step pulls only the rows of the keys its mini-batch touches, and
 * pushes their gradients back. Data: DIR/train.svm and DIR/test.svm
 * (libsvm, gzip or plain); the same seeded global shuffle and per-rank
 * slices as the image MLP. */
#ifndef PSW_SPARSE_LR_H
#define PSW_SPARSE_LR_H

#include "psclient.h"

#include "ps_log.h"

#include <stdint.h>

struct psw_slr_config {
    const char *data;
    uint32_t rank, workers;
    uint64_t batch, epochs, max_steps, seed, log_every;
    int optimizer; /* enum psc_optimizer */
    float lr, l1, l2;
    uint64_t rows_max;
    uint32_t admit_after; /* the table's life cycle (psc_table_spec's) */
    uint64_t evict_after;
    uint64_t evict_half_life;
    int evict_at_budget;
    uint64_t test_delay_ms; /* tests: a pause after each step */
    int timeout_ms;
    uint32_t embed_dim; /* 0: linear */
    uint32_t hidden;    /* embedding variant: MLP hidden width */
    const char *device; /* embedding variant: backend */
};

struct psw_slr_result {
    double test_logloss, test_accuracy;
    uint64_t steps, samples;
    uint64_t rows_pulled; /* training pulls: rows asked for, summed over steps */
    double train_seconds;
};

int psw_slr_train(const struct psw_slr_config *cfg, struct psc_client *c, struct ps_log *log,
                  struct psw_slr_result *res, char *err, size_t errlen);

#endif
