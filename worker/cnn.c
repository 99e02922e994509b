/* The convolutional front of psworker's CNN (cnn.h). */
#include "cnn.h"

#include "ps_err.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHANNELS_MAX 4096
#define KERNEL_MAX   15

/* "conv3x3:32" or "conv5x5:16:pad2" -> k, c_out, pad; 0 or -1. */
static int parse_conv(const char *t, int *k, int *c_out, int *pad)
{
    int k2 = 0, n = 0;
    char rest[16] = "";
    *pad = 0;
    int got = sscanf(t, "conv%dx%d:%d%15s", k, &k2, c_out, rest);
    if (got < 3 || (got == 4 && (sscanf(rest, ":pad%d%n", pad, &n) != 1 || rest[n] != '\0')))
        return -1;
    return *k == k2 && *k >= 1 && *k <= KERNEL_MAX && *c_out >= 1 && *c_out <= CHANNELS_MAX &&
                   *pad >= 0 && *pad < *k
               ? 0
               : -1;
}

int psw_cnn_parse(struct psw_cnn *m, const char *arch, int c0, int h0, int w0, int *dims, char *err,
                  size_t errlen)
{
    memset(m, 0, sizeof *m);
    m->c0 = c0;
    m->h0 = h0;
    m->w0 = w0;
    char buf[512];
    if (arch == NULL || strlen(arch) >= sizeof buf) {
        snprintf(err, errlen, "--arch: a layer list of at most %zu characters is needed",
                 sizeof buf - 1);
        return PS_EINVAL;
    }
    snprintf(buf, sizeof buf, "%s", arch);
    int c = c0, h = h0, w = w0, nfc = 0, head = 0, relu_last = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        struct psw_conv_layer *L = m->n > 0 ? &m->L[m->n - 1] : NULL;
        int k, co, pad, s;
        if (strncmp(t, "conv", 4) == 0) {
            if (head || m->n == PSW_CONV_MAX || parse_conv(t, &k, &co, &pad) != 0) {
                snprintf(err, errlen,
                         head ? "--arch: '%s': convolutions come before the fc layers"
                              : "--arch: '%s' is not convKxK:CHANNELS[:padP] (K 1..%d, padding "
                                "below K, at most %d convolutions)",
                         t, KERNEL_MAX, PSW_CONV_MAX);
                return PS_EINVAL;
            }
            L = &m->L[m->n++];
            L->g = (struct psk_conv){0, c, h, w, co, k, pad};
            L->ho = psk_conv_out(h, k, pad);
            L->wo = psk_conv_out(w, k, pad);
            if (L->ho < 1 || L->wo < 1) {
                snprintf(err, errlen, "--arch: '%s' does not fit its %dx%d input", t, h, w);
                return PS_EINVAL;
            }
            L->ph = L->ho;
            L->pw = L->wo;
            c = co;
            h = L->ho;
            w = L->wo;
        } else if (strcmp(t, "relu") == 0) {
            if (head ? nfc == 0 || relu_last : L == NULL || L->relu || L->pool) {
                snprintf(err, errlen,
                         "--arch: a relu goes right after a convolution or between "
                         "two fc layers");
                return PS_EINVAL;
            }
            if (head)
                relu_last = 1;
            else
                L->relu = 1;
        } else if (sscanf(t, "maxpool%d", &s) == 1 || sscanf(t, "avgpool%d", &s) == 1) {
            char tail[2];
            if (head || L == NULL || L->pool || s < 1 || s > h || s > w ||
                sscanf(t + 7, "%*d%1s", tail) == 1) {
                snprintf(err, errlen, "--arch: '%s': one pooling of 1..%d after a convolution", t,
                         h < w ? h : w);
                return PS_EINVAL;
            }
            L->pool = s;
            L->pool_max = t[0] == 'm';
            L->ph = h / s;
            L->pw = w / s;
            h = L->ph;
            w = L->pw;
        } else if (strcmp(t, "flatten") == 0 && !head) {
            head = 1;
        } else if (sscanf(t, "fc:%d", &k) == 1 && k >= 1 && k <= PSW_WIDTH_MAX) {
            if (nfc > 0 && !relu_last) {
                snprintf(err, errlen,
                         "--arch: psworker's head has a relu between fc layers "
                         "(write fc:128,relu,fc:10)");
                return PS_EINVAL;
            }
            if (nfc == PSW_LAYERS_MAX) {
                snprintf(err, errlen, "--arch: at most %d fc layers", PSW_LAYERS_MAX);
                return PS_EINVAL;
            }
            head = 1;
            relu_last = 0;
            dims[++nfc] = k;
        } else {
            snprintf(err, errlen,
                     "--arch: '%s' is not convKxK:C[:padP], relu, maxpoolS, avgpoolS, flatten "
                     "or fc:N",
                     t);
            return PS_EINVAL;
        }
    }
    if (m->n == 0 || nfc == 0 || relu_last) {
        snprintf(err, errlen,
                 "--arch: at least one convolution, then fc layers ending in an fc "
                 "(the logits)");
        return PS_EINVAL;
    }
    if ((double)c * h * w > PSW_WIDTH_MAX) {
        snprintf(err, errlen, "--arch: %d x %d x %d features reach the first fc layer; at most %d",
                 c, h, w, PSW_WIDTH_MAX);
        return PS_EINVAL;
    }
    dims[0] = c * h * w;
    return nfc;
}

