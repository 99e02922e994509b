/* Error codes shared by every psd component (the list: ps_errcodes.h).
 *
 * Functions return 0 on success or a negative PS_E* code. This file does
 * not translate errno/zmq/CUDA errors; callers do that once, where the
 * error happens (ps_err_from_errno helps). */
#ifndef PS_ERR_H
#define PS_ERR_H

#include <stddef.h>

#include "ps_errcodes.h"

/* Text for a code; never NULL (unknown codes get a fixed string). */
const char *ps_strerror(int err);
/* Symbolic name ("PS_EINVAL"); never NULL. */
const char *ps_err_name(int err);
/* Map an errno value to the closest PS_E* code. */
int ps_err_from_errno(int errnum);
/* 1 when err is one of the codes above. */
int ps_err_known(int err);
/* Writes a sentence into err (when not NULL and errlen > 0) and returns
 * code: the one way checks report what was wrong. */
int ps_errf(int code, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
