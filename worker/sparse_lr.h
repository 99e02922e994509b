/* Logistic regression over sparse (hashed) features through psd: the
 * weights live in a sparse table "lr.weight" (dim 1, a row per feature
 * key) and the bias in a dense table "lr.bias". Each step pulls only the
 * rows of the keys its mini-batch touches, computes the logistic loss and
 * its gradient on the CPU (sparse dot products; no GEMM to offload), and
 * pushes the gradient rows back. Data: DIR/train.svm and DIR/test.svm
 * (libsvm, gzip or plain); the same seeded global shuffle and per-rank
 * slices as the MLP. */
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
    int timeout_ms;
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