static int dev(struct psk_backend *be, size_t floats, void *p)
{
    return psk_alloc(be, floats * 4 + 4, (void **)p);
}

int psw_cnn_init(struct psw_cnn *m, struct psk_backend *be, int batch_max, float *feat,
                 float *dfeat, char *err, size_t errlen)
{
    m->be = be;
    m->batch_max = batch_max;
    m->feat = feat;
    m->dfeat = dfeat;
    size_t bm = (size_t)batch_max;
    int rc = dev(be, bm * m->c0 * m->h0 * m->w0, &m->in);
    for (int l = 0; l < m->n && rc == 0; l++) {
        struct psw_conv_layer *L = &m->L[l];
        size_t nw = (size_t)L->g.c_out * L->g.c_in * L->g.k * L->g.k;
        size_t nout = bm * L->g.c_out * L->ho * L->wo, npool = bm * L->g.c_out * L->ph * L->pw;
        int last = l == m->n - 1;
        rc = dev(be, nw, &L->w) || dev(be, (size_t)L->g.c_out, &L->b) || dev(be, nw, &L->gw) ||
             dev(be, (size_t)L->g.c_out, &L->gb) || dev(be, psk_conv_ws_floats(&L->g), &L->ws) ||
             psk_conv_ws_init(be, &L->g, L->ws);
        if (rc == 0 && L->pool) {
            rc = dev(be, nout, &L->dout) || (L->pool_max && dev(be, npool, &L->arg)) ||
                 (!last && dev(be, npool, &L->pout));
            if (last)
                L->pout = feat;
        }
        if (rc == 0)
            rc = last && !L->pool ? (L->out = feat, 0) : dev(be, nout, &L->out);
        if (rc == 0 && l > 0)
            rc = dev(be, bm * L->g.c_in * L->g.h * L->g.w, &L->din);
    }
    if (rc != 0) {
        snprintf(err, errlen, "cannot allocate the convolution layers' buffers: %s",
                 psk_last_error(be));
        return PS_ENOMEM;
    }
    return 0;
}

static void save_slot(const struct psw_cnn *m, struct psw_cnn_slot *s)
{
    s->in = m->in;
    s->feat = m->feat;
    for (int l = 0; l < m->n; l++) {
        s->out[l] = m->L[l].out;
        s->pout[l] = m->L[l].pout;
        s->arg[l] = m->L[l].arg;
    }
}

