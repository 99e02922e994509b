/* The structs of psclient.h that grow: each begins with struct_size, the
 * caller's sizeof. A struct comes in through psc__sized_in, which copies
 * what the caller has into the library's own (zeroed) struct, and goes
 * out through psc__sized_out, which writes only what the caller has room
 * for (psclient.h, "ABI"). */
#include "sized_impl.h"

#include "ps_err.h"
#include "ps_limits.h"

#include <string.h>

int psc_abi_version(void)
{
    return PSC_ABI_VERSION;
}

/* The caller's struct_size, checked against the first version's size and
 * (for a larger struct) that nothing this library does not know is set. */
static int check(const void *caller, size_t ours, size_t first, int in, const char *what, char *err,
                 size_t errlen)
{
    if (caller == NULL)
        return ps_errf(PS_EINVAL, err, errlen, "struct %s: NULL", what);
    size_t n;
    memcpy(&n, caller, sizeof n);
    if (n < first)
        return ps_errf(PS_EINVAL, err, errlen,
                       "struct %s: struct_size is %zu, at least %zu expected (set it to "
                       "sizeof(struct %s))",
                       what, n, first, what);
    if (in && n > ours) {
        const unsigned char *b = caller;
        for (size_t i = ours; i < n; i++)
            if (b[i] != 0)
                return ps_errf(PS_EINVAL, err, errlen,
                               "struct %s: %zu bytes, and a field past the %zu this library "
                               "knows is set (the program was built against a newer "
                               "psclient.h than this libpsclient: install that one)",
                               what, n, ours);
    }
    return 0;
}

int psc__sized_in(void *ours, size_t ours_size, size_t first, const void *caller, const char *what,
                  char *err, size_t errlen)
{
    int rc = check(caller, ours_size, first, 1, what, err, errlen);
    if (rc != 0)
        return rc;
    size_t n;
    memcpy(&n, caller, sizeof n);
    memset(ours, 0, ours_size);
    memcpy(ours, caller, n < ours_size ? n : ours_size);
    memcpy(ours, &ours_size, sizeof ours_size);
    return 0;
}

int psc__sized_check_out(const void *caller, size_t ours_size, size_t first, const char *what,
                         char *err, size_t errlen)
{
    return check(caller, ours_size, first, 0, what, err, errlen);
}

size_t psc__sized_size(const void *caller)
{
    size_t n;
    memcpy(&n, caller, sizeof n);
    return n;
}

void psc__sized_out(void *caller, const void *ours, size_t ours_size)
{
    size_t n = psc__sized_size(caller);
    memcpy((char *)caller + sizeof n, (const char *)ours + sizeof n,
           (n < ours_size ? n : ours_size) - sizeof n);
    if (n > ours_size)
        memset((char *)caller + ours_size, 0, n - ours_size);
}
