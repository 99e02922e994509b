/* libsvm reader: strict parsing into growable CSR arrays with ceilings. */
#include "libsvm.h"

#include "ps_err.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

struct grow {
    uint64_t n, cap;
};

static int reserve(void **p, struct grow *g, uint64_t want, size_t esize)
{
    if (want <= g->cap)
        return 0;
    uint64_t cap = g->cap ? g->cap * 2 : 1024;
    while (cap < want)
        cap *= 2;
    void *q = realloc(*p, (size_t)cap * esize);
    if (q == NULL)
        return PS_ENOMEM;
    *p = q;
    g->cap = cap;
    return 0;
}

static int parse_line(char *line, struct psw_svm *s, struct grow *rows, struct grow *nnz,
                      const char *path, uint64_t lineno, char *err, size_t errlen)
{
    char *p = line, *end;
    long lab = strtol(p, &end, 10);
    if (end == p || (lab != 1 && lab != 0 && lab != -1)) {
        snprintf(err, errlen, "%s:%llu: label must be 1, 0 or -1", path,
                 (unsigned long long)lineno);
        return PS_EPROTO;
    }
    if (reserve((void **)&s->label, rows, rows->n + 1, 1) != 0)
        return PS_ENOMEM;
    s->label[rows->n] = lab == 1;
    p = end;
    uint64_t count = 0;
    for (;;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '\0' || *p == '\n' || *p == '\r')
            break;
        errno = 0;
        if (*p < '0' || *p > '9') {
            snprintf(err, errlen, "%s:%llu: feature %llu is not KEY:VALUE", path,
                     (unsigned long long)lineno, (unsigned long long)count + 1);
            return PS_EPROTO;
        }
        unsigned long long k = strtoull(p, &end, 10);
        if (errno == ERANGE || *end != ':') {
            snprintf(err, errlen, "%s:%llu: feature %llu is not KEY:VALUE", path,
                     (unsigned long long)lineno, (unsigned long long)count + 1);
            return PS_EPROTO;
        }
        p = end + 1;
        float v = strtof(p, &end);
        if (end == p || !isfinite(v)) {
            snprintf(err, errlen, "%s:%llu: value of key %llu is not a finite number", path,
                     (unsigned long long)lineno, k);
            return PS_EPROTO;
        }
        p = end;
        if (++count > PSW_SVM_NNZ_MAX) {
            snprintf(err, errlen, "%s:%llu: more than %d features", path,
                     (unsigned long long)lineno, PSW_SVM_NNZ_MAX);
            return PS_ELIMIT;
        }
        struct grow kg = *nnz;
        if (reserve((void **)&s->key, &kg, nnz->n + 1, sizeof *s->key) != 0 ||
            reserve((void **)&s->val, nnz, nnz->n + 1, sizeof *s->val) != 0)
            return PS_ENOMEM;
        s->key[nnz->n] = k;
        s->val[nnz->n] = v;
        nnz->n++;
    }
    rows->n++;
    return 0;
}

int psw_svm_load(const char *path, struct psw_svm *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    gzFile f = gzopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "cannot open '%s'", path);
        return PS_EIO;
    }
    char *line = malloc(PSW_SVM_LINE_MAX + 2);
    struct grow rows = {0, 0}, nnz = {0, 0}, offs = {0, 0};
    uint64_t lineno = 0;
    int rc = line ? 0 : PS_ENOMEM;
    while (rc == 0 && gzgets(f, line, PSW_SVM_LINE_MAX + 2) != NULL) {
        lineno++;
        size_t len = strlen(line);
        if (len > PSW_SVM_LINE_MAX) {
            snprintf(err, errlen, "%s:%llu: line longer than %d bytes", path,
                     (unsigned long long)lineno, PSW_SVM_LINE_MAX);
            rc = PS_ELIMIT;
            break;
        }
        if (line[0] == '\n' || line[0] == '#' || line[0] == '\0')
            continue;
        if (rows.n >= PSW_SVM_ROWS_MAX) {
            snprintf(err, errlen, "%s: more than %u examples", path, PSW_SVM_ROWS_MAX);
            rc = PS_ELIMIT;
            break;
        }
        if (reserve((void **)&out->row, &offs, rows.n + 2, sizeof *out->row) != 0) {
            rc = PS_ENOMEM;
            break;
        }
        out->row[rows.n] = nnz.n;
        rc = parse_line(line, out, &rows, &nnz, path, lineno, err, errlen);
    }
    gzclose(f);
    free(line);
    if (rc == 0 && rows.n == 0) {
        snprintf(err, errlen, "%s: no examples", path);
        rc = PS_EPROTO;
    }
    if (rc != 0) {
        if (rc == PS_ENOMEM)
            snprintf(err, errlen, "%s: out of memory at line %llu", path,
                     (unsigned long long)lineno);
        psw_svm_free(out);
        return rc;
    }
    out->n = (uint32_t)rows.n;
    out->row[rows.n] = nnz.n;
    return 0;
}

void psw_svm_free(struct psw_svm *s)
{
    free(s->row);
    free(s->key);
    free(s->val);
    free(s->label);
    memset(s, 0, sizeof *s);
}
