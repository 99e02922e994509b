/* MLP forward and backward through the psk backend interface. */
#include "mlp.h"

#include "ps_err.h"
#include "ps_opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int psw_mlp_parse_layers(const char *s, int *dims, char *err, size_t errlen)
{
    int n = 0;
    const char *p = s;
    while (*p != '\0') {
        char tok[32];
        size_t len = strcspn(p, ",");
        uint64_t v = 0;
        if (len == 0 || len >= sizeof tok || n > PSW_LAYERS_MAX) {
            snprintf(err, errlen, "--layers: '%s' must be 2..%d comma-separated widths", s,
                     PSW_LAYERS_MAX + 1);
            return PS_EINVAL;
        }
        memcpy(tok, p, len);
        tok[len] = '\0';
        if (ps_parse_u64(tok, 1, PSW_WIDTH_MAX, &v) != 0) {
            snprintf(err, errlen, "--layers: width '%s' is not in [1, %d]", tok, PSW_WIDTH_MAX);
            return PS_EINVAL;
        }
        dims[n++] = (int)v;
        p += len;
        if (*p == ',')
            p++;
    }
    if (n < 2) {
        snprintf(err, errlen, "--layers: '%s' needs at least an input and an output width", s);
        return PS_EINVAL;
    }
    return n - 1;
}

int psw_mlp_tables(const struct psw_mlp *m)
{
    return 2 * m->nlayers;
}

void psw_mlp_table_name(int k, char *buf, size_t len)
{
    snprintf(buf, len, "fc%d.%s", k / 2 + 1, k % 2 ? "bias" : "weight");
}

uint64_t psw_mlp_table_size(const struct psw_mlp *m, int k)
{
    int l = k / 2;
    return k % 2 ? (uint64_t)m->dims[l + 1] : (uint64_t)m->dims[l + 1] * m->dims[l];
}

float *psw_mlp_param(struct psw_mlp *m, int k)
{
    return k % 2 ? m->b[k / 2] : m->w[k / 2];
}

float *psw_mlp_grad(struct psw_mlp *m, int k)
{
    return k % 2 ? m->gb[k / 2] : m->gw[k / 2];
}

static int dev_alloc(struct psw_mlp *m, size_t elems, void **p)
{
    return psk_alloc(m->be, elems * 4u, p);
}

int psw_mlp_init(struct psw_mlp *m, struct psk_backend *be, const int *dims, int nlayers,
                 int batch_max, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    m->be = be;
    m->nlayers = nlayers;
    m->batch_max = batch_max;
    m->chunk_bytes = PSW_CHUNK_BYTES;
    m->loss_scale = 1.0f;
    memcpy(m->dims, dims, (size_t)(nlayers + 1) * sizeof *dims);
    int widest = 0, rc = 0;
    for (int l = 0; l <= nlayers; l++)
        widest = dims[l] > widest ? dims[l] : widest;
    for (int l = 0; l < nlayers && rc == 0; l++) {
        size_t wn = (size_t)dims[l + 1] * dims[l];
        rc = dev_alloc(m, wn, (void **)&m->w[l]) || dev_alloc(m, wn, (void **)&m->gw[l]) ||
             dev_alloc(m, dims[l + 1], (void **)&m->b[l]) ||
             dev_alloc(m, dims[l + 1], (void **)&m->gb[l]);
    }
    for (int l = 0; l <= nlayers && rc == 0; l++)
        rc = dev_alloc(m, (size_t)batch_max * dims[l], (void **)&m->act[l]);
    for (int i = 0; i < 2 && rc == 0; i++)
        rc = dev_alloc(m, (size_t)batch_max * widest, (void **)&m->dz[i]);
    if (rc == 0)
        rc = dev_alloc(m, batch_max, (void **)&m->labels) ||
             dev_alloc(m, batch_max, (void **)&m->row_loss) ||
             dev_alloc(m, batch_max, (void **)&m->pred);
    m->h_loss = malloc((size_t)batch_max * sizeof *m->h_loss);
    m->h_pred = malloc((size_t)batch_max * sizeof *m->h_pred);
    if (rc != 0 || m->h_loss == NULL || m->h_pred == NULL) {
        snprintf(err, errlen, "cannot allocate the model on %s: %s", psk_describe(be),
                 psk_last_error(be));
        psw_mlp_fini(m);
        return PS_ENOMEM;
    }
    return 0;
}

