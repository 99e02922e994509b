"""psd.Client: a connection to every shard of a psd cluster, its tables,
and asynchronous pushes and pulls of numpy arrays or CPU torch tensors."""
from __future__ import annotations

import ctypes
import os
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence, Union

import numpy as np
import numpy.typing as npt

from . import _lib
from . import errors
from .errors import error

if TYPE_CHECKING:
    import torch

# What pushes and pulls take: a float32 numpy array or a CPU torch tensor.
Buffer = Union[np.ndarray, "torch.Tensor"]
# Keys of rows: integers, strictly increasing (a numpy array, a CPU torch
# tensor or a sequence).
Keys = Union[npt.ArrayLike, "torch.Tensor"]

_lib_handle: tuple[ctypes.CDLL, str] | None = None


def library() -> tuple[ctypes.CDLL, str]:
    """(the loaded libpsclient, its path); loaded on first use."""
    global _lib_handle
    if _lib_handle is None:
        _lib_handle = _lib.load()
    return _lib_handle


_RANK_VARS = ("JOB_COMPLETION_INDEX", "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
_WORKERS_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PSD_WORKERS")


def _servers_of(lib: ctypes.CDLL, servers: str | Iterable[str] | None) -> list[str]:
    """A list of endpoints from a list, or from text with hostlist ranges
    ("tcp://psd-[0-3].psd:5570"), expanded by libpsclient as psworker
    expands --servers."""
    if servers is None:
        servers = os.environ.get("PSD_SERVERS")
        if not servers:
            raise ValueError("servers: none given, and PSD_SERVERS is not set")
    if isinstance(servers, str):
        buf = ctypes.create_string_buffer(65536)
        eps = (ctypes.c_char_p * 4096)()
        n = ctypes.c_size_t()
        err = ctypes.create_string_buffer(512)
        rc = lib.psc_servers_parse(servers.encode(), buf, len(buf), eps, len(eps),
                                   ctypes.byref(n), err, len(err))
        if rc != 0:
            raise ValueError(err.value.decode(errors="replace"))
        return [(eps[i] or b"").decode() for i in range(n.value)]
    servers = list(servers)
    if not servers or any(not isinstance(s, str) or not s for s in servers):
        raise ValueError("servers: a comma-separated string or a list of endpoints, shard 0 "
                         "first (got %r)" % (servers,))
    return servers


def _from_env(lib: ctypes.CDLL, value: int | None, arg: str, fn: Callable[..., int],
              names: Sequence[str], default: int) -> int:
    """value; else the first of the environment variables names that is
    set (libpsclient's psc_auto_rank/psc_auto_workers, as psworker --rank
    auto); else default."""
    if value is None and any(os.environ.get(n) is not None for n in names):
        out = ctypes.c_uint64()
        err = ctypes.create_string_buffer(512)
        if fn(ctypes.byref(out), err, len(err)) != 0:
            raise ValueError(err.value.decode(errors="replace"))
        return out.value
    v = default if value is None else value
    if not isinstance(v, int) or v < 0:
        raise ValueError("%s must be an integer >= 0 (got %r)" % (arg, v))
    return v


def _as_f32(arg: str, a: Any, writable: bool) -> np.ndarray:
    """A float32 view of numpy array or CPU torch tensor a, without a copy;
    TypeError or ValueError naming arg when it cannot be one."""
    if type(a).__module__.startswith("torch"):
        if a.device.type != "cpu":
            raise TypeError("%s: a CPU tensor is needed (got one on %s)" % (arg, a.device))
        if not a.is_contiguous():
            raise ValueError("%s: the tensor is not contiguous (call .contiguous())" % arg)
        if a.requires_grad and writable:
            raise ValueError("%s: a tensor that requires grad cannot be written into; pass "
                             "tensor.data" % arg)
        a = a.detach().numpy()
    if not isinstance(a, np.ndarray):
        raise TypeError("%s: a numpy array or a CPU torch tensor is needed (got %s)"
                        % (arg, type(a).__name__))
    if a.dtype != np.float32:
        raise TypeError("%s: float32 values are needed (got %s)" % (arg, a.dtype))
    if not a.flags.c_contiguous:
        raise ValueError("%s: the array is not C-contiguous (np.ascontiguousarray)" % arg)
    if writable and not a.flags.writeable:
        raise ValueError("%s: the array is read-only" % arg)
    return a


def _as_keys(arg: str, k: Any) -> np.ndarray:
    if type(k).__module__.startswith("torch"):
        k = k.detach().cpu().numpy()
    k = np.asarray(k)
    if k.ndim != 1 or k.dtype.kind not in "iu":
        raise TypeError("%s: a 1-D array of integer keys is needed (got %s of %s)"
                        % (arg, k.shape, k.dtype))
    if k.dtype.kind == "i" and k.size and k.min() < 0:
        raise ValueError("%s: keys are uint64; got a negative one" % arg)
    k = np.ascontiguousarray(k, dtype=np.uint64)
    if k.size > 1 and not np.all(k[1:] > k[:-1]):
        raise ValueError("%s: keys must be strictly increasing (np.unique sorts and drops "
                         "repeats)" % arg)
    return k


def _ptr(a: np.ndarray) -> Any:
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def _keys_ptr(k: np.ndarray) -> Any:
    return k.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64))


