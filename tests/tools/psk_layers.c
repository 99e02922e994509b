/* psk_layers: runs one convolution or pooling layer, forward and
 * backward, on a compute backend over raw float32 files, so that a test
 * can compare it with another implementation (tests/python/test_layers.py
 * compares it with torch.nn.functional).
 *
 *   psk_layers conv DIR N C_IN H W C_OUT K PAD [DEVICE]
 *       reads DIR/x, DIR/w, DIR/b, DIR/dy; writes DIR/y, DIR/gw, DIR/gb, DIR/dx
 *   psk_layers maxpool|avgpool DIR N C H W S [DEVICE]
 *       reads DIR/x, DIR/dy; writes DIR/y, DIR/dx
 *   psk_layers round DIR N bf16|f16 [DEVICE]
 *       reads DIR/x; writes DIR/y (x rounded) and DIR/count (one float:
 *       the NaNs and infinities in y)
 *
 * Every file is native-endian float32 of the size the shapes give; DEVICE
 * is psk_open's (default cpu). Exits 0, 1 on a failure it names, 2 on bad
 * arguments, 77 when the device cannot be opened. */
#include "psk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dir;

static float *load(const char *name, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    float *v = malloc(n * sizeof *v + 1);
    if (f == NULL || v == NULL || fread(v, sizeof *v, n, f) != n || fgetc(f) != EOF) {
        fprintf(stderr, "psk_layers: %s: cannot read %zu floats, exactly\n", path, n);
        exit(1);
    }
    fclose(f);
    return v;
}

static void save(const char *name, const float *v, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(v, sizeof *v, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "psk_layers: %s: cannot write\n", path);
        exit(1);
    }
}

static struct psk_backend *be;
static void *held[16]; /* device buffers, freed at the end */
static int nheld;

/* A device buffer of n floats, holding host's (which it frees) unless
 * host is NULL. */
static void *dev(float *host, size_t n)
{
    void *p = NULL;
    if (nheld == 16 || psk_alloc(be, n * 4 + 4, &p) != 0 ||
        (host != NULL && psk_upload(be, p, host, n * 4))) {
        fprintf(stderr, "psk_layers: device memory: %s\n", psk_last_error(be));
        exit(1);
    }
    free(host);
    return held[nheld++] = p;
}

static void fetch(const char *name, const void *d, size_t n)
{
    float *h = malloc(n * sizeof *h + 4);
    if (h == NULL || psk_sync(be) != 0 || psk_download(be, h, d, n * 4) != 0) {
        fprintf(stderr, "psk_layers: reading %s back: %s\n", name, psk_last_error(be));
        exit(1);
    }
    save(name, h, n);
    free(h);
}

static void check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "psk_layers: %s failed (%d): %s\n", what, rc, psk_last_error(be));
        exit(1);
    }
}

static int arg_int(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < 0 || v > 1 << 20) {
        fprintf(stderr, "psk_layers: '%s' is not a size\n", s);
        exit(2);
    }
    return (int)v;
}

static int conv(char **a, int na)
{
    if (na < 7)
        return 2;
    struct psk_conv g = {arg_int(a[0]), arg_int(a[1]), arg_int(a[2]), arg_int(a[3]),
                         arg_int(a[4]), arg_int(a[5]), arg_int(a[6])};
    int ho = psk_conv_out(g.h, g.k, g.pad), wo = psk_conv_out(g.w, g.k, g.pad);
    size_t nx = (size_t)g.n * g.c_in * g.h * g.w, nw = (size_t)g.c_out * g.c_in * g.k * g.k;
    size_t ny = (size_t)g.n * g.c_out * ho * wo, nws = psk_conv_ws_floats(&g);
    if (ho <= 0 || wo <= 0 || nws == 0) {
        fprintf(stderr, "psk_layers: that convolution has no output\n");
        return 2;
    }
    float *x = dev(load("x", nx), nx), *w = dev(load("w", nw), nw);
    float *b = dev(load("b", (size_t)g.c_out), (size_t)g.c_out), *dy = dev(load("dy", ny), ny);
    float *y = dev(NULL, ny), *gw = dev(NULL, nw), *gb = dev(NULL, (size_t)g.c_out);
    float *dx = dev(NULL, nx), *ws = dev(NULL, nws);
    check(psk_conv_ws_init(be, &g, ws), "workspace");
    check(psk_conv_forward(be, &g, x, w, b, y, ws), "forward");
    check(psk_conv_backward(be, &g, x, w, dy, gw, gb, dx, ws), "backward");
    fetch("y", y, ny);
    fetch("gw", gw, nw);
    fetch("gb", gb, (size_t)g.c_out);
    fetch("dx", dx, nx);
    return 0;
}