/* Table pairs (weights w[l], biases b[l]) read from p[2l], p[2l+1] from
 * now on; the model's own buffers are freed the first time. */
static void place(struct psw_mlp *m, float **w, float **b, int *placed, float *const *p)
{
    for (int l = 0; l < m->nlayers; l++) {
        if (!*placed) {
            psk_free(m->be, w[l]);
            psk_free(m->be, b[l]);
        }
        w[l] = p[2 * l];
        b[l] = p[2 * l + 1];
    }
    *placed = 1;
}

void psw_mlp_place_grads(struct psw_mlp *m, float *const *g)
{
    place(m, m->gw, m->gb, &m->grads_placed, g);
}

void psw_mlp_point_params(struct psw_mlp *m, float *const *p)
{
    place(m, m->w, m->b, &m->params_placed, p);
}

void psw_mlp_fini(struct psw_mlp *m)
{
    if (m->slots != NULL) { /* slot 0's are the model's own, freed below */
        psw_mlp_use_slot(m, 0);
        for (int i = 1; i < m->nslots; i++)
            for (int l = 0; l <= m->nlayers; l++)
                psk_free(m->be, m->slots[i][l]);
        free(m->slots);
    }
    for (int l = 0; l < PSW_LAYERS_MAX; l++) {
        if (!m->params_placed) {
            psk_free(m->be, m->w[l]);
            psk_free(m->be, m->b[l]);
        }
        if (!m->grads_placed) {
            psk_free(m->be, m->gw[l]);
            psk_free(m->be, m->gb[l]);
        }
    }
    for (int l = 0; l < PSW_LAYERS_MAX; l++) {
        psk_free(m->be, m->wc[l]);
        psk_free(m->be, m->bc[l]);
    }
    for (int l = 0; l <= PSW_LAYERS_MAX; l++)
        psk_free(m->be, m->act[l]);
    psk_free(m->be, m->dx);
    psk_free(m->be, m->dz[0]);
    psk_free(m->be, m->dz[1]);
    psk_free(m->be, m->labels);
    psk_free(m->be, m->row_loss);
    psk_free(m->be, m->pred);
    free(m->h_loss);
    free(m->h_pred);
    memset(m, 0, sizeof *m);
}

int psw_mlp_set_precision(struct psw_mlp *m, int p)
{
    for (int l = 0; l < m->nlayers && p != PSK_PREC_F32; l++) {
        size_t wn = (size_t)m->dims[l + 1] * m->dims[l];
        if ((m->wc[l] == NULL && dev_alloc(m, wn, (void **)&m->wc[l])) ||
            (m->bc[l] == NULL && dev_alloc(m, m->dims[l + 1], (void **)&m->bc[l])))
            return PS_ENOMEM;
    }
    m->prec = p;
    psk_set_precision(m->be, p);
    return 0;
}

/* The weights and biases a pass computes with: the rounded copies in 16
 * bits. */
static const float *wt(const struct psw_mlp *m, int l)
{
    return m->prec ? m->wc[l] : m->w[l];
}

static const float *bias(const struct psw_mlp *m, int l)
{
    return m->prec ? m->bc[l] : m->b[l];
}

/* dst <- src rounded to the pass's precision (n floats). */
static int round_copy(struct psw_mlp *m, float *dst, const float *src, size_t n)
{
    return psk_copy(m->be, dst, src, n * 4) || psk_round(m->be, m->prec, n, dst) ? PS_EDEVICE : 0;
}

static int round16(struct psw_mlp *m, float *x, size_t n)
{
    return psk_round(m->be, m->prec, n, x) ? PS_EDEVICE : 0;
}

void psw_mlp_set_input_relu(struct psw_mlp *m)
{
    m->input_relu = 1;
}

void psw_mlp_set_accumulate(struct psw_mlp *m, int on)
{
    m->accumulate = on;
}

int psw_mlp_set_output_grad(struct psw_mlp *m, int rows, const float *g)
{
    if (rows < 0 || rows > m->batch_max)
        return PS_EINVAL;
    return psk_upload(m->be, m->dz[0], g, (size_t)rows * m->dims[m->nlayers] * sizeof(float))
               ? PS_EDEVICE
               : 0;
}

