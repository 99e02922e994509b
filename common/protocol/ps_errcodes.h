/* The PS_E* codes: what psd's functions, libpsclient's calls and a
 * reply's status return. Installed with psclient.h; nothing but macros
 * and an enum. The list is one X-macro so the code, its name and its text
 * cannot drift apart. Codes travel on the wire as a reply's status, so
 * their values are stable: append only. */
#ifndef PS_ERRCODES_H
#define PS_ERRCODES_H

#define PS_ERR_MAP(X)                                                                              \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(EPROTO, -3, "malformed message")                                                             \
    X(EVERSION, -4, "unsupported protocol version")                                                \
    X(EOP, -5, "unknown operation")                                                                \
    X(EFRAMES, -6, "wrong number of frames")                                                       \
    X(ESIZE, -7, "frame size does not match header")                                               \
    X(ERANGE, -8, "range outside the table")                                                       \
    X(ENOTABLE, -9, "no such table")                                                               \
    X(EEXIST, -10, "table exists with a different spec")                                           \
    X(ELIMIT, -11, "limit exceeded")                                                               \
    X(ETIMEDOUT, -12, "timed out")                                                                 \
    X(EAGAIN, -13, "resource temporarily unavailable")                                             \
    X(EBUSY, -14, "busy")                                                                          \
    X(EIO, -15, "input/output error")                                                              \
    X(EZMQ, -16, "zeromq error")                                                                   \
    X(EDTYPE, -17, "unsupported dtype")                                                            \
    X(ECLOSED, -18, "closed")                                                                      \
    X(ESTATE, -19, "wrong state")                                                                  \
    X(EREMOTE, -20, "error reply from server")                                                     \
    X(ENOTSUP, -21, "not supported")                                                               \
    X(ENODEV, -22, "no such device")                                                               \
    X(EDEVICE, -23, "device error")                                                                \
    X(ESHM, -24, "no shared memory region")                                                        \
    X(EAUTH, -25, "refused by the server's security")                                              \
    X(ENOTPRIMARY, -26, "not the shard's primary")

enum ps_err {
#define PS_ERR_ENUM(name, value, text) PS_##name = (value),
    PS_ERR_MAP(PS_ERR_ENUM)
#undef PS_ERR_ENUM
};

#endif
