/* Memory for big arrays read at random places. */
#ifndef PS_MEM_H
#define PS_MEM_H

#include <stddef.h>

/* Huge pages are asked for from this size up. */
#define PS_HUGE_PAGE_BYTES (2u << 20)

/* bytes (rounded up to 64) aligned to 64, or from PS_HUGE_PAGE_BYTES up to
 * a huge page with transparent huge pages asked for (madvise), so random
 * accesses do not miss the TLB on every page; zeroed when zero is set.
 * NULL when out of memory; free() releases it. */
void *ps_alloc_big(size_t bytes, int zero);
/* p (from ps_alloc_big, or NULL) grown to bytes the same way: its first
 * old_bytes copied over, then freed. NULL when out of memory, and p is
 * left as it was. */
void *ps_grow_big(void *p, size_t old_bytes, size_t bytes);

#endif