class Handle:
    """An asynchronous push, pull or push-pull in flight. The arrays it was
    given belong to the library until wait() returns (or raises anything
    but psd.TimeoutError, after which it may be waited for again)."""

    def __init__(self, client: Client, ticket: int, keep: list[Any]) -> None:
        self._client = client
        self._ticket = ticket
        self._keep: list[Any] | None = keep  # the buffers the library reads or writes
        self.done = False

    def wait(self, timeout_ms: int | None = None) -> Any:
        """Waits for every shard's reply (timeout_ms None: the client's
        timeout; <0: forever). Returns the output array of a pull, else
        None."""
        if self.done:
            raise ValueError("wait: this handle was waited for already")
        c = self._client
        c._check_open()
        t = c.timeout_ms if timeout_ms is None else int(timeout_ms)
        with c._lock:
            rc = c._lib.psc_wait(c._c, self._ticket, t)
            err = c._error(rc, "wait") if rc != 0 else None
        if err is not None and rc == c._timedout:
            raise err  # the ticket, and the buffers, stay the library's
        self.done = True
        keep, self._keep = self._keep, None
        if err is not None:
            raise err
        return keep[-1] if keep and keep[-1] is not None else None

    def cancel(self) -> None:
        """Gives the buffers back without waiting (the shards may still
        apply a push)."""
        if not self.done:
            c = self._client
            c._check_open()
            c._call("cancel", c._lib.psc_cancel, self._ticket)
            self.done = True
            self._keep = None


class Mirror:
    """A dense table's weights (or a range of them) kept in a float32
    array, values: each pull() asks the shards for the elements written
    since the last and gets those alone where that is smaller (with top-k
    pushes and plain SGD, about what the pushes touched), the whole range
    the first time. values belongs to the library until close(): read it
    between pulls, never write it (after writing it anyway, reset() makes
    the next pull whole). Made by Client.mirror(); one pull at a time."""

    def __init__(self, client: Client, name: str, handle: ctypes.c_void_p, values: np.ndarray,
                 keep: Buffer) -> None:
        self._client = client
        self.name = name
        self._m: ctypes.c_void_p | None = handle
        self.values = values
        self._keep = keep  # the caller's buffer (a torch tensor over values)

    def _handle(self) -> ctypes.c_void_p:
        self._client._check_open()
        if self._m is None:
            raise ValueError("mirror of %r: closed" % self.name)
        return self._m

    def pull(self) -> Handle:
        """Brings values up to this worker's clock of the table, as
        Client.pull does. Returns a Handle whose wait() returns values."""
        m, c = self._handle(), self._client
        ticket = ctypes.c_uint64()
        c._call("mirror pull %r" % self.name, c._lib.psc_mirror_pull, m, c._clock[self.name],
                ctypes.byref(ticket))
        return Handle(c, ticket.value, [self._keep])

    def counts(self) -> tuple[int, int]:
        """(parts answered with the changes alone, parts answered whole) so
        far."""
        m, c = self._handle(), self._client
        changed, whole = ctypes.c_uint64(), ctypes.c_uint64()
        c._lib.psc_mirror_counts(m, ctypes.byref(changed), ctypes.byref(whole))
        return changed.value, whole.value

    def reset(self) -> None:
        """values was written: the next pull brings the whole range."""
        self._client._lib.psc_mirror_reset(self._handle())

    def close(self) -> None:
        """Lets go of values (cancelling a pull in flight)."""
        c = self._client
        if self._m is not None and c._c is not None:
            c._call("mirror close %r" % self.name, c._lib.psc_mirror_close, self._m)
        self._m = None


