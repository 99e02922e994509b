/* The model's tables and passes (the MLP, or the CNN and its head), without
 * the network: what each table is called and holds, where its weights
 * and gradients lie, forward and backward. */
#ifndef PSW_MODEL_H
#define PSW_MODEL_H

#include "trainer.h"

#include <stddef.h>
#include <stdint.h>

int psw_ntables(const struct trainer *tr);
uint64_t psw_table_size(const struct trainer *tr, int k);
void psw_table_name(const struct trainer *tr, int k, char *buf, size_t len);
int psw_table_shape(const struct trainer *tr, int k, uint64_t *shape);
uint64_t psw_fan_in(const struct trainer *tr, int k);
float *psw_param(struct trainer *tr, int k);
float *psw_grad(struct trainer *tr, int k);
float *psw_input(struct trainer *tr);
void psw_point_params(struct trainer *tr, float *const *p);
void psw_place_grads(struct trainer *tr, float *const *g);
int psw_model_forward(struct trainer *tr, int rows);
int psw_model_backward(struct trainer *tr, int rows);

#endif
