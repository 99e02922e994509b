"""psd.Link: the link between neighbouring stages of a pipeline
(libpsclient's psc_link; worker/README.md, "Links between pipeline
stages"). Stage s sends a micro-batch's activations forward to s + 1 and
receives their gradient back; every message carries its step,
micro-batch, dtype and shape, and the receiver checks them against its
bytes_max before it hands them over. psd.torch.PipelineStage is built on
it; this class is for pipelines of other frameworks."""
from __future__ import annotations

import ctypes
from typing import Any, NoReturn, Sequence

import numpy as np
import numpy.typing as npt

from . import _lib
from .client import library
from .errors import error

FORWARD, BACKWARD = 0, 1  # enum psc_link_dir

_DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}  # enum psc_dtype
_NUMPY = {0: np.float32, 1: np.float16}


class Link:
    """One process's link to the stages before and after it.

    stage, stages: this stage (0-based) and the pipeline's count (>= 2);
    listen: stage > 0, where stage - 1 connects ("tcp://*:5590"; port 0
    picks one: endpoint); next: stage < stages - 1, where stage + 1
    listens; window: activations sent whose gradient has not come back, at
    most (1..1024); bytes_max: the largest tensor either way; timeout_ms:
    a neighbour silent this long (no ZeroMQ heartbeat) is gone.

    CURVE between stages: curve_keypair=(public, secret), this stage's
    (Z85 text, as psd --keygen writes); curve_server_key, the public key
    stage + 1 holds; curve_allow, the public keys stage - 1 may connect
    with. Both default to this stage's own public key: stages that share
    one key pair."""

    def __init__(self, stage: int, stages: int, *, listen: str | None = None,
                 next: str | None = None, window: int = 1, bytes_max: int = 64 << 20,
                 timeout_ms: int = 2000, curve_keypair: tuple[str, str] | None = None,
                 curve_server_key: str | None = None,
                 curve_allow: Sequence[str] | None = None) -> None:
        self._l: ctypes.c_void_p | None = None
        self._lib, _ = library()
        self._keep: list[Any] = [s.encode() if s is not None else None for s in (listen, next)]
        cfg = _lib.LinkConfig(stage=int(stage), stages=int(stages), listen=self._keep[0],
                              next=self._keep[1], window=int(window), bytes_max=int(bytes_max),
                              timeout_ms=int(timeout_ms))
        if curve_keypair is not None:
            pub, sec = curve_keypair
            allow = list(curve_allow) if curve_allow is not None else [pub]
            keys = [k.encode() for k in [pub, sec, curve_server_key or pub] + allow]
            arr = (ctypes.c_char_p * len(allow))(*keys[3:])
            self._keep += keys + [arr]
            cfg.curve_public, cfg.curve_secret = keys[0], keys[1]
            if int(stage) + 1 < int(stages):
                cfg.curve_server_key = keys[2]
            if int(stage) > 0:
                cfg.curve_allow, cfg.ncurve_allow = arr, len(allow)
        handle = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        rc = self._lib.psc_link_create(ctypes.byref(cfg), ctypes.byref(handle), err, len(err))
        if rc != 0:
            raise error(rc, self._lib.psc_err_name(rc).decode(), err.value.decode(errors="replace"))
        self._l = handle
        self.stage, self.stages = int(stage), int(stages)

    def _raise(self, rc: int) -> NoReturn:
        raise error(rc, self._lib.psc_err_name(rc).decode(),
                    self._lib.psc_link_error(self._l).decode(errors="replace"))

    def _open(self) -> ctypes.c_void_p:
        if self._l is None:
            raise ValueError("the link is closed")
        return self._l

    @property
    def endpoint(self) -> str:
        """Where this stage listens for the one before ("" for stage 0)."""
        return str(self._lib.psc_link_endpoint(self._open()).decode())

    @property
    def in_flight(self) -> int:
        """Activations sent whose gradient has not come back."""
        return int(self._lib.psc_link_in_flight(self._open()))

    def bytes(self) -> tuple[int, int]:
        """(sent, received): bytes of tensors to and from the neighbours."""
        s, r = ctypes.c_uint64(), ctypes.c_uint64()
        self._lib.psc_link_bytes(self._open(), ctypes.byref(s), ctypes.byref(r))
        return s.value, r.value

    def wait_connected(self, timeout_ms: int) -> None:
        """Waits until both neighbours have connected; psd.TimeoutError
        names those that have not."""
        rc = self._lib.psc_link_wait_connected(self._open(), int(timeout_ms))
        if rc != 0:
            self._raise(rc)

    def send(self, direction: int, array: npt.ArrayLike, step: int, micro: int,
             eval: bool = False) -> None:
        """Sends array (float32 or float16, C-contiguous, 1 to 8
        dimensions) toward direction (FORWARD: to stage + 1, BACKWARD: to
        stage - 1); the values are copied."""
        a = np.ascontiguousarray(array)
        if a.dtype not in _DTYPES:
            raise TypeError("send: float32 or float16 values (got %s)" % a.dtype)
        if not 1 <= a.ndim <= _lib.SHAPE_DIMS_MAX:
            raise ValueError("send: 1 to %d dimensions (got %d)" % (_lib.SHAPE_DIMS_MAX, a.ndim))
        t = _lib.Tensor(step=int(step), micro=int(micro), dtype=_DTYPES[a.dtype], ndims=a.ndim,
                        data=a.ctypes.data, eval=1 if eval else 0)
        for i, d in enumerate(a.shape):
            t.shape[i] = d
        rc = self._lib.psc_link_send(self._open(), int(direction), ctypes.byref(t))
        if rc != 0:
            self._raise(rc)

    def recv(self, direction: int, timeout_ms: int) -> tuple[np.ndarray, int, int, bool]:
        """The next tensor from direction (FORWARD: activations from stage
        - 1, BACKWARD: a gradient from stage + 1), waiting up to
        timeout_ms (< 0: as long as the neighbour is there): (array, step,
        micro, eval), the array a copy of its own. psd.ConnectionError
        when the neighbour is gone, psd.TimeoutError when it sent nothing
        in time, another psd.Error when what it sent is refused (it is
        told why)."""
        t = _lib.Tensor()
        rc = self._lib.psc_link_recv(self._open(), int(direction), int(timeout_ms),
                                     ctypes.byref(t))
        if rc != 0:
            self._raise(rc)
        shape = tuple(t.shape[i] for i in range(t.ndims))
        dt = np.dtype(_NUMPY[t.dtype]) if t.dtype in _NUMPY else None
        if dt is None:
            raise TypeError("recv: a tensor of dtype %d (bf16), which numpy has not" % t.dtype)
        n = int(np.prod(shape, dtype=np.int64))
        buf = (ctypes.c_char * (n * dt.itemsize)).from_address(t.data)
        return (np.frombuffer(memoryview(buf), dt).reshape(shape).copy(), int(t.step), int(t.micro),
                bool(t.eval))

    def close(self) -> None:
        """Closes the link; what was sent still goes, for up to timeout_ms,
        unless its neighbour is gone."""
        if self._l is not None:
            self._lib.psc_link_destroy(self._l)
            self._l = None

    def __enter__(self) -> Link:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