int psw_mlp_set_slots(struct psw_mlp *m, int n, int rows)
{
    if (m->slots != NULL || n < 1 || n > PSW_SLOTS_MAX || rows < 1 || rows > m->batch_max)
        return PS_EINVAL;
    if ((m->slots = calloc((size_t)n, sizeof *m->slots)) == NULL)
        return PS_ENOMEM;
    m->nslots = n;
    memcpy(m->slots[0], m->act, sizeof m->act);
    for (int i = 1; i < n; i++)
        for (int l = 0; l <= m->nlayers; l++)
            if (dev_alloc(m, (size_t)rows * m->dims[l], (void **)&m->slots[i][l]))
                return PS_ENOMEM; /* fini frees what was made */
    return 0;
}

void psw_mlp_use_slot(struct psw_mlp *m, int i)
{
    memcpy(m->act, m->slots[i], sizeof m->act);
}

int psw_mlp_enable_input_grad(struct psw_mlp *m)
{
    if (m->dx != NULL)
        return 0;
    return dev_alloc(m, (size_t)m->batch_max * m->dims[0], (void **)&m->dx) ? PS_ENOMEM : 0;
}

/* Rows of layer l per chunk: the weight (gradient) in pieces of about
 * chunk_bytes. Backward sends, and forward waits for, the same pieces. */
static int chunk_rows(const struct psw_mlp *m, int l)
{
    int in = m->dims[l], out = m->dims[l + 1];
    size_t bytes = (size_t)out * in * sizeof(float);
    int chunks = (int)((bytes + m->chunk_bytes - 1) / m->chunk_bytes);
    /* whole pieces (see PSW_PIECE_ROWS): a chunk's pieces are the whole
     * pass's */
    int r = (out + chunks - 1) / chunks;
    return (r + PSW_PIECE_ROWS - 1) / PSW_PIECE_ROWS * PSW_PIECE_ROWS;
}

void psw_mlp_set_chunk_bytes(struct psw_mlp *m, size_t bytes)
{
    m->chunk_bytes = bytes > 0 ? bytes : PSW_CHUNK_BYTES;
}

void psw_mlp_set_pool(struct psw_mlp *m, struct ps_pool *pool)
{
    m->pool = pool;
}

/* One product C = op(A) op(B) cut into pieces of PSW_PIECE_ROWS of C's
 * columns (cols) or rows, from 0. */
struct gemm_job {
    struct psw_mlp *m;
    int cols;
    float beta;
    int ta, tb, mm, n, k;
    const float *a;
    int lda;
    const float *b;
    int ldb;
    float *c;
    int ldc;
};

static int gemm_piece(void *ctx, int i)
{
    const struct gemm_job *g = ctx;
    int end = g->cols ? g->n : g->mm, j0 = i * PSW_PIECE_ROWS;
    int j1 = j0 + PSW_PIECE_ROWS < end ? j0 + PSW_PIECE_ROWS : end;
    int rc;
    if (g->cols) /* C[:, j0:j1] from op(B)'s columns j0..j1 */
        rc = psk_gemm(g->m->be, g->ta, g->tb, g->mm, j1 - j0, g->k, 1.0f, g->a, g->lda,
                      g->b + (g->tb ? (size_t)j0 * g->ldb : (size_t)j0), g->ldb, g->beta, g->c + j0,
                      g->ldc);
    else /* C[j0:j1, :] from op(A)'s rows j0..j1 */
        rc = psk_gemm(g->m->be, g->ta, g->tb, j1 - j0, g->n, g->k, 1.0f,
                      g->a + (g->ta ? (size_t)j0 : (size_t)j0 * g->lda), g->lda, g->b, g->ldb,
                      g->beta, g->c + (size_t)j0 * g->ldc, g->ldc);
    return rc ? PS_EDEVICE : 0;
}

/* C = op(A) op(B) + beta C (alpha 1; beta 0 or 1): in pieces when par
 * (shared with the helper when there is one), else in one call. */
