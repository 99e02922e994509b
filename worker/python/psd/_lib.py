"""libpsclient through ctypes: finding the library, the structs it takes,
and the prototypes of the functions the package calls."""
from __future__ import annotations

import ctypes
import glob
import os
from typing import Any, Iterator

# enum psc_dtype, enum psc_optimizer, enum psc_init (psclient.h)
DTYPES = {"f32": 0, "f16": 1, "bf16": 2}
OPTIMIZERS = {"sgd": 0, "momentum": 1, "adagrad": 2, "adam": 3, "ftrl": 4,
              "rowwise_adagrad": 5}
INITS = {"zeros": 0, "constant": 1, "uniform": 2, "normal": 3}
LR_SCHEDULES = {"constant": 0, "cosine": 1}

HELLO_WAITING = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32),
                                 ctypes.c_uint32, ctypes.c_int, ctypes.c_char_p)


# The number in libpsclient.so.N this package speaks (PSC_ABI_VERSION).
ABI_VERSION = 1
LIBRARY = "libpsclient.so.%d" % ABI_VERSION


class _Sized(ctypes.Structure):
    """A struct of psclient.h that grows: its first member, struct_size, is
    set to the size this package lays it out with, so a library with more
    fields takes their defaults (psclient.h, "ABI")."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.struct_size = ctypes.sizeof(self)


class Config(_Sized):
    """struct psc_config"""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("servers", ctypes.POINTER(ctypes.c_char_p)),
        ("nservers", ctypes.c_size_t),
        ("worker_id", ctypes.c_uint32),
        ("connect_timeout_ms", ctypes.c_int),
        ("hello_optional", ctypes.c_int),
        ("wire_dtype", ctypes.c_int),
        ("nonzero_pulls", ctypes.c_int),
        ("retry_ms", ctypes.c_int),
        ("heartbeat_ms", ctypes.c_int),
        ("local_ipc", ctypes.c_int),
        ("shm_bytes", ctypes.c_size_t),
        ("piece_bytes", ctypes.c_size_t),
        ("io_cpus", ctypes.POINTER(ctypes.c_int)),
        ("nio_cpus", ctypes.c_int),
        ("curve_server_key", ctypes.c_char_p),
        ("curve_public", ctypes.c_char_p),
        ("curve_secret", ctypes.c_char_p),
        ("hello_waiting", HELLO_WAITING),
        ("hello_waiting_arg", ctypes.c_void_p),
        ("zmq_context", ctypes.c_void_p),
    ]


class Vote(_Sized):
    """struct psc_vote"""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("table", ctypes.c_uint32),
        ("clock", ctypes.c_uint64),
        ("bsp", ctypes.c_int),
        ("grad", ctypes.c_float),
        ("share", ctypes.c_float),
    ]


class TableSpec(_Sized):
    """struct psc_table_spec"""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("name", ctypes.c_char_p),
        ("size", ctypes.c_uint64),
        ("optimizer", ctypes.c_int),
        ("lr", ctypes.c_float),
        ("weight_decay", ctypes.c_float),
        ("momentum", ctypes.c_float),
        ("nesterov", ctypes.c_int),
        ("beta1", ctypes.c_float),
        ("beta2", ctypes.c_float),
        ("eps", ctypes.c_float),
        ("init", ctypes.c_int),
        ("init_scale", ctypes.c_float),
        ("seed", ctypes.c_uint64),
        ("lr_schedule", ctypes.c_int),
        ("lr_decay_steps", ctypes.c_uint64),
        ("sparse", ctypes.c_int),
        ("dim", ctypes.c_uint32),
        ("rows_max", ctypes.c_uint64),
        ("l1", ctypes.c_float),
        ("l2", ctypes.c_float),
        ("await_set", ctypes.c_int),
        ("shape", ctypes.POINTER(ctypes.c_uint64)),
        ("ndims", ctypes.c_uint32),
        ("pushers", ctypes.POINTER(ctypes.c_uint32)),
        ("npushers", ctypes.c_uint32),
        ("admit_counters", ctypes.c_uint64),
        ("evict_after", ctypes.c_uint64),
        ("admit_after", ctypes.c_uint32),
        ("evict_at_budget", ctypes.c_int),
        ("evict_after_s", ctypes.c_uint64),
        ("evict_half_life", ctypes.c_uint64),
    ]

SHAPE_DIMS_MAX = 8  # PSC_SHAPE_DIMS_MAX


class LinkConfig(_Sized):
    """struct psc_link_config"""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("stage", ctypes.c_uint32),
        ("stages", ctypes.c_uint32),
        ("listen", ctypes.c_char_p),
        ("next", ctypes.c_char_p),
        ("window", ctypes.c_uint32),
        ("bytes_max", ctypes.c_uint64),
        ("timeout_ms", ctypes.c_int),
        ("curve_public", ctypes.c_char_p),
        ("curve_secret", ctypes.c_char_p),
        ("curve_server_key", ctypes.c_char_p),
        ("curve_allow", ctypes.POINTER(ctypes.c_char_p)),
        ("ncurve_allow", ctypes.c_size_t),
    ]


class Tensor(_Sized):
    """struct psc_tensor"""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("step", ctypes.c_uint64),
        ("micro", ctypes.c_uint32),
        ("dtype", ctypes.c_int),
        ("ndims", ctypes.c_uint32),
        ("shape", ctypes.c_uint64 * SHAPE_DIMS_MAX),
        ("data", ctypes.c_void_p),
        ("eval", ctypes.c_int),
    ]


def _candidates() -> Iterator[tuple[str, str]]:
    """Where the library may be, in the order tried."""
    env = os.environ.get("PSD_LIBPSCLIENT")
    if env:
        yield env, "PSD_LIBPSCLIENT"
        return
    here = os.path.dirname(os.path.abspath(__file__))
    # a wheel carries its own copy beside the package
    yield os.path.join(here, "libpsclient.so"), "beside the package (a wheel's)"
    yield os.path.join(here, LIBRARY), "beside the package"
    # a build tree next to the source tree this package sits in
    # (worker/python/psd -> the top of the tree is three folders up)
    top = os.path.normpath(os.path.join(here, "..", "..", ".."))
    for lib in sorted(glob.glob(os.path.join(top, "*", "worker", "client", LIBRARY))):
        yield lib, "the build tree"
    yield LIBRARY, "the loader"


def load() -> tuple[ctypes.CDLL, str]:
    """The library and its path, checked; ImportError saying where it
    looked and what it found otherwise."""
    tried: list[str] = []
    for path, where in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append("%s (%s): no such file" % (path, where))
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s): %s" % (path, where, e))
            continue
        try:
            abi = lib.psc_abi_version
        except AttributeError:
            tried.append("%s (%s): no psc_abi_version: a libpsclient older than ABI %d"
                         % (path, where, ABI_VERSION))
            continue
        abi.restype, abi.argtypes = ctypes.c_int, []
        if abi() != ABI_VERSION:
            tried.append("%s (%s): ABI %d, this package speaks %d"
                         % (path, where, abi(), ABI_VERSION))
            continue
        _prototypes(lib)
        return lib, path
    hint = ""
    missing = sorted({m for t in tried for m in _DEPS if m in t})
    if missing:  # found, but a library it links is not installed
        hint = ("\nlibpsclient needs %s, not installed here (Debian 12: apt-get install %s)."
                % (", ".join(missing), " ".join(_DEPS[m] for m in missing)))
    raise ImportError("psd: cannot load libpsclient. Tried:\n  " + "\n  ".join(tried) + hint +
                      "\nInstall it (meson install, or pip install of the psd wheel), or set "
                      "PSD_LIBPSCLIENT to the path of %s (in a build tree: "
                      "BUILD/worker/client/)." % LIBRARY)


# What libpsclient links, by the Debian package that has it.
_DEPS = {"libzmq.so.5": "libzmq5", "libprotobuf-c.so.1": "libprotobuf-c1",
         "libsodium.so.23": "libsodium23"}


def _prototypes(lib: ctypes.CDLL) -> None:
    P, c = ctypes.POINTER, ctypes
    client = c.c_void_p
    fl = P(c.c_float)
    u64p = P(c.c_uint64)
    protos: dict[str, tuple[Any, list[Any]]] = {
        "psc_create": (c.c_int, [P(Config), P(client), c.c_char_p, c.c_size_t]),
        "psc_destroy": (None, [client]),
        "psc_last_error": (c.c_char_p, [client]),
        "psc_last_remote": (c.c_int, [client]),
        "psc_strerror": (c.c_char_p, [c.c_int]),
        "psc_err_name": (c.c_char_p, [c.c_int]),
        "psc_table_spec_init_sized": (None, [P(TableSpec), c.c_size_t, c.c_char_p, c.c_uint64]),
        "psc_table_create": (c.c_int, [client, P(TableSpec), c.c_int, P(c.c_uint32)]),
        "psc_table_open": (c.c_int, [client, c.c_char_p, c.c_int, P(c.c_uint32)]),
        "psc_pull": (c.c_int, [client, c.c_uint32, c.c_uint64, c.c_uint64, fl, c.c_uint64, u64p]),
        "psc_push": (c.c_int, [client, c.c_uint32, c.c_uint64, c.c_uint64, fl, c.c_uint64, u64p]),
        "psc_push_pull": (c.c_int, [client, c.c_uint32, c.c_uint64, c.c_uint64, fl, fl, c.c_uint64,
                                    u64p]),
        "psc_pull_rows": (c.c_int, [client, c.c_uint32, u64p, c.c_size_t, fl, c.c_uint64, u64p]),
        "psc_push_rows": (c.c_int, [client, c.c_uint32, u64p, c.c_size_t, fl, c.c_uint64, u64p]),
        "psc_push_pull_rows": (c.c_int, [client, c.c_uint32, u64p, c.c_size_t, fl, fl, c.c_uint64,
                                         u64p]),
        "psc_set": (c.c_int, [client, c.c_uint32, c.c_uint64, c.c_uint64, fl, u64p]),
        "psc_wait": (c.c_int, [client, c.c_uint64, c.c_int]),
        "psc_cancel": (c.c_int, [client, c.c_uint64]),
        "psc_start_clock": (c.c_uint64, [client]),
        "psc_shards": (c.c_uint32, [client]),
        "psc_endpoint": (c.c_char_p, [client, c.c_uint32]),
        "psc_failovers": (c.c_uint64, [client]),
        "psc_heartbeat": (None, [client]),
        "psc_cork": (c.c_int, [client, c.c_int]),
        "psc_push_keys": (c.c_int, [client, c.c_uint32, u64p, fl, c.c_size_t, c.c_uint64, u64p]),
        "psc_topk_count": (c.c_uint64, [c.c_uint64, c.c_double]),
        "psc_vote_open": (c.c_int, [client, c.c_char_p, c.c_int, P(Vote)]),
        "psc_servers_parse": (c.c_int, [c.c_char_p, c.c_char_p, c.c_size_t, P(c.c_char_p),
                                        c.c_size_t, P(c.c_size_t), c.c_char_p, c.c_size_t]),
        "psc_auto_rank": (c.c_int, [u64p, c.c_char_p, c.c_size_t]),
        "psc_auto_workers": (c.c_int, [u64p, c.c_char_p, c.c_size_t]),
        "psc_vote": (c.c_int, [client, P(Vote), c.c_int, c.c_int, P(c.c_int)]),
        "psc_topk_select": (c.c_int, [c.c_uint64, fl, fl, fl, c.c_float, c.c_uint64, u64p, fl]),
        "psc_link_create": (c.c_int, [P(LinkConfig), P(c.c_void_p), c.c_char_p, c.c_size_t]),
        "psc_link_destroy": (None, [c.c_void_p]),
        "psc_link_endpoint": (c.c_char_p, [c.c_void_p]),
        "psc_link_wait_connected": (c.c_int, [c.c_void_p, c.c_int]),
        "psc_link_send": (c.c_int, [c.c_void_p, c.c_int, P(Tensor)]),
        "psc_link_recv": (c.c_int, [c.c_void_p, c.c_int, c.c_int, P(Tensor)]),
        "psc_link_error": (c.c_char_p, [c.c_void_p]),
        "psc_link_in_flight": (c.c_uint32, [c.c_void_p]),
        "psc_link_bytes": (None, [c.c_void_p, u64p, u64p]),
        "psc_mirror_open": (c.c_int, [client, c.c_uint32, c.c_uint64, c.c_uint64, fl,
                                      P(c.c_void_p)]),
        "psc_mirror_pull": (c.c_int, [client, c.c_void_p, c.c_uint64, u64p]),
        "psc_mirror_reset": (None, [c.c_void_p]),
        "psc_mirror_counts": (None, [c.c_void_p, u64p, u64p]),
        "psc_mirror_close": (c.c_int, [client, c.c_void_p]),
    }
    for name, (res, args) in protos.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