class _Cork:
    def __init__(self, client: Client) -> None:
        self._client = client

    def __enter__(self) -> Client:
        c = self._client
        c._check_open()
        c._call("cork", c._lib.psc_cork, 1)
        return c

    def __exit__(self, *exc: object) -> None:
        c = self._client
        if c._c is not None:
            c._call("uncork", c._lib.psc_cork, 0)


class TopK:
    """Top-k with error feedback for one dense table of n elements, on the
    host (libpsclient's psc_topk_select: the code psworker --topk runs).
    select(grad) adds grad to the residual (through a local velocity when
    momentum is given: DGC's momentum correction, with the table then on
    plain sgd) and takes the ceil(ratio * n) entries largest in magnitude
    out of it; what stays is sent in later steps. The keys and values it
    returns are this object's buffers: push them (Client.push_keys) and
    wait before the next select."""

    def __init__(self, n: int, ratio: float, momentum: float | None = None) -> None:
        lib, _ = library()
        if not isinstance(n, int) or n <= 0:
            raise ValueError("n: a positive number of elements is needed (got %r)" % (n,))
        if not isinstance(ratio, (int, float)) or not 0.0 < ratio <= 1.0:
            raise ValueError("ratio: a fraction in (0, 1] is needed (got %r)" % (ratio,))
        self._lib = lib
        self.n = n
        self.k: int = int(lib.psc_topk_count(n, float(ratio)))
        self.momentum = momentum
        self.residual = np.zeros(n, np.float32)
        self.velocity: np.ndarray | None = np.zeros(n, np.float32) if momentum is not None else None
        self._keys = np.zeros(self.k, np.uint64)
        self._vals = np.zeros(self.k, np.float32)

    def select(self, grad: Buffer) -> tuple[np.ndarray, np.ndarray]:
        """(keys, values): the k entries to push for gradient grad."""
        g = _as_f32("grad", grad, False)
        if g.size != self.n:
            raise ValueError("grad: %d elements, this TopK holds %d" % (g.size, self.n))
        vel = _ptr(self.velocity) if self.velocity is not None else None
        rc = self._lib.psc_topk_select(self.n, _ptr(g), _ptr(self.residual), vel,
                                       float(self.momentum or 0.0), self.k,
                                       _keys_ptr(self._keys), _ptr(self._vals))
        if rc != 0:
            if not np.all(np.isfinite(g)):
                raise ValueError("grad: holds a NaN or an infinity (nothing was added)")
            raise error(rc, self._lib.psc_err_name(rc).decode(), "topk select: %s"
                        % self._lib.psc_strerror(rc).decode())
        return self._keys, self._vals