static int gemm_beta(struct psw_mlp *m, int par, int cols, float beta, int ta, int tb, int mm,
                     int n, int k, const float *a, int lda, const float *b, int ldb, float *c,
                     int ldc)
{
    if (!par)
        return psk_gemm(m->be, ta, tb, mm, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc) ? PS_EDEVICE
                                                                                     : 0;
    struct gemm_job g = {m, cols, beta, ta, tb, mm, n, k, a, lda, b, ldb, c, ldc};
    return ps_pool_run(m->pool, gemm_piece, &g,
                       ((cols ? n : mm) + PSW_PIECE_ROWS - 1) / PSW_PIECE_ROWS);
}

static int gemm_cut(struct psw_mlp *m, int par, int cols, int ta, int tb, int mm, int n, int k,
                    const float *a, int lda, const float *b, int ldb, float *c, int ldc)
{
    return gemm_beta(m, par, cols, 0.0f, ta, tb, mm, n, k, a, lda, b, ldb, c, ldc);
}

/* Whether a product of mm x n x k goes in pieces: on the CPU backend, when
 * it is big enough (the GPU takes it in one call). */
static int in_pieces(const struct psw_mlp *m, uint64_t mm, uint64_t n, uint64_t k)
{
    return psk_kind_of(m->be) == PSK_CPU && mm * n * k >= PSW_PAR_MACS_MIN;
}

/* Whether layer l's weight products go in pieces. Decided per layer, not
 * per chunk, so that a chunked pass cuts the same pieces as a whole one. */
static int layer_par(const struct psw_mlp *m, int l, int rows)
{
    return in_pieces(m, (uint64_t)rows, (uint64_t)m->dims[l], (uint64_t)m->dims[l + 1]);
}

int psw_mlp_forward_ready(struct psw_mlp *m, int rows, psw_chunk_cb ready, void *arg)
{
    if (round16(m, m->act[0], (size_t)rows * m->dims[0]) ||
        (m->input_relu && psk_relu(m->be, (size_t)rows * m->dims[0], m->act[0], m->act[0])))
        return PS_EDEVICE;
    for (int l = 0; l < m->nlayers; l++) {
        int in = m->dims[l], out = m->dims[l + 1];
        int step = ready ? chunk_rows(m, l) : out, par = layer_par(m, l, rows);
        /* act[l+1][:, r0:r1] = act[l] W[r0:r1]^T, then + b */
        for (int r0 = 0; r0 < out; r0 += step) {
            int r1 = r0 + step < out ? r0 + step : out;
            int rc = ready ? ready(arg, l, r0, r1) : 0;
            size_t at = (size_t)r0 * in;
            if (rc == 0 && m->prec)
                rc = round_copy(m, m->wc[l] + at, m->w[l] + at, (size_t)(r1 - r0) * in);
            if (rc == 0)
                rc = gemm_cut(m, par, 1, 0, 1, rows, r1 - r0, in, m->act[l], in, wt(m, l) + at, in,
                              m->act[l + 1] + r0, out);
            if (rc != 0)
                return rc;
        }
        int rc = ready ? ready(arg, l, out, out) : 0;
        if (rc == 0 && m->prec)
            rc = round_copy(m, m->bc[l], m->b[l], (size_t)out);
        if (rc != 0)
            return rc;
        if (psk_bias_add(m->be, rows, out, bias(m, l), m->act[l + 1]) ||
            round16(m, m->act[l + 1], (size_t)rows * out))
            return PS_EDEVICE;
        if (l + 1 < m->nlayers && psk_relu(m->be, (size_t)rows * out, m->act[l + 1], m->act[l + 1]))
            return PS_EDEVICE;
    }
    return 0;
}

int psw_mlp_forward(struct psw_mlp *m, int rows)
{
    return psw_mlp_forward_ready(m, rows, NULL, NULL);
}

int psw_mlp_loss(struct psw_mlp *m, int rows, const int *labels, double *loss_sum, int *correct)
{
    int classes = m->dims[m->nlayers];
    if (psk_upload(m->be, m->labels, labels, (size_t)rows * sizeof *labels) ||
        psk_softmax_xent(m->be, rows, classes, m->act[m->nlayers], m->labels,
                         m->loss_scale / (float)rows, m->dz[0], m->row_loss, m->pred) ||
        round16(m, m->dz[0], (size_t)rows * classes) ||
        psk_download(m->be, m->h_loss, m->row_loss, (size_t)rows * sizeof(float)) ||
        psk_download(m->be, m->h_pred, m->pred, (size_t)rows * sizeof(int)))
        return PS_EDEVICE;
    double s = 0;
    int ok = 0;
    for (int r = 0; r < rows; r++) {
        s += m->h_loss[r];
        ok += m->h_pred[r] == labels[r];
    }
    *loss_sum = s;
    *correct = ok;
    return 0;
}

