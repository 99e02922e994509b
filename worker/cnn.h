/* The convolutional front of psworker's CNN (--model cnn): convolution
 * layers, each followed by an optional ReLU and an optional pooling, on a
 * compute backend. The last layer's output, flattened per image as
 * torch.flatten(x, 1) does, is the input of an MLP head (mlp.h), so
 * --arch conv3x3:32,relu,maxpool2,conv3x3:64,relu,maxpool2,fc:128,relu,fc:10
 * is the PyTorch model
 *     conv1 = Conv2d(1, 32, 3); conv2 = Conv2d(32, 64, 3);
 *     fc1 = Linear(1600, 128); fc2 = Linear(128, 10)
 * with ReLU after each, 2x2 max-pools after the convolutions. Tables are
 * named as its state_dict: conv1.weight [32, 1, 3, 3], conv1.bias [32],
 * ..., then the head's fc1.weight, ... */
#ifndef PSW_CNN_H
#define PSW_CNN_H

#include "mlp.h"
#include "psk.h"

#include <stddef.h>
#include <stdint.h>

#define PSW_CONV_MAX 8

struct psw_conv_layer {
    struct psk_conv g;        /* g.n is the rows of the pass */
    int relu, pool, pool_max; /* pool: its window (0: none); max or average */
    int ho, wo, ph, pw;       /* the convolution's output, and after pooling */
    float *w, *b, *gw, *gb;   /* device; w, b, gw, gb may be the caller's */
    float *out;               /* the convolution's output, ReLU applied in place */
    float *pout;              /* after pooling (NULL: no pooling) */
    int *arg;                 /* max pooling's argmax */
    float *dout;              /* gradient of out (pooled layers) */
    float *din;               /* gradient of this layer's input (not layer 0) */
    float *ws;                /* psk_conv workspace */
    float *wc, *bc;           /* 16 bits: w and b rounded (psw_cnn_set_precision) */
    float *gwa, *gba;         /* accumulating: a pass's own gradients (psw_cnn_set_accumulate) */
};

/* A slot's activations (psw_cnn_set_slots): what backward reads of a
 * forward pass. */
struct psw_cnn_slot {
    float *in, *feat;
    float *out[PSW_CONV_MAX], *pout[PSW_CONV_MAX];
    int *arg[PSW_CONV_MAX];
};

struct psw_cnn {
    struct psk_backend *be;
    int n; /* layers */
    struct psw_conv_layer L[PSW_CONV_MAX];
    int c0, h0, w0, batch_max;
    float *in;    /* the input batch (batch_max x c0 x h0 x w0) */
    float *feat;  /* the head's input: the last layer writes it */
    float *dfeat; /* the head's input gradient: backward starts from it */
    int params_placed, grads_placed;
    int prec; /* enum psk_precision */
    int accumulate;
    int nslots;
    struct psw_cnn_slot *slots;
};

/* Parses --arch for images of c0 channels, h0 x w0: the convolution layers
 * into m (their geometry) and the head into dims (dims[0]: the flattened
 * features; then each fc's width). Returns the head's layer count, or
 * PS_EINVAL with what is wrong in err. */
int psw_cnn_parse(struct psw_cnn *m, const char *arch, int c0, int h0, int w0, int *dims, char *err,
                  size_t errlen);
/* Allocates the layers' buffers for batch_max images; the last layer
 * writes feat, and backward reads dfeat (the head's act[0] and dx). */
int psw_cnn_init(struct psw_cnn *m, struct psk_backend *be, int batch_max, float *feat,
                 float *dfeat, char *err, size_t errlen);
void psw_cnn_fini(struct psw_cnn *m);

/* Mixed precision, as psw_mlp_set_precision: each pass rounds the
 * weights (a copy), the input, every layer's output and every gradient to
 * p (enum psk_precision). */
int psw_cnn_set_precision(struct psw_cnn *m, int p);

int psw_cnn_tables(const struct psw_cnn *m);
void psw_cnn_table_name(int k, char *buf, size_t len);
uint64_t psw_cnn_table_size(const struct psw_cnn *m, int k);
/* Table k's shape (OIHW for a weight, [c_out] for a bias); returns its
 * number of dimensions. */
int psw_cnn_table_shape(const struct psw_cnn *m, int k, uint64_t *shape);
/* Inputs each output of table k's layer sums over (He initialisation). */
uint64_t psw_cnn_fan_in(const struct psw_cnn *m, int k);
float *psw_cnn_param(struct psw_cnn *m, int k);
float *psw_cnn_grad(struct psw_cnn *m, int k);
/* CPU backend: read weights from p[k], write gradients into g[k] (the
 * caller's host buffers), as psw_mlp_point_params and psw_mlp_place_grads. */
void psw_cnn_point_params(struct psw_cnn *m, float *const *p);
void psw_cnn_place_grads(struct psw_cnn *m, float *const *g);

/* Activation slots, as psw_mlp_set_slots: slot 0 is the model's own;
 * slots 1..n-1 take rows images each, and slot i's last layer writes
 * feats[i] (the head's act[0] in its slot i). */
int psw_cnn_set_slots(struct psw_cnn *m, int n, int rows, float *const *feats);
void psw_cnn_use_slot(struct psw_cnn *m, int i);

/* While on, backward adds its gradients to gw and gb (as
 * psw_mlp_set_accumulate); 0, or PS_ENOMEM for its scratch. */
int psw_cnn_set_accumulate(struct psw_cnn *m, int on);

/* in (rows images) -> feat. */
int psw_cnn_forward(struct psw_cnn *m, int rows);
/* From dfeat, layer by layer from the last: the weight and bias
 * gradients of layer l, then cb(arg, 2 l) (NULL: none), so they can be
 * sent while the layers below are computed. */
typedef int (*psw_table_cb)(void *arg, int k);
int psw_cnn_backward(struct psw_cnn *m, int rows, psw_table_cb cb, void *arg);

#endif
