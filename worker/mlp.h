/* A multilayer perceptron (Linear → ReLU → … → Linear → softmax) on a
 * compute backend. Parameters are named like a PyTorch state_dict:
 * fc1.weight (out x in, row-major), fc1.bias, fc2.weight, … Table k of the
 * model is layer k/2's weight (k even) or bias (k odd).
 *
 * Owns device buffers for weights, gradients and activations sized for
 * `batch_max` rows. Knows nothing about servers: the training loop moves
 * parameters in and gradients out through host buffers. */
#ifndef PSW_MLP_H
#define PSW_MLP_H

#include "ps_pool.h"
#include "psk.h"

#include <stddef.h>
#include <stdint.h>

#define PSW_LAYERS_MAX 16
#define PSW_WIDTH_MAX  65536

struct psw_mlp {
    struct psk_backend *be;
    int nlayers;
    int dims[PSW_LAYERS_MAX + 1];
    int batch_max;
    float *w[PSW_LAYERS_MAX], *b[PSW_LAYERS_MAX];   /* device */
    float *gw[PSW_LAYERS_MAX], *gb[PSW_LAYERS_MAX]; /* device */
    float *act[PSW_LAYERS_MAX + 1];                 /* act[0] = input */
    float *dz[2];                                   /* backprop ping-pong */
    int *labels;                                    /* device */
    float *row_loss;                                /* device */
    int *pred;                                      /* device */
    float *dx;     /* d loss / d input (batch_max x dims[0]), when enabled */
    float *h_loss; /* host copies */
    int *h_pred;
    int grads_placed;     /* gw, gb are the caller's (psw_mlp_place_grads) */
    int params_placed;    /* w, b are the caller's (psw_mlp_point_params) */
    struct ps_pool *pool; /* a helper takes pieces of the big GEMMs, or NULL */
    size_t chunk_bytes;   /* psw_mlp_set_chunk_bytes */
    int prec;             /* enum psk_precision (psw_mlp_set_precision) */
    float *wc[PSW_LAYERS_MAX], *bc[PSW_LAYERS_MAX]; /* 16 bits: the weights rounded */
    float loss_scale;                               /* psw_mlp_loss's gradient is this times
                                                     * the mean loss's (1 unless set) */
    int input_relu;                                 /* psw_mlp_set_input_relu */
    int accumulate;                                 /* psw_mlp_set_accumulate */
    int nslots;                                     /* psw_mlp_set_slots (0: none) */
    float *(*slots)[PSW_LAYERS_MAX + 1];            /* each slot's act[] */
};

/* Parses "784,256,128,10" into dims; returns the number of layers or
 * PS_EINVAL with a message. */
int psw_mlp_parse_layers(const char *s, int *dims, char *err, size_t errlen);

int psw_mlp_init(struct psw_mlp *m, struct psk_backend *be, const int *dims, int nlayers,
                 int batch_max, char *err, size_t errlen);
void psw_mlp_fini(struct psw_mlp *m);

/* CPU backend: backward writes table k's gradient into g[k] (host memory
 * of the caller's that outlives the model, e.g. a region shared with the
 * servers) from now on, instead of buffers of its own. */
void psw_mlp_place_grads(struct psw_mlp *m, float *const *g);
/* CPU backend: table k's weights are read from p[k] from now on (the
 * caller's host memory, which outlives the model); may be called again
 * with other buffers (a worker alternating two sets between steps). */
void psw_mlp_point_params(struct psw_mlp *m, float *const *p);

/* On the CPU backend the big GEMMs (PSW_PAR_MACS_MIN multiply-adds and up)
 * run in pieces of PSW_PIECE_ROWS output rows or columns, always: with a pool
 * (ps_pool.h, CPU backend) its helper shares them with this thread,
 * without one (NULL) this thread runs them in turn. The pieces are the
 * same either way, and so are the results, to the bit. 16 rows balanced
 * best on a 2-core machine where psd shares the helper's core: 32 and 64
 * left the training thread waiting for the helper's last piece. */
#define PSW_PIECE_ROWS   16
#define PSW_PAR_MACS_MIN (256u * 1024u)
void psw_mlp_set_pool(struct psw_mlp *m, struct ps_pool *pool);

/* Mixed precision (enum psk_precision), as PyTorch's autocast computes a
 * Linear layer: from now on each pass uses a copy of the weights and
 * biases rounded to p (made as they arrive), and rounds every tensor it
 * makes (the input, each layer's output, the logits' gradient, each
 * gradient) to p; GEMMs accumulate in f32. The loss and softmax stay
 * f32; the gradients backward leaves are 16-bit values kept as f32. */
