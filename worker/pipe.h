/* Pipelines (--stages P): this process is one stage of one pipeline, a
 * contiguous run of the model's layers. Each step it runs the step's M
 * micro-batches (--microbatches) through its layers in the order of the
 * schedule (--schedule gpipe or 1f1b), takes the activations of each from
 * the stage before and its gradient from the stage after over a psc_link,
 * sums the micro-batches' weight gradients in a fixed order and pushes
 * them to psd once. The pipelines (--workers / P of them) train one model:
 * stage s of every pipeline pushes the same tables, whose rounds wait for
 * those processes only. */
#ifndef PSW_PIPE_H
#define PSW_PIPE_H

#include "trainer.h"

#include <stddef.h>
#include <stdint.h>

/* The head layers [*first, *end) this stage runs, of the nl layers in
 * dims (the whole model's head; a CNN's convolutions go with stage 0):
 * from --cuts, or cut where the stages' multiply-adds balance best. 0, or
 * PS_EINVAL with what is wrong. */
int psw_pipe_plan(struct trainer *tr, const int *dims, int nl, int *first, int *end, char *err,
                  size_t errlen);

/* After the model and its tables are set up: the activation slots the
 * schedule needs and the link to the neighbours, waited for. */
int psw_pipe_start(struct trainer *tr, char *err, size_t errlen);
void psw_pipe_stop(struct trainer *tr);

/* The run: the epochs' steps, evaluation through the pipeline (each
 * stage learns the accuracy the last one measured). */
int psw_pipe_train(struct trainer *tr, double *accuracy);

/* The schedule's order of one step's passes, for the tests and the
 * docs: writes M forwards (+1 + j) and M backwards (-1 - j) of stage s
 * of P into order[0..2M). */
void psw_pipe_order(int gpipe, uint32_t s, uint32_t p, uint32_t m, int *order);

#endif
