/* IDX reader and data helpers: valid plain and gzip files load; each kind
 * of broken file is refused with a message naming it; the epoch shuffle is
 * a deterministic permutation; --layers parsing boundaries. */
#include "data.h"
#include "idx.h"
#include "mlp.h"

#include "ps_err.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

static char dir[64];

static void write_file(const char *name, const unsigned char *b, size_t n, int gz)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s%s", dir, name, gz ? ".gz" : "");
    if (gz) {
        gzFile f = gzopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(gzwrite(f, b, (unsigned)n), (int)n);
        gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(b, 1, n, f), n);
        fclose(f);
    }
}

/* 3 images of 2x2 and their labels. */
static size_t images(unsigned char *b)
{
    const unsigned char h[] = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 2};
    memcpy(b, h, sizeof h);
    for (int i = 0; i < 12; i++)
        b[sizeof h + i] = (unsigned char)(i * 20);
    return sizeof h + 12;
}

static size_t labels(unsigned char *b, unsigned char last)
{
    const unsigned char h[] = {0, 0, 8, 1, 0, 0, 0, 3, 1, 0};
    memcpy(b, h, sizeof h);
    b[sizeof h] = last;
    return sizeof h + 1;
}

static int load(const char *name, struct psw_idx *out, char *err)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return psw_idx_load(path, out, err, 256);
}

static void test_valid_plain_and_gzip(void **state)
{
    (void)state;
    unsigned char b[64], l[16];
    size_t n = images(b);
    write_file("train-images-idx3-ubyte", b, n, 1); /* found as .gz */
    write_file("train-labels-idx1-ubyte", l, labels(l, 2), 0);
    struct psw_split s;
    char err[256];
    assert_int_equal(psw_data_load(dir, "train", 10, &s, err, sizeof err), 0);
    assert_int_equal(s.n, 3);
    assert_int_equal(s.pixels, 4);
    uint32_t idx[2] = {2, 0};
    float x[8];
    int lab[2];
    psw_data_batch(&s, idx, 2, x, lab);
    assert_int_equal(lab[0], 2);
    assert_int_equal(lab[1], 1);
    assert_float_equal(x[0], (8 * 20 / 255.0f - 0.2860f) / 0.3530f, 1e-5);
    psw_data_free(&s);
    /* a label at the class count is refused, naming it */
    write_file("train-labels-idx1-ubyte", l, labels(l, 10), 0);
    assert_int_equal(psw_data_load(dir, "train", 10, &s, err, sizeof err), PS_EPROTO);
    assert_non_null(strstr(err, "label 10"));
}

/* Batches longer than the rows fetched ahead, of an odd pixel count (the
 * vector loop's tail): every value is the normalised pixel of the row the
 * index names, in the order given, with its label. */
static void test_batch_every_pixel(void **state)
{
    (void)state;
    enum { N = 11, PIXELS = 37 };
    static uint8_t img[N * PIXELS], lab[N];
    for (int i = 0; i < N * PIXELS; i++)
        img[i] = (uint8_t)(i * 7 + 3);
    for (int i = 0; i < N; i++)
        lab[i] = (uint8_t)(i % 10);
    struct psw_split s = {.n = N, .pixels = PIXELS};
    s.images.data = img;
    s.labels.data = lab;
    const uint32_t idx[] = {10, 3, 3, 0, 7, 9, 1, 5, 2};
    const int rows = (int)(sizeof idx / sizeof idx[0]);
    float x[9 * PIXELS];
    int labels[9];
    for (int rows_used = 0; rows_used <= rows; rows_used += 4) {
        memset(x, 0xff, sizeof x);
        psw_data_batch(&s, idx, rows_used, x, labels);
        for (int r = 0; r < rows_used; r++) {
            assert_int_equal(labels[r], lab[idx[r]]);
            for (int p = 0; p < PIXELS; p++)
                assert_float_equal(x[r * PIXELS + p],
                                   (img[idx[r] * PIXELS + p] / 255.0f - 0.2860f) / 0.3530f, 1e-5);
        }
        for (int i = rows_used * PIXELS; i < rows * PIXELS; i++) { /* nothing past the batch */
            uint32_t bits;
            memcpy(&bits, &x[i], sizeof bits);
            assert_int_equal(bits, 0xffffffffu);
        }
    }
}