static int pool(int max, char **a, int na)
{
    if (na < 5)
        return 2;
    int n = arg_int(a[0]), c = arg_int(a[1]), h = arg_int(a[2]), w = arg_int(a[3]);
    int s = arg_int(a[4]);
    if (s == 0 || h < s || w < s) {
        fprintf(stderr, "psk_layers: a %dx%d window does not fit %dx%d\n", s, s, h, w);
        return 2;
    }
    size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * (h / s) * (w / s);
    float *x = dev(load("x", nx), nx), *dy = dev(load("dy", ny), ny);
    float *y = dev(NULL, ny), *dx = dev(NULL, nx);
    int *arg = max ? dev(NULL, ny) : NULL;
    if (max)
        check(psk_maxpool(be, n * c, h, w, s, x, y, arg), "max-pool");
    else
        check(psk_avgpool(be, n * c, h, w, s, x, y), "average pool");
    check(psk_pool_backward(be, n * c, h, w, s, dy, arg, dx), "pool backward");
    fetch("y", y, ny);
    fetch("dx", dx, nx);
    return 0;
}

static int round16(char **a, int na)
{
    if (na < 2)
        return 2;
    int n = arg_int(a[0]), p = psk_precision_parse(a[1]);
    if (p <= PSK_PREC_F32) {
        fprintf(stderr, "psk_layers: '%s' is not bf16 or f16\n", a[1]);
        return 2;
    }
    float *x = dev(load("x", (size_t)n), (size_t)n);
    uint64_t count = 0;
    check(psk_round(be, p, (size_t)n, x), "round");
    check(psk_count_nonfinite(be, (size_t)n, x, &count), "count");
    fetch("y", x, (size_t)n);
    float c = (float)count;
    save("count", &c, 1);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: psk_layers conv DIR N C_IN H W C_OUT K PAD [DEVICE]\n"
                        "       psk_layers maxpool|avgpool DIR N C H W S [DEVICE]\n"
                        "       psk_layers round DIR N bf16|f16 [DEVICE]\n");
        return 2;
    }
    dir = argv[2];
    int nargs = strcmp(argv[1], "conv") == 0 ? 7 : strcmp(argv[1], "round") == 0 ? 2 : 5;
    const char *device = argc > 3 + nargs ? argv[3 + nargs] : "cpu";
    char err[256];
    if (psk_open(device, &be, err, sizeof err) != 0) {
        fprintf(stderr, "psk_layers: cannot open device %s: %s\n", device, err);
        return 77;
    }
    int rc;
    if (strcmp(argv[1], "conv") == 0)
        rc = conv(argv + 3, argc - 3);
    else if (strcmp(argv[1], "maxpool") == 0 || strcmp(argv[1], "avgpool") == 0)
        rc = pool(argv[1][0] == 'm', argv + 3, argc - 3);
    else if (strcmp(argv[1], "round") == 0)
        rc = round16(argv + 3, argc - 3);
    else {
        fprintf(stderr, "psk_layers: '%s' is not conv, maxpool, avgpool or round\n", argv[1]);
        rc = 2;
    }
    if (rc == 2)
        fprintf(stderr, "psk_layers: too few sizes for %s\n", argv[1]);
    while (nheld > 0)
        psk_free(be, held[--nheld]);
    psk_close(be);
    return rc;
}
