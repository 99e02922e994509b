/* Error code names and texts generated from the PS_ERR_MAP list. */
#include "ps_err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

const char *ps_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
#define PS_ERR_TEXT(name, value, text)                                                             \
    case value:                                                                                    \
        return text;
        PS_ERR_MAP(PS_ERR_TEXT)
#undef PS_ERR_TEXT
    default:
        return "unknown error";
    }
}

const char *ps_err_name(int err)
{
    switch (err) {
    case 0:
        return "OK";
#define PS_ERR_NAME(name, value, text)                                                             \
    case value:                                                                                    \
        return "PS_" #name;
        PS_ERR_MAP(PS_ERR_NAME)
#undef PS_ERR_NAME
    default:
        return "PS_E?";
    }
}

int ps_err_known(int err)
{
    switch (err) {
#define PS_ERR_CASE(name, value, text) case value:
        PS_ERR_MAP(PS_ERR_CASE)
#undef PS_ERR_CASE
        return 1;
    default:
        return 0;
    }
}

int ps_err_from_errno(int errnum)
{
    switch (errnum) {
    case ENOMEM:
        return PS_ENOMEM;
    case EINVAL:
        return PS_EINVAL;
    case EAGAIN:
        return PS_EAGAIN;
    case ETIMEDOUT:
        return PS_ETIMEDOUT;
    case EBUSY:
        return PS_EBUSY;
    case EPROTO:
        return PS_EPROTO;
    case ERANGE:
        return PS_ERANGE;
    case ENODEV:
        return PS_ENODEV;
    case ENOTSUP:
        return PS_ENOTSUP;
    default:
        return PS_EIO;
    }
}

int ps_errf(int code, char *err, size_t errlen, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}
