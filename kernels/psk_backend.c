/* What every backend shares with the others (psk_impl.h): its last
 * error, which psk_last_error reads. Below psk.c and the backends, so
 * neither calls the other back. */
#include "psk_impl.h"

#include <stdarg.h>
#include <stdio.h>

void psk__set_error(struct psk_backend *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err, sizeof b->err, fmt, ap);
    va_end(ap);
}