/* gW[r0:r1] = dz[:, r0:r1]^T act[l], one chunk of rows at a time. */
static int weight_grad(struct psw_mlp *m, int l, int rows, const float *dz, psw_chunk_cb cb,
                       void *arg)
{
    int in = m->dims[l], out = m->dims[l + 1];
    int step = chunk_rows(m, l), par = layer_par(m, l, rows);
    for (int r0 = 0; r0 < out; r0 += step) {
        int r1 = r0 + step < out ? r0 + step : out;
        int rc = gemm_beta(m, par, 0, m->accumulate ? 1.0f : 0.0f, 1, 0, r1 - r0, in, rows, dz + r0,
                           out, m->act[l], in, m->gw[l] + (size_t)r0 * in, in);
        if (rc == 0)
            rc = round16(m, m->gw[l] + (size_t)r0 * in, (size_t)(r1 - r0) * in);
        if (rc == 0 && cb)
            rc = cb(arg, l, r0, r1);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int psw_mlp_each_chunk(struct psw_mlp *m, psw_chunk_cb cb, void *arg)
{
    for (int l = m->nlayers - 1; l >= 0; l--) {
        int out = m->dims[l + 1], step = chunk_rows(m, l);
        for (int r0 = 0; r0 < out; r0 += step) {
            int rc = cb(arg, l, r0, r0 + step < out ? r0 + step : out);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

int psw_mlp_backward(struct psw_mlp *m, int rows, psw_chunk_cb cb, void *arg)
{
    int cur = 0; /* dz[cur] holds d loss / d (pre-activation of layer l) */
    for (int l = m->nlayers - 1; l >= 0; l--) {
        int in = m->dims[l], out = m->dims[l + 1];
        /* gb = column sums of dz, then gW (out x in) chunk by chunk;
         * accumulating, the sums go through dz[1 - cur], free until dz
         * of the layer below is made there */
        float *gb = m->accumulate ? m->dz[1 - cur] : m->gb[l];
        if (psk_col_sum(m->be, rows, out, m->dz[cur], gb) || round16(m, gb, (size_t)out) ||
            (m->accumulate && psk_axpy(m->be, (size_t)out, 1.0f, gb, m->gb[l])))
            return PS_EDEVICE;
        int rc = weight_grad(m, l, rows, m->dz[cur], cb, arg);
        if (rc != 0)
            return rc;
        if (l == 0 && !m->input_relu) {
            /* dx = dz W (no activation before the first layer) */
            if (m->dx != NULL && (psk_gemm(m->be, 0, 0, rows, in, out, 1.0f, m->dz[cur], out,
                                           wt(m, 0), in, 0.0f, m->dx, in) ||
                                  round16(m, m->dx, (size_t)rows * in)))
                return PS_EDEVICE;
            break;
        }
        if (l == 0) { /* through the input's ReLU, as a layer inside the network */
            if (m->dx != NULL &&
                (gemm_cut(m, in_pieces(m, (uint64_t)rows, (uint64_t)in, (uint64_t)out), 1, 0, 0,
                          rows, in, out, m->dz[cur], out, wt(m, 0), in, m->dx, in) ||
                 round16(m, m->dx, (size_t)rows * in) ||
                 psk_relu_backward(m->be, (size_t)rows * in, m->act[0], m->dx)))
                return PS_EDEVICE;
            break;
        }
        /* dz_prev = (dz W) * relu'(act[l]) */
        if (gemm_cut(m, in_pieces(m, (uint64_t)rows, (uint64_t)in, (uint64_t)out), 1, 0, 0, rows,
                     in, out, m->dz[cur], out, wt(m, l), in, m->dz[1 - cur], in) ||
            round16(m, m->dz[1 - cur], (size_t)rows * in) ||
            psk_relu_backward(m->be, (size_t)rows * in, m->act[l], m->dz[1 - cur]))
            return PS_EDEVICE;
        cur = 1 - cur;
    }
    return 0;
}