void psw_cnn_use_slot(struct psw_cnn *m, int i)
{
    const struct psw_cnn_slot *s = &m->slots[i];
    m->in = s->in;
    m->feat = s->feat;
    for (int l = 0; l < m->n; l++) {
        m->L[l].out = s->out[l];
        m->L[l].pout = s->pout[l];
        m->L[l].arg = s->arg[l];
    }
}

int psw_cnn_set_slots(struct psw_cnn *m, int n, int rows, float *const *feats)
{
    if (m->slots != NULL || n < 1 || n > PSW_SLOTS_MAX || rows < 1 || rows > m->batch_max)
        return PS_EINVAL;
    if ((m->slots = calloc((size_t)n, sizeof *m->slots)) == NULL)
        return PS_ENOMEM;
    m->nslots = n;
    save_slot(m, &m->slots[0]);
    size_t r = (size_t)rows;
    for (int i = 1; i < n; i++) {
        struct psw_cnn_slot *s = &m->slots[i];
        s->feat = feats[i];
        if (dev(m->be, r * m->c0 * m->h0 * m->w0, &s->in))
            return PS_ENOMEM; /* fini frees what was made */
        for (int l = 0; l < m->n; l++) {
            const struct psw_conv_layer *L = &m->L[l];
            size_t nout = r * L->g.c_out * L->ho * L->wo, npool = r * L->g.c_out * L->ph * L->pw;
            int last = l == m->n - 1;
            if (L->pool && ((L->pool_max && dev(m->be, npool, &s->arg[l])) ||
                            (!last && dev(m->be, npool, &s->pout[l]))))
                return PS_ENOMEM;
            if (L->pool && last)
                s->pout[l] = feats[i];
            if (last && !L->pool)
                s->out[l] = feats[i];
            else if (dev(m->be, nout, &s->out[l]))
                return PS_ENOMEM;
        }
    }
    return 0;
}

void psw_cnn_fini(struct psw_cnn *m)
{
    if (m->be == NULL)
        return;
    if (m->slots != NULL) { /* slot 0's are the model's own, freed below */
        psw_cnn_use_slot(m, 0);
        for (int i = 1; i < m->nslots; i++) {
            struct psw_cnn_slot *s = &m->slots[i];
            psk_free(m->be, s->in);
            for (int l = 0; l < m->n; l++) {
                int last = l == m->n - 1;
                psk_free(m->be, s->arg[l]);
                if (!last)
                    psk_free(m->be, s->pout[l]);
                if (!last || m->L[l].pool)
                    psk_free(m->be, s->out[l]);
            }
        }
        free(m->slots);
        m->slots = NULL;
    }
    psk_free(m->be, m->in);
    for (int l = 0; l < m->n; l++) {
        struct psw_conv_layer *L = &m->L[l];
        int last = l == m->n - 1;
        if (!m->params_placed) {
            psk_free(m->be, L->w);
            psk_free(m->be, L->b);
        }
        if (!m->grads_placed) {
            psk_free(m->be, L->gw);
            psk_free(m->be, L->gb);
        }
        psk_free(m->be, L->ws);
        psk_free(m->be, L->gwa);
        psk_free(m->be, L->gba);
        psk_free(m->be, L->wc);
        psk_free(m->be, L->bc);
        psk_free(m->be, L->dout);
        psk_free(m->be, L->arg);
        psk_free(m->be, L->din);
        if (!last)
            psk_free(m->be, L->pout);
        if (!last || L->pool)
            psk_free(m->be, L->out);
    }
    m->be = NULL;
}

int psw_cnn_set_accumulate(struct psw_cnn *m, int on)
{
    for (int l = 0; l < m->n && on; l++) {
        struct psw_conv_layer *L = &m->L[l];
        size_t nw = (size_t)L->g.c_out * L->g.c_in * L->g.k * L->g.k;
        if ((L->gwa == NULL && dev(m->be, nw, &L->gwa)) ||
            (L->gba == NULL && dev(m->be, (size_t)L->g.c_out, &L->gba)))
            return PS_ENOMEM;
    }
    m->accumulate = on;
    return 0;
}

