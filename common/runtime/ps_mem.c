#include "ps_mem.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

void *ps_alloc_big(size_t bytes, int zero)
{
    bytes = bytes == 0 ? 64 : (bytes + 63u) & ~(size_t)63u;
    void *p;
    if (bytes >= PS_HUGE_PAGE_BYTES) {
        bytes = (bytes + PS_HUGE_PAGE_BYTES - 1) & ~(size_t)(PS_HUGE_PAGE_BYTES - 1);
        if ((p = aligned_alloc(PS_HUGE_PAGE_BYTES, bytes)) != NULL)
            madvise(p, bytes, MADV_HUGEPAGE); /* a hint: a refusal changes nothing */
    } else {
        p = aligned_alloc(64, bytes);
    }
    if (p != NULL && zero)
        memset(p, 0, bytes);
    return p;
}

void *ps_grow_big(void *p, size_t old_bytes, size_t bytes)
{
    void *q = ps_alloc_big(bytes, 0);
    if (q == NULL)
        return NULL;
    if (p != NULL)
        memcpy(q, p, old_bytes < bytes ? old_bytes : bytes);
    free(p);
    return q;
}