int psw_mlp_set_precision(struct psw_mlp *m, int p);

/* Makes backward also compute the gradient with respect to the input
 * (into m->dx), for models that train what feeds the MLP (embeddings). */
int psw_mlp_enable_input_grad(struct psw_mlp *m);

/* A pipeline stage after the first: ReLU is applied to the input (the
 * previous stage's last layer is linear, so its output is what the
 * unsplit network's layer gives before its ReLU), and the input gradient
 * (with psw_mlp_enable_input_grad) is taken through that ReLU: what the
 * previous stage's backward starts from. */
void psw_mlp_set_input_relu(struct psw_mlp *m);

/* While on, backward adds its weight and bias gradients to what gw and
 * gb hold instead of overwriting them (a product's beta 1): the
 * micro-batches of a pipeline's step summed in place, in their order. */
void psw_mlp_set_accumulate(struct psw_mlp *m, int on);

/* Sets d loss / d output (rows x the last width, host memory) for a
 * backward pass that starts from it instead of psw_mlp_loss: a pipeline
 * stage before the last, given its output's gradient by the next one. */
int psw_mlp_set_output_grad(struct psw_mlp *m, int rows, const float *g);

/* Activation slots: each holds a pass's activations (act[0..nlayers]),
 * so several micro-batches can be between their forward and backward
 * passes. Slot 0 is the model's own (batch_max rows); slots 1..n-1 take
 * rows rows each. The temporaries of backward are shared: one backward
 * at a time. */
#define PSW_SLOTS_MAX 1025
int psw_mlp_set_slots(struct psw_mlp *m, int n, int rows);
/* Passes use slot i's activations from now on (its act[0] is the input). */
void psw_mlp_use_slot(struct psw_mlp *m, int i);

int psw_mlp_tables(const struct psw_mlp *m);
/* Name ("fc2.bias"), element count, and the device buffers of table k. */
void psw_mlp_table_name(int k, char *buf, size_t len);
uint64_t psw_mlp_table_size(const struct psw_mlp *m, int k);
float *psw_mlp_param(struct psw_mlp *m, int k);
float *psw_mlp_grad(struct psw_mlp *m, int k);

/* Forward pass over `rows` inputs already in act[0]; logits end in
 * act[nlayers]. */
int psw_mlp_forward(struct psw_mlp *m, int rows);

/* Loss of the last forward pass against labels (host array, uploaded), the
 * logits gradient of the mean loss, and the count of correct predictions. */
int psw_mlp_loss(struct psw_mlp *m, int rows, const int *labels, double *loss_sum, int *correct);

/* Weight gradients are produced in row chunks of about this many bytes, so
 * a big layer's first rows can be on the wire while its last are computed.
 * Through shared memory nothing is on the wire: there each request's cost
 * is its thread wake-ups, and fewer, larger chunks are faster (1+1 with
 * 1 MiB: psd's CPU a step 340 -> 240 us, 77-86k -> 89-95k samples/s). */
#define PSW_CHUNK_BYTES     (256u * 1024u)
#define PSW_CHUNK_BYTES_SHM (1024u * 1024u)
/* Chunk size from now on (PSW_CHUNK_BYTES until set); the chunks are cut
 * in whole pieces, so the results are the same, to the bit. */
void psw_mlp_set_chunk_bytes(struct psw_mlp *m, size_t bytes);

/* Called when rows [row0, row1) of layer l's weight gradient (table 2l) are
 * ready; with the last chunk (row1 == dims[l+1]) the bias gradient (table
 * 2l+1) is ready too. Layers go from the last to the first. */
typedef int (*psw_chunk_cb)(void *arg, int layer, int row0, int row1);

/* Backward pass after psw_mlp_loss; calls cb for each chunk as it finishes. */
int psw_mlp_backward(struct psw_mlp *m, int rows, psw_chunk_cb cb, void *arg);

/* cb for every chunk, in backward's order, without computing anything:
 * the gradients of a backward pass run without a callback go out later
 * (a step whose loss scaling first checks them all). */
int psw_mlp_each_chunk(struct psw_mlp *m, psw_chunk_cb cb, void *arg);

/* psw_mlp_forward, layer by layer in the same row chunks as backward's:
 * ready(arg, l, r0, r1) is called before rows [r0, r1) of layer l's
 * weight are used, and ready(arg, l, out, out) (r0 == r1) before its bias,
 * so weights still arriving can be waited for piece by piece. A nonzero
 * return stops the pass with it. */
int psw_mlp_forward_ready(struct psw_mlp *m, int rows, psw_chunk_cb ready, void *arg);

#endif