int psw_cnn_set_precision(struct psw_cnn *m, int p)
{
    for (int l = 0; l < m->n && p != PSK_PREC_F32; l++) {
        struct psw_conv_layer *L = &m->L[l];
        size_t nw = (size_t)L->g.c_out * L->g.c_in * L->g.k * L->g.k;
        if ((L->wc == NULL && dev(m->be, nw, &L->wc)) ||
            (L->bc == NULL && dev(m->be, (size_t)L->g.c_out, &L->bc)))
            return PS_ENOMEM;
    }
    m->prec = p;
    return 0;
}

/* x[0..n) rounded to the pass's precision. */
static int round16(struct psw_cnn *m, float *x, size_t n)
{
    return psk_round(m->be, m->prec, n, x);
}

/* The weights and bias a pass uses: in 16 bits, copies rounded now. */
static int compute_params(struct psw_cnn *m, struct psw_conv_layer *L, const float **w,
                          const float **b)
{
    *w = L->w;
    *b = L->b;
    if (!m->prec)
        return 0;
    size_t nw = (size_t)L->g.c_out * L->g.c_in * L->g.k * L->g.k, nb = (size_t)L->g.c_out;
    *w = L->wc;
    *b = L->bc;
    return psk_copy(m->be, L->wc, L->w, nw * 4) || psk_copy(m->be, L->bc, L->b, nb * 4) ||
           round16(m, L->wc, nw) || round16(m, L->bc, nb);
}

int psw_cnn_tables(const struct psw_cnn *m)
{
    return 2 * m->n;
}

void psw_cnn_table_name(int k, char *buf, size_t len)
{
    snprintf(buf, len, "conv%d.%s", k / 2 + 1, k % 2 ? "bias" : "weight");
}

int psw_cnn_table_shape(const struct psw_cnn *m, int k, uint64_t *shape)
{
    const struct psk_conv *g = &m->L[k / 2].g;
    shape[0] = (uint64_t)g->c_out;
    if (k % 2)
        return 1;
    shape[1] = (uint64_t)g->c_in;
    shape[2] = shape[3] = (uint64_t)g->k;
    return 4;
}

uint64_t psw_cnn_table_size(const struct psw_cnn *m, int k)
{
    uint64_t s[4];
    int nd = psw_cnn_table_shape(m, k, s);
    return nd == 1 ? s[0] : s[0] * s[1] * s[2] * s[3];
}

uint64_t psw_cnn_fan_in(const struct psw_cnn *m, int k)
{
    const struct psk_conv *g = &m->L[k / 2].g;
    return (uint64_t)g->c_in * g->k * g->k;
}

float *psw_cnn_param(struct psw_cnn *m, int k)
{
    return k % 2 ? m->L[k / 2].b : m->L[k / 2].w;
}

float *psw_cnn_grad(struct psw_cnn *m, int k)
{
    return k % 2 ? m->L[k / 2].gb : m->L[k / 2].gw;
}

/* Each layer's pair of buffers at offsets wo and bo of its struct (the
 * weight and bias, or their gradients) is read from p[2l], p[2l+1] from
 * now on; the layer's own buffers are freed the first time. */
static void place(struct psw_cnn *m, size_t wo, size_t bo, int *placed, float *const *p)
{
    for (int l = 0; l < m->n; l++) {
        float **w = (float **)((char *)&m->L[l] + wo), **b = (float **)((char *)&m->L[l] + bo);
        if (!*placed) {
            psk_free(m->be, *w);
            psk_free(m->be, *b);
        }
        *w = p[2 * l];
        *b = p[2 * l + 1];
    }
    *placed = 1;
}

void psw_cnn_point_params(struct psw_cnn *m, float *const *p)
{
    place(m, offsetof(struct psw_conv_layer, w), offsetof(struct psw_conv_layer, b),
          &m->params_placed, p);
}

