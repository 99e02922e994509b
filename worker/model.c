/* The model a trainer trains: an MLP, or a CNN (a convolutional front
 * whose tables come first, k < k0, then its MLP head). Everything the
 * trainer does per table goes through these. */
#include "model.h"

#include "ps_err.h"

int psw_ntables(const struct trainer *tr)
{
    return tr->k0 + psw_mlp_tables(&tr->mlp);
}

uint64_t psw_table_size(const struct trainer *tr, int k)
{
    return k < tr->k0 ? psw_cnn_table_size(&tr->cnn, k) : psw_mlp_table_size(&tr->mlp, k - tr->k0);
}

void psw_table_name(const struct trainer *tr, int k, char *buf, size_t len)
{
    if (k < tr->k0)
        psw_cnn_table_name(k, buf, len);
    else
        psw_mlp_table_name(k - tr->k0 + 2 * tr->fc0, buf, len);
}

int psw_table_shape(const struct trainer *tr, int k, uint64_t *shape)
{
    if (k < tr->k0)
        return psw_cnn_table_shape(&tr->cnn, k, shape);
    int j = k - tr->k0, l = j / 2;
    shape[0] = (uint64_t)tr->mlp.dims[l + 1];
    if (j % 2)
        return 1;
    shape[1] = (uint64_t)tr->mlp.dims[l];
    return 2;
}

uint64_t psw_fan_in(const struct trainer *tr, int k)
{
    return k < tr->k0 ? psw_cnn_fan_in(&tr->cnn, k) : (uint64_t)tr->mlp.dims[(k - tr->k0) / 2];
}

float *psw_param(struct trainer *tr, int k)
{
    return k < tr->k0 ? psw_cnn_param(&tr->cnn, k) : psw_mlp_param(&tr->mlp, k - tr->k0);
}

float *psw_grad(struct trainer *tr, int k)
{
    return k < tr->k0 ? psw_cnn_grad(&tr->cnn, k) : psw_mlp_grad(&tr->mlp, k - tr->k0);
}

float *psw_input(struct trainer *tr)
{
    return tr->k0 > 0 ? tr->cnn.in : tr->mlp.act[0];
}

void psw_point_params(struct trainer *tr, float *const *p)
{
    if (tr->k0 > 0)
        psw_cnn_point_params(&tr->cnn, p);
    psw_mlp_point_params(&tr->mlp, p + tr->k0);
}

void psw_place_grads(struct trainer *tr, float *const *g)
{
    if (tr->k0 > 0)
        psw_cnn_place_grads(&tr->cnn, g);
    psw_mlp_place_grads(&tr->mlp, g + tr->k0);
}

int psw_model_forward(struct trainer *tr, int rows)
{
    int rc = tr->k0 > 0 ? psw_cnn_forward(&tr->cnn, rows) : 0;
    return rc != 0 ? rc : psw_mlp_forward(&tr->mlp, rows);
}

/* Backward (no gradient leaves: standalone, or sent afterwards). */
int psw_model_backward(struct trainer *tr, int rows)
{
    int rc = psw_mlp_backward(&tr->mlp, rows, NULL, tr);
    if (rc == 0 && tr->k0 > 0)
        rc = psw_cnn_backward(&tr->cnn, rows, NULL, tr);
    return rc;
}
