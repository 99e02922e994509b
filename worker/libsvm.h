/* libsvm text data for sparse models: one example a line,
 * "LABEL KEY:VALUE KEY:VALUE ...", keys as unsigned decimal integers.
 * Labels 1/+1 are positive, 0/-1 negative. Read through zlib (gzip or
 * plain). Held as CSR. Every line is checked; a bad one is named by file
 * and line number. Limits: lines of PSW_SVM_LINE_MAX bytes, PSW_SVM_NNZ_MAX
 * features per example, PSW_SVM_ROWS_MAX examples. */
#ifndef PSW_LIBSVM_H
#define PSW_LIBSVM_H

#include <stddef.h>
#include <stdint.h>

#define PSW_SVM_LINE_MAX 65536
#define PSW_SVM_NNZ_MAX  4096
#define PSW_SVM_ROWS_MAX 100000000u

struct psw_svm {
    uint32_t n;    /* examples */
    uint64_t *row; /* n+1 offsets into key/val */
    uint64_t *key;
    float *val;
    uint8_t *label; /* 0 or 1 */
};

int psw_svm_load(const char *path, struct psw_svm *out, char *err, size_t errlen);
void psw_svm_free(struct psw_svm *s);

#endif