void psw_cnn_place_grads(struct psw_cnn *m, float *const *g)
{
    place(m, offsetof(struct psw_conv_layer, gw), offsetof(struct psw_conv_layer, gb),
          &m->grads_placed, g);
}

/* Layer l's input: the batch, or the layer below's output. */
static float *input_of(struct psw_cnn *m, int l)
{
    if (l == 0)
        return m->in;
    struct psw_conv_layer *B = &m->L[l - 1];
    return B->pool ? B->pout : B->out;
}

int psw_cnn_forward(struct psw_cnn *m, int rows)
{
    if (rows < 0 || rows > m->batch_max)
        return PS_EINVAL;
    if (round16(m, m->in, (size_t)rows * m->c0 * m->h0 * m->w0))
        return PS_EDEVICE;
    for (int l = 0; l < m->n; l++) {
        struct psw_conv_layer *L = &m->L[l];
        L->g.n = rows;
        size_t nout = (size_t)rows * L->g.c_out * L->ho * L->wo;
        int planes = rows * L->g.c_out;
        const float *w, *b;
        int rc = compute_params(m, L, &w, &b);
        if (rc == 0)
            rc = psk_conv_forward(m->be, &L->g, input_of(m, l), w, b, L->out, L->ws);
        if (rc == 0)
            rc = round16(m, L->out, nout);
        if (rc == 0 && L->relu)
            rc = psk_relu(m->be, nout, L->out, L->out);
        if (rc == 0 && L->pool)
            rc = L->pool_max
                     ? psk_maxpool(m->be, planes, L->ho, L->wo, L->pool, L->out, L->pout, L->arg)
                     : psk_avgpool(m->be, planes, L->ho, L->wo, L->pool, L->out, L->pout) ||
                           round16(m, L->pout, (size_t)planes * L->ph * L->pw);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int psw_cnn_backward(struct psw_cnn *m, int rows, psw_table_cb cb, void *arg)
{
    float *dy = m->dfeat; /* gradient of the layer's final output */
    for (int l = m->n - 1; l >= 0; l--) {
        struct psw_conv_layer *L = &m->L[l];
        L->g.n = rows;
        size_t nout = (size_t)rows * L->g.c_out * L->ho * L->wo;
        float *d = dy;
        int rc = 0;
        if (L->pool) {
            d = L->dout;
            rc = psk_pool_backward(m->be, rows * L->g.c_out, L->ho, L->wo, L->pool, dy,
                                   L->pool_max ? L->arg : NULL, d);
            if (rc == 0 && !L->pool_max)
                rc = round16(m, d, nout);
        }
        if (rc == 0 && L->relu)
            rc = psk_relu_backward(m->be, nout, L->out, d);
        /* accumulating: into the scratch, then added */
        float *gw = m->accumulate ? L->gwa : L->gw, *gb = m->accumulate ? L->gba : L->gb;
        size_t nw = (size_t)L->g.c_out * L->g.c_in * L->g.k * L->g.k;
        if (rc == 0)
            rc = psk_conv_backward(m->be, &L->g, input_of(m, l), m->prec ? L->wc : L->w, d, gw, gb,
                                   l > 0 ? L->din : NULL, L->ws);
        if (rc == 0 && m->prec)
            rc = round16(m, gw, nw) || round16(m, gb, (size_t)L->g.c_out) ||
                 (l > 0 && round16(m, L->din, (size_t)rows * L->g.c_in * L->g.h * L->g.w));
        if (rc == 0 && m->accumulate &&
            (psk_axpy(m->be, nw, 1.0f, gw, L->gw) ||
             psk_axpy(m->be, (size_t)L->g.c_out, 1.0f, gb, L->gb)))
            rc = PS_EDEVICE;
        if (rc == 0 && cb != NULL)
            rc = cb(arg, 2 * l);
        if (rc != 0)
            return rc;
        dy = L->din;
    }
    return 0;
}
