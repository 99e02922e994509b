/* The steps of a run: micro-batches, loss scaling, rejoining, progress,
 * evaluation; and the sparse logistic regression's run. */
#ifndef PSW_TRAIN_H
#define PSW_TRAIN_H

#include "trainer.h"

#include <stddef.h>
#include <stdint.h>

int psw_train(struct trainer *tr, double *accuracy);
int psw_run_sparse_lr(struct trainer *tr);

#endif
