/* Stand-in for the CUDA backend in builds without the CUDA toolkit: "auto"
 * falls back to the CPU and "cuda" fails with a clear message. */
#include "psk_impl.h"

#include "ps_err.h"

#include <stdio.h>

int psk_cuda_built(void)
{
    return 0;
}

int psk__cuda_open(struct psk_backend *b, int device, char *err, size_t errlen)
{
    (void)b;
    (void)device;
    snprintf(err, errlen, "this build has no CUDA backend (configure with -Dcuda=enabled)");
    return PS_ENODEV;
}
