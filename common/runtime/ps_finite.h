/* Finding a non-finite float (NaN or an infinity) in an array: psd checks
 * every gradient it is pushed before it applies or acknowledges it.
 * Not a kernel: it runs on the CPU, beside the network. */
#ifndef PS_FINITE_H
#define PS_FINITE_H

#include <stddef.h>

/* The index of the first NaN or infinity in x[0..n), or n when none. */
size_t ps_first_nonfinite(const float *x, size_t n);

#endif
