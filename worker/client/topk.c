/* Top-k with error feedback on host buffers (psclient.h). */
#include "client_impl.h"

#include "psk_select.h"

#include <math.h>

uint64_t psc_topk_count(uint64_t n, double ratio)
{
    if (!(ratio > 0.0 && ratio <= 1.0) || n == 0)
        return 0;
    double k = ceil(ratio * (double)n);
    return k < 1.0 ? 1 : (k > (double)n ? n : (uint64_t)k);
}

int psc_topk_select(uint64_t n, const float *grad, float *resid, float *vel, float momentum,
                    uint64_t k, uint64_t *idx, float *val)
{
    if (grad == NULL || resid == NULL || idx == NULL || val == NULL || k == 0 || k > n ||
        !isfinite(momentum))
        return PS_EINVAL;
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(grad[i]))
            return PS_EINVAL;
    if (vel != NULL) {
        for (uint64_t i = 0; i < n; i++) {
            vel[i] = momentum * vel[i] + grad[i];
            resid[i] += vel[i];
        }
    } else {
        for (uint64_t i = 0; i < n; i++)
            resid[i] += grad[i];
    }
    return psk_topk_host((size_t)n, resid, vel, (size_t)k, idx, val);
}