static void test_broken_files(void **state)
{
    (void)state;
    unsigned char b[64];
    size_t n = images(b);
    struct psw_idx idx;
    char err[256];
    write_file("t", b, n - 1, 0); /* one byte short */
    assert_int_equal(load("t", &idx, err), PS_EPROTO);
    assert_non_null(strstr(err, "truncated"));
    write_file("t", b, 10, 0); /* inside the header */
    assert_int_equal(load("t", &idx, err), PS_EPROTO);
    unsigned char bad[64];
    memcpy(bad, b, n);
    bad[2] = 0x0d; /* float data: not supported */
    write_file("t", bad, n, 0);
    assert_int_equal(load("t", &idx, err), PS_EPROTO);
    assert_non_null(strstr(err, "bad magic"));
    memcpy(bad, b, n);
    bad[7] = 0; /* a zero dimension */
    write_file("t", bad, n, 0);
    assert_int_equal(load("t", &idx, err), PS_ELIMIT);
    memcpy(bad, b, n);
    bad[4] = 0x7f; /* 2 GiB+ of claimed data: refused before allocating */
    write_file("t", bad, n, 0);
    assert_int_equal(load("t", &idx, err), PS_ELIMIT);
    write_file("t", b, 0, 0); /* empty */
    assert_int_equal(load("t", &idx, err), PS_EPROTO);
    assert_int_equal(load("missing", &idx, err), PS_EIO);
    assert_non_null(strstr(err, "missing"));
}

static void test_permutation(void **state)
{
    (void)state;
    enum { N = 1000 };
    uint32_t a[N], b[N];
    unsigned char seen[N] = {0};
    psw_data_permute(a, N, 7, 3);
    psw_data_permute(b, N, 7, 3);
    assert_memory_equal(a, b, sizeof a);
    for (int i = 0; i < N; i++)
        seen[a[i]]++;
    for (int i = 0; i < N; i++)
        assert_int_equal(seen[i], 1);
    psw_data_permute(b, N, 7, 4); /* another epoch, another order */
    assert_true(memcmp(a, b, sizeof a) != 0);
}

static void test_layers(void **state)
{
    (void)state;
    int d[PSW_LAYERS_MAX + 1];
    char err[256];
    assert_int_equal(psw_mlp_parse_layers("784,256,128,10", d, err, sizeof err), 3);
    assert_int_equal(d[3], 10);
    assert_int_equal(psw_mlp_parse_layers("4,65536", d, err, sizeof err), 1); /* at the limit */
    assert_int_equal(psw_mlp_parse_layers("4,65537", d, err, sizeof err), PS_EINVAL);
    assert_int_equal(psw_mlp_parse_layers("784", d, err, sizeof err), PS_EINVAL);
    assert_int_equal(psw_mlp_parse_layers("784,,10", d, err, sizeof err), PS_EINVAL);
    assert_int_equal(psw_mlp_parse_layers("784,0,10", d, err, sizeof err), PS_EINVAL);
    assert_int_equal(
        psw_mlp_parse_layers("1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", d, err, sizeof err),
        16); /* PSW_LAYERS_MAX layers */
    assert_int_equal(
        psw_mlp_parse_layers("1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18", d, err, sizeof err),
        PS_EINVAL);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/pstest-idx.XXXXXX");
    if (mkdtemp(dir) == NULL)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_plain_and_gzip),
        cmocka_unit_test(test_batch_every_pixel),
        cmocka_unit_test(test_broken_files),
        cmocka_unit_test(test_permutation),
        cmocka_unit_test(test_layers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