class Client:
    """A connection to every shard of a psd cluster.

    servers: "tcp://h:p,tcp://h:p" or a list, shard 0 first, or a pattern
    as psworker's --servers takes ("tcp://psd-[0-3].psd:5570"; default: the
    PSD_SERVERS environment variable); rank: this worker's id (default: the
    first of JOB_COMPLETION_INDEX, RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK
    that is set, else 0); workers: how many workers train (default: the
    first of WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE, PSD_WORKERS,
    else 1). Use it as a context manager, or call close().

    The library is used from one thread at a time: every call holds the
    client's lock. A thread of the client's own says it is alive to the
    shards every heartbeat_ms while the caller computes without calling
    (an evaluation or a checkpoint save longer than psd's
    --worker-timeout does not get the worker dropped); heartbeat_ms < 0
    turns it off."""

    def __init__(self, servers: str | Sequence[str] | None = None, rank: int | None = None,
                 workers: int | None = None, *, timeout_ms: int = 10000, wire_dtype: str = "f32",
                 curve_server_key: str | None = None,
                 curve_keypair: tuple[str, str] | None = None, local_ipc: bool = True,
                 retry_ms: int = 0, heartbeat_ms: int = 0) -> None:
        self._c: ctypes.c_void_p | None = None
        self._beat: threading.Thread | None = None
        self._lib, self.library_path = library()
        servers = _servers_of(self._lib, servers)
        self.rank = _from_env(self._lib, rank, "rank", self._lib.psc_auto_rank, _RANK_VARS, 0)
        self.workers = _from_env(self._lib, workers, "workers", self._lib.psc_auto_workers,
                                 _WORKERS_VARS, 1)
        if self.workers < 1 or self.rank >= self.workers:
            raise ValueError("rank %d is not in [0, workers=%d)" % (self.rank, self.workers))
        if wire_dtype not in _lib.DTYPES:
            raise ValueError("wire_dtype: one of %s (got %r)"
                             % (", ".join(_lib.DTYPES), wire_dtype))
        if (curve_server_key is None) != (curve_keypair is None):
            raise ValueError("curve_server_key and curve_keypair go together")
        self.timeout_ms = int(timeout_ms)
        self.wire_dtype = wire_dtype
        self._timedout = errors.PS_ETIMEDOUT
        arr = (ctypes.c_char_p * len(servers))(*[s.encode() for s in servers])
        cfg = _lib.Config(servers=arr, nservers=len(servers), worker_id=self.rank,
                          connect_timeout_ms=self.timeout_ms,
                          wire_dtype=_lib.DTYPES[wire_dtype], retry_ms=int(retry_ms),
                          heartbeat_ms=int(heartbeat_ms), local_ipc=1 if local_ipc else 0)
        keep: list[Any] = [arr]
        if curve_server_key is not None and curve_keypair is not None:
            pub, sec = curve_keypair
            keep += [curve_server_key.encode(), pub.encode(), sec.encode()]
            cfg.curve_server_key, cfg.curve_public, cfg.curve_secret = keep[1:]
        handle = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        rc = self._lib.psc_create(ctypes.byref(cfg), ctypes.byref(handle), err, len(err))
        if rc != 0:
            raise error(rc, self._lib.psc_err_name(rc).decode(),
                        err.value.decode(errors="replace") or "cannot connect")
        self._c = handle
        self._pid = os.getpid()
        self.servers = servers
        self.shards: int = self._lib.psc_shards(self._c)
        # name -> (client table id, size or None, dim or None)
        self._tables: dict[str, tuple[int, int | None, int | None]] = {}
        self._clock: dict[str, int] = {}  # name -> the clock of this worker's next push
        self._votes: dict[str, _lib.Vote] = {}  # name -> its struct psc_vote
        self._mirrors: list[Mirror] = []  # psc_destroy closes them
        self.start_clock: int = self._lib.psc_start_clock(self._c)
        self._lock = threading.Lock()
        if heartbeat_ms >= 0:
            self._stop = threading.Event()
            every = (heartbeat_ms or 1000) / 2000.0  # PSC_HEARTBEAT_MS_DEFAULT, twice per period
            self._beat = threading.Thread(target=self._heartbeats, args=(every,),
                                          name="psd-heartbeat", daemon=True)
            self._beat.start()

    def _heartbeats(self, every: float) -> None:
        """Tells the shards this worker is alive while no call is under way
        (a call under way sends its own)."""
        while not self._stop.wait(every):
            if self._lock.acquire(blocking=False):
                try:
                    if self._c is not None:
                        self._lib.psc_heartbeat(self._c)
                finally:
                    self._lock.release()

    def endpoint(self, shard: int = 0) -> str:
        """The endpoint this client talks to for shard: one of its replicas
        (they move when a primary goes), or its same-host socket."""
        self._check_open()
        return self._lib.psc_endpoint(self._c, shard).decode()

    @property
    def failovers(self) -> int:
        """Moves from one replica of a shard to another so far."""
        self._check_open()
        return int(self._lib.psc_failovers(self._c))

    # -- lifetime -----------------------------------------------------------
    def close(self) -> None:
        """Closes the connections; pushes not waited for may be lost."""
        if self._beat is not None and os.getpid() == self._pid:
            self._stop.set()
            self._beat.join()
        self._beat = None
        if self._c is not None:
            if os.getpid() == self._pid:
                with self._lock:
                    self._lib.psc_destroy(self._c)
            self._c = None
            for m in self._mirrors:
                m._m = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _check_open(self) -> None:
        if self._c is None:
            raise ValueError("the client is closed")
        if os.getpid() != self._pid:
            raise RuntimeError("this psd.Client was made in process %d; a forked child (a "
                               "DataLoader worker?) must make its own" % self._pid)

    def _call(self, what: str, fn: Callable[..., int], *args: Any) -> None:
        """fn(client, *args) under the lock; a failure raises its Error,
        read under the same lock (no heartbeat in between)."""
        with self._lock:
            rc = fn(self._c, *args)
            if rc != 0:
                raise self._error(rc, what)

    def _error(self, rc: int, what: str) -> errors.Error:
        text = self._lib.psc_last_error(self._c).decode(errors="replace") if self._c else ""
        if rc == errors.PS_EREMOTE and self._c:  # the kind is the shard's own code
            rc = self._lib.psc_last_remote(self._c) or rc
        name = self._lib.psc_err_name(rc).decode()
        return error(rc, name, "%s: %s" % (what, text or self._lib.psc_strerror(rc).decode()))

    # -- tables -------------------------------------------------------------
    def _spec(self, name: str, size: int, optimizer: str, lr: float, init: str,
              init_scale: float, seed: int, hyper: dict[str, Any]) -> tuple[_lib.TableSpec, bytes]:
        if not isinstance(name, str) or not name:
            raise ValueError("name: a non-empty string is needed")
        if optimizer not in _lib.OPTIMIZERS:
            raise ValueError("optimizer: one of %s (got %r)"
                             % (", ".join(_lib.OPTIMIZERS), optimizer))
        if init not in _lib.INITS:
            raise ValueError("init: one of %s (got %r)" % (", ".join(_lib.INITS), init))
        spec = _lib.TableSpec()
        bname = name.encode()
        self._lib.psc_table_spec_init_sized(ctypes.byref(spec), ctypes.sizeof(spec), bname, size)
        spec.optimizer = _lib.OPTIMIZERS[optimizer]
        spec.lr = lr
        spec.init = _lib.INITS[init]
        spec.init_scale = init_scale
        spec.seed = seed
        for k, v in hyper.items():
            if k == "lr_schedule":
                if v not in _lib.LR_SCHEDULES:
                    raise ValueError("lr_schedule: one of %s (got %r)"
                                     % (", ".join(_lib.LR_SCHEDULES), v))
                v = _lib.LR_SCHEDULES[v]
            elif k not in ("weight_decay", "momentum", "nesterov", "beta1", "beta2", "eps",
                           "lr_decay_steps", "l1", "l2"):
                raise TypeError("unknown table option %r" % k)
            setattr(spec, k, v)
        return spec, bname

    def _create(self, name: str, spec: _lib.TableSpec, bname: bytes, size: int | None,
                dim: int | None) -> str:
        t = ctypes.c_uint32()
        self._call("create_table %r" % name, self._lib.psc_table_create, ctypes.byref(spec),
                   self.timeout_ms, ctypes.byref(t))
        del bname
        self._tables[name] = (t.value, size, dim)
        self._clock.setdefault(name, self.start_clock)
        return name

    def create_table(self, name: str, size: int | Sequence[int], optimizer: str = "sgd",
                     lr: float = 0.01, *, init: str = "zeros", init_scale: float = 0.0,
                     seed: int = 0, await_set: bool = False,
                     pushers: Sequence[int] | None = None, **hyper: Any) -> str:
        """Creates a dense table on every shard (or opens it when one of that
        name has the same spec): size float32 elements, or a shape (a tuple
        such as (32, 1, 3, 3): the table holds their product, and psctl
        export writes the tensor with that shape). optimizer: sgd,
        momentum, adagrad, adam or ftrl; hyper: weight_decay, momentum,
        nesterov, beta1, beta2, eps, lr_schedule, lr_decay_steps, l1, l2.
        await_set: pulls wait until a worker has set the initial values
        (set_weights), so every worker starts from the same model.
        pushers: the worker ids that push the table (a pipeline stage's
        processes), strictly increasing; its bsp and ssp rounds wait for
        them alone and another worker's push is refused (None: every
        worker of the rounds)."""
        self._check_open()
        shape = None
        if isinstance(size, (tuple, list)):
            shape = tuple(size)
            if (not shape or len(shape) > _lib.SHAPE_DIMS_MAX or
                    any(not isinstance(d, int) or d <= 0 for d in shape)):
                raise ValueError("size: a shape is 1 to %d positive integers (got %r)"
                                 % (_lib.SHAPE_DIMS_MAX, size))
            size = int(np.prod(shape, dtype=np.int64))
        if not isinstance(size, int) or size <= 0:
            raise ValueError("size: a positive number of elements is needed (got %r)" % (size,))
        spec, bname = self._spec(name, size, optimizer, lr, init, init_scale, seed, hyper)
        spec.await_set = 1 if await_set else 0
        dims = None
        if shape is not None:
            dims = (ctypes.c_uint64 * len(shape))(*shape)
            spec.shape = dims
            spec.ndims = len(shape)
        ids = None
        if pushers is not None:
            pushers = [int(p) for p in pushers]
            if not pushers or any(b <= a for a, b in zip(pushers, pushers[1:])) or pushers[0] < 0:
                raise ValueError("pushers: worker ids, at least one, strictly increasing (got %r)"
                                 % (pushers,))
            ids = (ctypes.c_uint32 * len(pushers))(*pushers)
            spec.pushers = ids
            spec.npushers = len(pushers)
        return self._create(name, spec, bname, size, None)

    def create_sparse_table(self, name: str, dim: int, optimizer: str = "sgd", lr: float = 0.01,
                            *, rows_max: int = 1 << 20, init: str = "zeros",
                            init_scale: float = 0.0, seed: int = 0, admit_after: int = 0,
                            admit_counters: int = 0, evict_after: int = 0,
                            evict_at_budget: bool = False, evict_after_s: int = 0,
                            evict_half_life: int = 0, **hyper: Any) -> str:
        """Creates a sparse table: rows of dim float32 by uint64 key, at most
        rows_max on each shard. Its life cycle (server/README.md, "Rows that
        come and go"): admit_after, an id's push that gives it a row (until
        then pushes are counted, pulls give the initial value; at most 255),
        in a sketch of admit_counters one-byte counters (0: 1 MiB);
        evict_after, the pushes of the table on a shard after which a row
        not pushed is evicted (0: never); evict_after_s, the seconds after
        which a row not pushed is evicted (0: never; the primary's clock);
        evict_at_budget, a new row at rows_max evicts the least recently
        pushed instead of being refused (with evict_half_life, the one of
        least push count halved every that many pushes)."""
        self._check_open()
        if not isinstance(dim, int) or dim <= 0:
            raise ValueError("dim: a positive number of floats per row is needed (got %r)" % (dim,))
        for arg, v in (("admit_after", admit_after), ("admit_counters", admit_counters),
                       ("evict_after", evict_after), ("evict_after_s", evict_after_s),
                       ("evict_half_life", evict_half_life)):
            if not isinstance(v, int) or v < 0:
                raise ValueError("%s: a whole number >= 0 (got %r)" % (arg, v))
        spec, bname = self._spec(name, 0, optimizer, lr, init, init_scale, seed, hyper)
        spec.sparse = 1
        spec.dim = dim
        spec.rows_max = rows_max
        spec.admit_after = admit_after
        spec.admit_counters = admit_counters
        spec.evict_after = evict_after
        spec.evict_at_budget = 1 if evict_at_budget else 0
        spec.evict_after_s = evict_after_s
        spec.evict_half_life = evict_half_life
        return self._create(name, spec, bname, None, dim)

    def _table(self, name: str, dense: bool) -> tuple[int, int]:
        """(its handle, its size) for a dense table, (its handle, its dim)
        for a sparse one."""
        try:
            t, size, dim = self._tables[name]
        except KeyError:
            raise KeyError("table %r: not created or opened by this client" % (name,)) from None
        if dense:
            if size is None:
                raise TypeError("table %r is sparse: use pull_rows/push_rows" % name)
            return t, size
        if dim is None:
            raise TypeError("table %r is dense: use pull/push/push_pull" % name)
        return t, dim

    def clock(self, name: str) -> int:
        """The clock of this worker's next push to table name."""
        return self._clock[name]

    # -- dense --------------------------------------------------------------
    def _dense(self, name: str, arrays: list[tuple[str, np.ndarray]],
               offset: int) -> tuple[int, int]:
        t, size = self._table(name, True)
        n = arrays[0][1].size
        for arg, a in arrays:
            if a.size != n:
                raise ValueError("%s: %d elements, but the other array has %d" % (arg, a.size, n))
        if not isinstance(offset, int) or offset < 0 or offset + n > size:
            raise ValueError("elements [%r, %r) are outside table %r of %d" %
                             (offset, offset + n if isinstance(offset, int) else "?", name, size))
        return t, n

    def push(self, name: str, grad: Buffer, *, offset: int = 0) -> Handle:
        """Pushes gradient grad (float32, as many elements as the table, or
        a range from offset) at this worker's clock. Returns a Handle."""
        self._check_open()
        g = _as_f32("grad", grad, False)
        t, n = self._dense(name, [("grad", g)], offset)
        ticket = ctypes.c_uint64()
        clock = self._clock[name]
        self._call("push %r" % name, self._lib.psc_push, t, offset, n, _ptr(g), clock,
                   ctypes.byref(ticket))
        self._clock[name] = clock + 1
        return Handle(self, ticket.value, [grad, None])

    def pull(self, name: str, out: Buffer, *, offset: int = 0) -> Handle:
        """Pulls the weights into out (float32) for this worker's clock: in
        bsp, once every worker has pushed the clocks before it. Returns a
        Handle whose wait() returns out."""
        self._check_open()
        o = _as_f32("out", out, True)
        t, n = self._dense(name, [("out", o)], offset)
        ticket = ctypes.c_uint64()
        self._call("pull %r" % name, self._lib.psc_pull, t, offset, n, _ptr(o), self._clock[name],
                   ctypes.byref(ticket))
        return Handle(self, ticket.value, [out])

    def mirror(self, name: str, out: Buffer | None = None, *, offset: int = 0,
               count: int | None = None) -> Mirror:
        """A Mirror of dense table name's elements [offset, offset+count)
        (count: out's size, or the rest of the table) in out (float32; a
        new array when None): pulls that move what changed."""
        self._check_open()
        t, size = self._table(name, True)
        if out is None:
            n = size - offset if count is None else count
            if not isinstance(n, int) or n <= 0:
                raise ValueError("mirror of %r: count %r" % (name, n))
            out = np.zeros(n, np.float32)
        o = _as_f32("out", out, True)
        t, n = self._dense(name, [("out", o)], offset)
        handle = ctypes.c_void_p()
        self._call("mirror %r" % name, self._lib.psc_mirror_open, t, offset, n, _ptr(o),
                   ctypes.byref(handle))
        m = Mirror(self, name, handle, o, out)
        self._mirrors.append(m)
        return m

    def push_pull(self, name: str, grad: Buffer, out: Buffer, *, offset: int = 0) -> Handle:
        """Pushes grad at this worker's clock and pulls the weights after it
        into out, in one round trip. Returns a Handle whose wait() returns
        out."""
        self._check_open()
        g = _as_f32("grad", grad, False)
        o = _as_f32("out", out, True)
        if np.shares_memory(g, o):
            raise ValueError("grad and out share memory: the reply would overwrite the push")
        t, n = self._dense(name, [("grad", g), ("out", o)], offset)
        ticket = ctypes.c_uint64()
        clock = self._clock[name]
        self._call("push_pull %r" % name, self._lib.psc_push_pull, t, offset, n, _ptr(g), _ptr(o),
                   clock, ctypes.byref(ticket))
        self._clock[name] = clock + 1
        return Handle(self, ticket.value, [grad, out])

    def set_weights(self, name: str, values: Buffer, *, offset: int = 0) -> Handle:
        """Writes values (float32) into the table as they are: a model's own
        initial weights, before any optimizer step (the shards refuse it
        after one: psd.StateError). Returns a Handle."""
        self._check_open()
        v = _as_f32("values", values, False)
        t, n = self._dense(name, [("values", v)], offset)
        ticket = ctypes.c_uint64()
        self._call("set_weights %r" % name, self._lib.psc_set, t, offset, n, _ptr(v),
                   ctypes.byref(ticket))
        return Handle(self, ticket.value, [values, None])

    def push_keys(self, name: str, keys: Keys, values: Buffer) -> Handle:
        """Pushes a sparse gradient into a dense table: values[i] for
        element keys[i] (strictly increasing uint64, below the table's
        size), at this worker's clock; what TopK.select gives. Every shard
        gets a push, so bsp rounds complete. Returns a Handle."""
        self._check_open()
        v = _as_f32("values", values, False)
        t, size = self._table(name, True)
        k = _as_keys("keys", keys)
        if v.size != k.size:
            raise ValueError("values: %d values for %d keys" % (v.size, k.size))
        if k.size and k[-1] >= size:
            raise ValueError("keys: key %d is outside table %r of %d" % (k[-1], name, size))
        ticket = ctypes.c_uint64()
        clock = self._clock[name]
        self._call("push_keys %r" % name, self._lib.psc_push_keys, t, _keys_ptr(k), _ptr(v),
                   k.size, clock, ctypes.byref(ticket))
        self._clock[name] = clock + 1
        return Handle(self, ticket.value, [k, values, None])

    def vote(self, name: str, flag: bool, timeout_ms: int | None = None) -> bool:
        """One round of vote `name`: every worker of the round says flag
        (a bool), and all get True when any said True: "did anyone's
        gradients overflow?", so that all skip the step together, as
        psworker --precision f16 does (the same library call). Blocks
        until every worker has voted in the round. Vote rounds are counted
        apart from the tables' clocks. Without bsp servers there are no
        rounds to agree in, and the answer is this worker's own flag."""
        self._check_open()
        if not isinstance(name, str) or not name:
            raise ValueError("name: a non-empty string is needed")
        t = self.timeout_ms if timeout_ms is None else int(timeout_ms)
        v = self._votes.get(name)
        if v is None:
            v = _lib.Vote()
            self._call("vote %r" % name, self._lib.psc_vote_open, name.encode(), t,
                       ctypes.byref(v))
            self._votes[name] = v
        any_ = ctypes.c_int()
        self._call("vote %r" % name, self._lib.psc_vote, ctypes.byref(v), 1 if flag else 0, t,
                   ctypes.byref(any_))
        return bool(any_.value)

    def corked(self) -> _Cork:
        """A context manager: the requests made inside it go to each shard
        together, as one message, when it ends (a bucket of pushes)."""
        return _Cork(self)

    # -- sparse -------------------------------------------------------------
    def _rows(self, name: str, keys: Keys,
              arrays: list[tuple[str, np.ndarray]]) -> tuple[int, np.ndarray]:
        t, dim = self._table(name, False)
        k = _as_keys("keys", keys)
        for arg, a in arrays:
            if a.size != k.size * dim:
                raise ValueError("%s: %d keys of dim %d need %d floats (got %d)"
                                 % (arg, k.size, dim, k.size * dim, a.size))
        return t, k

    def pull_rows(self, name: str, keys: Keys, out: Buffer) -> Handle:
        """Pulls the rows of keys (strictly increasing uint64) into out
        (len(keys) x dim float32). Returns a Handle whose wait() returns out."""
        self._check_open()
        o = _as_f32("out", out, True)
        t, k = self._rows(name, keys, [("out", o)])
        ticket = ctypes.c_uint64()
        self._call("pull_rows %r" % name, self._lib.psc_pull_rows, t, _keys_ptr(k), k.size, _ptr(o),
                   self._clock[name], ctypes.byref(ticket))
        return Handle(self, ticket.value, [k, out])

    def push_rows(self, name: str, keys: Keys, grads: Buffer) -> Handle:
        """Pushes gradients grads (len(keys) x dim float32) for the rows of
        keys (strictly increasing uint64). Returns a Handle."""
        self._check_open()
        g = _as_f32("grads", grads, False)
        t, k = self._rows(name, keys, [("grads", g)])
        ticket = ctypes.c_uint64()
        clock = self._clock[name]
        self._call("push_rows %r" % name, self._lib.psc_push_rows, t, _keys_ptr(k), k.size, _ptr(g),
                   clock, ctypes.byref(ticket))
        self._clock[name] = clock + 1
        return Handle(self, ticket.value, [k, grads, None])
