"""psd.torch: train a PyTorch model through psd.

    opt = psd.torch.DistributedOptimizer(model, "momentum", lr=0.05, momentum=0.9)
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # buckets go out as backward runs
        opt.step()                        # waits, brings the new weights in

Each parameter is one dense table named as in model.state_dict(), with
its shape; rank 0's initial weights become the servers'. psd.torch.Embedding
and EmbeddingBag keep their rows in a sparse table, pulled for the
batch's ids in forward and pushed in backward. PipelineStage,
ScheduleGPipe and Schedule1F1B run a model split into stages, one
process each, as torch.distributed.pipelining does, with each stage's
weights on psd. worker/README.md ("From PyTorch") documents it."""
from __future__ import annotations

import os
import time
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from . import link as _link
from .client import Client, Handle, TopK, _servers_of, library
from .errors import StateError, TimeoutError

_default: Client | None = None


def init(servers: str | Sequence[str] | None = None, rank: int | None = None,
         workers: int | None = None, **client_args: Any) -> Client:
    """The process's psd.Client, made on the first call from the
    arguments or the environment (PSD_SERVERS, RANK, WORLD_SIZE), then
    returned as it is; DistributedOptimizer and Embedding use it when they
    are given no client."""
    global _default
    if _default is None or _default._c is None:
        _default = Client(servers, rank, workers, **client_args)
        return _default
    have = {"rank": _default.rank, "workers": _default.workers,
            "wire_dtype": _default.wire_dtype}
    want = {"rank": rank, "workers": workers, "wire_dtype": client_args.get("wire_dtype")}
    for k, v in want.items():
        if v is not None and v != have[k]:
            raise ValueError("psd.torch: the process's client exists with %s=%r, not %r (pass "
                             "client= to use another)" % (k, have[k], v))
    return _default


def _shape(p: torch.Tensor) -> tuple[int, ...]:
    return tuple(p.shape) if p.dim() > 0 else (1,)


def _f32(t: torch.Tensor) -> None:
    if t.dtype != torch.float32:
        raise TypeError("psd.torch: parameters are float32 (got %s); under autocast the "
                        "parameters stay float32 and only the computation is 16-bit" % t.dtype)
    if t.device.type not in ("cpu", "cuda"):
        raise TypeError("psd.torch: parameters on the CPU or a CUDA device are needed (got %s)"
                        % t.device)


def _staging(p: torch.Tensor) -> torch.Tensor:
    """The host buffer a parameter's gradient leaves from and its new
    weights land in: contiguous float32 on the CPU, page-locked when the
    parameter is on a GPU so that the copies go by DMA."""
    t = torch.zeros(p.shape, dtype=torch.float32)
    return t.pin_memory() if p.device.type == "cuda" else t


class DistributedOptimizer:
    """Trains model's parameters on psd: one dense table per parameter that
    requires grad, named prefix + its name in model.state_dict(), with
    psd's optimizer (sgd, momentum, adagrad, adam, ftrl) and its
    hyper-parameters (momentum=0.9, weight_decay=..., ...).

    Rank 0 sets the servers' initial weights to its model's own (on a
    table that has trained already, for instance restored from a
    checkpoint, the servers' weights win); every rank starts from them.
    Backward's gradient hooks push each bucket (about bucket_bytes of
    parameters, in the order backward reaches them) as soon as its last
    gradient is in, while backward goes on; step() waits for the new
    weights and copies them into the parameters.

    accum_steps=N: the gradients of N backward passes are summed by torch
    and their mean is pushed after the Nth (call step() once per N
    backward passes). topk=r: each push sends the fraction r of entries
    largest in magnitude, the rest kept as a residual for later steps
    (with optimizer="momentum" the velocity stays on the worker and the
    servers run sgd). wire_dtype "f16"/"bf16" halves the bytes on the wire.

    A parameter backward did not reach gets a zero gradient, so bsp rounds
    complete. Gradients are sent while backward runs: a change to p.grad
    after backward (clipping) does not reach the servers.

    scaler=psd.torch.GradScaler(): loss scaling for 16-bit compute, used
    as torch.cuda.amp.GradScaler is (scaler.scale(loss).backward(),
    scaler.step(opt), scaler.update()). Then nothing is sent during
    backward: step() unscales the gradients in f32, and the workers vote
    through psd (Client.vote, as psworker --precision f16 does) on whether
    any had a non-finite one; if so every worker skips the step (nothing
    is pushed, the weights stay) and the scale backs off on each."""

    def __init__(self, model: torch.nn.Module | PipelineStage, optimizer: str = "momentum",
                 lr: float = 0.01, *, servers: str | Sequence[str] | None = None,
                 rank: int | None = None, workers: int | None = None,
                 client: Client | None = None, bucket_bytes: int = 1 << 20,
                 accum_steps: int = 1, topk: float | None = None, wire_dtype: str = "f32",
                 timeout_ms: int = 60000, prefix: str = "", scaler: GradScaler | None = None,
                 **hyper: Any) -> None:
        stage = model if isinstance(model, PipelineStage) else None
        if stage is not None:  # its module, its stage's processes as the pushers
            if accum_steps != 1:
                raise ValueError("accum_steps: a pipeline stage sums its schedule's "
                                 "micro-batches; other accumulation is not there yet")
            client = stage.client if client is None else client
            model = stage.submod
        if not isinstance(model, torch.nn.Module):
            raise TypeError("model: a torch.nn.Module or a psd.torch.PipelineStage is needed "
                            "(got %s)" % type(model).__name__)
        if not isinstance(accum_steps, int) or accum_steps < 1:
            raise ValueError("accum_steps: an integer >= 1 is needed (got %r)" % (accum_steps,))
        if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise ValueError("bucket_bytes: a positive integer is needed (got %r)"
                             % (bucket_bytes,))
        if topk is not None and not (isinstance(topk, (int, float)) and 0.0 < topk <= 1.0):
            raise ValueError("topk: a fraction in (0, 1] is needed (got %r)" % (topk,))
        if scaler is not None and not isinstance(scaler, GradScaler):
            raise TypeError("scaler: a psd.torch.GradScaler is needed (got %s)"
                            % type(scaler).__name__)
        if scaler is not None and any(isinstance(m, _SparseRows) for m in model.modules()):
            raise ValueError("scaler: psd.torch embeddings push in backward, before a scaled "
                             "step could be checked; they do not take loss scaling yet")
        if stage is not None and (scaler is not None or topk is not None):
            raise ValueError("a pipeline stage does not take scaler or topk yet")
        self._stage = stage
        self.scaler = scaler
        self.skipped = 0
        self._vote = prefix + "found_inf"
        self.client = client if client is not None else init(
            servers, rank, workers, wire_dtype=wire_dtype, timeout_ms=timeout_ms)
        self.model = model
        self._accum = accum_steps
        self.timeout_ms = timeout_ms
        self.params = [(prefix + n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("model: no parameter requires grad")
        for _, p in self.params:
            _f32(p)
        momentum_here = topk is not None and optimizer == "momentum"
        server_opt = "sgd" if momentum_here else optimizer
        server_hyper = {k: v for k, v in hyper.items() if not (momentum_here and k == "momentum")}
        c = self.client
        pushers = stage.pushers if stage is not None else None
        for name, p in self.params:
            c.create_table(name, _shape(p), server_opt, lr, await_set=True, pushers=pushers,
                           **server_hyper)
        self._send = [_staging(p) for _, p in self.params]
        self._recv = [_staging(p) for _, p in self.params]
        self._topk: list[TopK] | None = None
        if topk is not None:
            mom = float(hyper.get("momentum", 0.0)) if momentum_here else None
            self._topk = [TopK(p.numel(), float(topk), mom) for _, p in self.params]
        self._start()
        # buckets in the order backward reaches the parameters (the
        # reverse of their registration, as DDP assumes)
        self._bucket_of = [0] * len(self.params)
        self.buckets: list[list[int]] = []
        cur: list[int] = []
        cur_bytes = 0
        for i in reversed(range(len(self.params))):
            cur.append(i)
            cur_bytes += self.params[i][1].numel() * 4
            if cur_bytes >= bucket_bytes:
                self.buckets.append(cur)
                cur, cur_bytes = [], 0
        if cur:
            self.buckets.append(cur)
        for b, members in enumerate(self.buckets):
            for i in members:
                self._bucket_of[i] = b
        self._count = [0] * len(self.params)
        self._missing = [len(m) for m in self.buckets]
        self._handles: list[list[Handle]] = [[] for _ in self.buckets]
        self._sent = [False] * len(self.buckets)
        self._hooks: list[Any] = []
        self._acc_nodes: list[Any] = []  # the hooks live as long as their nodes
        with torch.enable_grad():
            for i, (_, p) in enumerate(self.params):
                node = p.expand_as(p).grad_fn.next_functions[0][0]
                self._acc_nodes.append(node)
                self._hooks.append(node.register_hook(self._hook_for(i)))
        self.steps = 0

    @property
    def accum_steps(self) -> int:
        """Backward passes summed into a step: accum_steps, or a pipeline
        stage's micro-batches."""
        return self._stage.n_microbatches if self._stage is not None else self._accum

    def _start(self) -> None:
        """Rank 0 (a pipeline stage: the stage's process in pipeline 0)
        sets the initial weights; every rank pulls them."""
        c = self.client
        if (c.rank == 0 if self._stage is None else self._stage.pipeline == 0):
            handles = []
            for name, p in self.params:
                w = p.detach().to("cpu", torch.float32).contiguous().reshape(-1)
                handles.append((name, c.set_weights(name, w)))
            for name, h in handles:
                try:
                    h.wait(self.timeout_ms)
                except StateError:
                    pass  # trained already (restored): the servers' weights win
        pulls = [c.pull(name, r) for (name, _), r in zip(self.params, self._recv)]
        for h in pulls:
            try:
                h.wait(self.timeout_ms)
            except TimeoutError as e:
                raise TimeoutError(e.code, e.name, "%s (rank 0 sets the initial weights: has it "
                                   "started?)" % e.message) from None
        with torch.no_grad():
            for (_, p), r in zip(self.params, self._recv):
                p.copy_(r)

    def _hook_for(self, i: int) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            self._count[i] += 1
            if self._count[i] == self.accum_steps:
                b = self._bucket_of[i]
                self._missing[b] -= 1
                if self._missing[b] == 0 and self.scaler is None:
                    self._send_bucket(b)
        return hook

    def _send_bucket(self, b: int, unscale: float = 1.0) -> None:
        c = self.client
        # a pipeline's schedule scales each micro-batch's loss by 1/M: the
        # sum of its micro-batches' gradients is the step's
        scale = unscale / (1 if self._stage is not None else self.accum_steps)
        with torch.no_grad():
            for i in self.buckets[b]:
                g = self.params[i][1].grad
                if g is None:
                    self._send[i].zero_()
                elif scale == 1.0:
                    self._send[i].copy_(g)  # from a GPU: waits for backward's kernels
                elif g.device.type == "cpu":
                    torch.mul(g, scale, out=self._send[i])
                else:  # the same float32 product, on the host
                    self._send[i].copy_(g).mul_(scale)
        hs = self._handles[b]
        with c.corked():
            for i in self.buckets[b]:
                name = self.params[i][0]
                if self._topk is not None:
                    keys, vals = self._topk[i].select(self._send[i].view(-1))
                    hs.append(c.push_keys(name, keys, vals))
                    hs.append(c.pull(name, self._recv[i].view(-1)))
                else:
                    hs.append(c.push_pull(name, self._send[i].view(-1), self._recv[i].view(-1)))
        self._sent[b] = True

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zeroes the gradients of the parameters it trains, in place, or
        drops them (set_to_none=True), as torch.optim.Optimizer.zero_grad."""
        for _, p in self.params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    p.grad.zero_()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Sends what backward did not (parameters it did not reach get a
        zero gradient), waits for every bucket's new weights and copies
        them into the parameters; also finishes the pushes of the model's
        psd.torch embeddings. Returns closure()'s loss when given one."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for i, n in enumerate(self._count):
            if 0 < n < self.accum_steps:
                raise RuntimeError("step(): parameter %r has %d of accum_steps=%d backward "
                                   "passes" % (self.params[i][0], n, self.accum_steps))
        if self.scaler is not None and self._scaled_skip():
            return None
        for b in range(len(self.buckets)):
            if not self._sent[b]:
                self._send_bucket(b)
        first_error: BaseException | None = None
        for b in range(len(self.buckets)):
            for h in self._handles[b]:
                try:
                    h.wait(self.timeout_ms)
                except Exception as e:  # wait for the others, then raise the first
                    first_error = first_error or e
            self._handles[b] = []
            self._sent[b] = False
            self._missing[b] = len(self.buckets[b])
        self._count = [0] * len(self.params)
        for m in self.model.modules():
            if isinstance(m, _SparseRows):
                m.finish()
        if first_error is not None:
            raise first_error
        with torch.no_grad():
            for (_, p), r in zip(self.params, self._recv):
                p.copy_(r)
        self.steps += 1
        return loss

    def _scaled_skip(self) -> bool:
        """With a scaler: whether any worker's gradients are non-finite
        (then the step is skipped here and everywhere); if not, the
        buckets go out unscaled."""
        bad = False
        with torch.no_grad():
            for _, p in self.params:
                if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                    bad = True
                    break
        assert self.scaler is not None  # step() calls it with one
        found = self.client.vote(self._vote, bad, self.timeout_ms)
        self.scaler._found_inf = found
        if found:
            self.skipped += 1
            self._count = [0] * len(self.params)
            self._missing = [len(m) for m in self.buckets]
            return True
        for b in range(len(self.buckets)):
            self._send_bucket(b, 1.0 / self.scaler.get_scale())
        return False

    def close(self) -> None:
        """Removes the gradient hooks (the client stays open)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []


class GradScaler:
    """Dynamic loss scaling with torch.cuda.amp.GradScaler's rules and
    calls, for a DistributedOptimizer made with scaler=this one, on any
    device: the scale starts at init_scale; a step in which any worker's
    gradients were not finite is skipped on every worker and the scale is
    multiplied by backoff_factor; after growth_interval steps in a row
    without one it is multiplied by growth_factor.

        scaler.scale(loss).backward()
        scaler.step(opt)     # opt.step(): unscales, votes, pushes or skips
        scaler.update()"""

    def __init__(self, init_scale: float = 65536.0, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> None:
        if not (init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1 and
                isinstance(growth_interval, int) and growth_interval >= 1):
            raise ValueError("GradScaler: init_scale > 0, growth_factor > 1, 0 < backoff_factor "
                             "< 1 and an integer growth_interval >= 1 are needed")
        self._scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff = float(backoff_factor)
        self._interval = growth_interval
        self._clean = 0
        self._found_inf: bool | None = None

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """loss times the current scale, to call backward() on."""
        return loss * self._scale

    def get_scale(self) -> float:
        """The current scale (a float)."""
        return self._scale

    def step(self, optimizer: DistributedOptimizer, *args: Any, **kwargs: Any) -> Any:
        """optimizer.step(); None when the step was skipped."""
        if not isinstance(optimizer, DistributedOptimizer) or optimizer.scaler is not self:
            raise ValueError("step: the DistributedOptimizer made with scaler=this scaler is "
                             "needed")
        out = optimizer.step(*args, **kwargs)
        return None if self._found_inf else out

    def update(self) -> None:
        """The scale for the next step, from whether this one overflowed."""
        if self._found_inf is None:
            raise RuntimeError("update(): no step() since the last update")
        if self._found_inf:
            self._scale *= self._backoff
            self._clean = 0
        else:
            self._clean += 1
            if self._clean == self._interval:
                self._scale *= self._growth_factor
                self._clean = 0
        self._found_inf = None

    def state_dict(self) -> dict[str, float | int]:
        """The scale and the clean steps counted toward its next growth
        ({"scale": ..., "growth_tracker": ...}), for a checkpoint."""
        return {"scale": self._scale, "growth_tracker": self._clean}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Takes back what state_dict() gave."""
        self._scale = float(state["scale"])
        self._clean = int(state["growth_tracker"])


class _Pull(NamedTuple):
    """A pull under way: the distinct keys, the rows they fill, the
    input's ids as indices into them, and the request."""
    keys: np.ndarray
    rows: torch.Tensor
    index: torch.Tensor
    handle: Handle


class _SparseRows(torch.nn.Module):
    """The rows of a sparse table, pulled by id in forward and pushed in
    backward."""

    def __init__(self, num_embeddings: int, embedding_dim: int, name: str,
                 client: Client | None, optimizer: str, lr: float, init: str,
                 init_scale: float, seed: int, rows_max: int | None,
                 hyper: dict[str, Any]) -> None:
        super().__init__()
        if not isinstance(num_embeddings, int) or num_embeddings <= 0:
            raise ValueError("num_embeddings: a positive integer is needed (got %r)"
                             % (num_embeddings,))
        if not isinstance(embedding_dim, int) or embedding_dim <= 0:
            raise ValueError("embedding_dim: a positive integer is needed (got %r)"
                             % (embedding_dim,))
        if not isinstance(name, str) or not name:
            raise ValueError("name: the sparse table's name is needed")
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.name = name
        self._client = client
        self._spec = dict(optimizer=optimizer, lr=lr, init=init, init_scale=init_scale,
                          seed=seed, rows_max=rows_max or num_embeddings, **hyper)
        self._pending: Handle | None = None
        self._made: Client | None = None

    def _ready(self) -> Client:
        c = self._client or init()
        if self._made is not c:
            c.create_sparse_table(self.name, self.embedding_dim, **self._spec)
            self._made = c
        return c

    def finish(self) -> None:
        """Waits for the last backward's push."""
        h, self._pending = self._pending, None
        if h is not None:
            h.wait()

    def _begin(self, ids: torch.Tensor) -> _Pull:
        """Starts the pull of the rows of ids' distinct values."""
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError("input: integer ids are needed (got %s)" % ids.dtype)
        c = self._ready()
        self.finish()
        uniq, inv = torch.unique(ids.reshape(-1), sorted=True, return_inverse=True)
        if uniq.numel() and (uniq[0] < 0 or uniq[-1] >= self.num_embeddings):
            raise IndexError("input: ids must be in [0, %d) (got %d..%d)"
                             % (self.num_embeddings, int(uniq[0]), int(uniq[-1])))
        keys = uniq.numpy().astype(np.uint64)
        rows = torch.empty(keys.size, self.embedding_dim)
        return _Pull(keys, rows, inv.reshape(ids.shape), c.pull_rows(self.name, keys, rows))

    def _end(self, p: _Pull) -> tuple[torch.Tensor, torch.Tensor]:
        """(the batch's rows as a leaf tensor, ids as indices into them)."""
        p.handle.wait()
        if self.training and torch.is_grad_enabled():
            keys = p.keys
            p.rows.requires_grad_()
            p.rows.register_hook(lambda g: self._push(keys, g))
        return p.rows, p.index

    def _rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._end(self._begin(ids))

    def _push(self, keys: np.ndarray, grad: torch.Tensor) -> None:
        g = grad.detach().to(torch.float32).contiguous()
        self.finish()
        self._pending = self._ready().push_rows(self.name, keys, g)

    def extra_repr(self) -> str:
        return "%d, %d, name=%r" % (self.num_embeddings, self.embedding_dim, self.name)


class Embedding(_SparseRows):
    """torch.nn.Embedding with its rows in psd's sparse table name: forward
    pulls the rows of the batch's distinct ids, backward pushes their
    gradients (one push per forward in training). The table is made on
    the first forward (with psd.torch.init()'s client unless one is
    given). optimizer, lr and hyper are the table's, as in
    Client.create_sparse_table; init="normal" with init_scale=1.0 is
    torch's own N(0, 1)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, name: str, *,
                 client: Client | None = None, optimizer: str = "sgd", lr: float = 0.01,
                 init: str = "normal", init_scale: float = 1.0, seed: int = 0,
                 rows_max: int | None = None, **hyper: Any) -> None:
        super().__init__(num_embeddings, embedding_dim, name, client, optimizer, lr, init,
                         init_scale, seed, rows_max, hyper)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """The rows of input's ids (pulled from the table)."""
        rows, idx = self._rows(input)
        return F.embedding(idx, rows)


class EmbeddingBag(_SparseRows):
    """torch.nn.EmbeddingBag (mode "sum" or "mean") with its rows in psd's
    sparse table name; input is 2-D (one bag a row) or 1-D with offsets."""

    def __init__(self, num_embeddings: int, embedding_dim: int, name: str, *, mode: str = "mean",
                 client: Client | None = None, optimizer: str = "sgd", lr: float = 0.01,
                 init: str = "normal", init_scale: float = 1.0, seed: int = 0,
                 rows_max: int | None = None, **hyper: Any) -> None:
        if mode not in ("sum", "mean"):
            raise ValueError("mode: sum or mean (got %r)" % (mode,))
        super().__init__(num_embeddings, embedding_dim, name, client, optimizer, lr, init,
                         init_scale, seed, rows_max, hyper)
        self.mode = mode

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        self._check(input, offsets)
        return self._bag(self._rows(input), offsets, per_sample_weights)

    @staticmethod
    def _check(input: torch.Tensor, offsets: torch.Tensor | None) -> None:
        if input.dim() == 2 and offsets is not None:
            raise ValueError("offsets: only with a 1-D input")
        if input.dim() == 1 and offsets is None:
            raise ValueError("offsets: needed with a 1-D input")

    def _bag(self, pulled: tuple[torch.Tensor, torch.Tensor], offsets: torch.Tensor | None,
             per_sample_weights: torch.Tensor | None) -> torch.Tensor:
        rows, idx = pulled
        return F.embedding_bag(idx, rows, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights)


class EmbeddingBagCollection(torch.nn.Module):
    """Several psd.torch.EmbeddingBag tables looked up together, as a
    recommendation model's categorical features are: forward starts the
    pulls of all tables before it waits for any, so a step waits for one
    round trip to the shards instead of one per table. Backward pushes
    each table's gradients as EmbeddingBag does."""

    def __init__(self, bags: Sequence[EmbeddingBag]) -> None:
        super().__init__()
        bags = list(bags)
        if not bags or not all(isinstance(b, EmbeddingBag) for b in bags):
            raise TypeError("bags: a non-empty sequence of psd.torch.EmbeddingBag is needed")
        if len({b.name for b in bags}) != len(bags):
            raise ValueError("bags: two bags of the same table")
        self.bags = torch.nn.ModuleList(bags)

    def __len__(self) -> int:
        return len(self.bags)

    def forward(self, inputs: Sequence[torch.Tensor],
                offsets: Sequence[torch.Tensor | None] | None = None) -> list[torch.Tensor]:
        """The bags of inputs[i] (2-D, or 1-D with offsets[i]) in table i."""
        if len(inputs) != len(self.bags):
            raise ValueError("inputs: %d tensors for %d tables" % (len(inputs), len(self.bags)))
        offs = [None] * len(self.bags) if offsets is None else list(offsets)
        if len(offs) != len(self.bags):
            raise ValueError("offsets: %d for %d tables" % (len(offs), len(self.bags)))
        for x, o in zip(inputs, offs):
            EmbeddingBag._check(x, o)
        started: list[_Pull] = []
        try:
            for b, x in zip(self.bags, inputs):
                started.append(b._begin(x))
        except BaseException:
            for p in started:  # their buffers stay until the library is done with them
                p.handle.wait()
            raise
        return [b._bag(b._end(p), o, None) for b, p, o in zip(self.bags, started, offs)]

    def finish(self) -> None:
        """Waits for the last backward's pushes."""
        for b in self.bags:
            b.finish()


class PipelineStage:
    """Stage stage_index of num_stages of a pipeline: this process runs
    submodule, a contiguous run of the model's layers given explicitly (no
    tracer), as torch.distributed.pipelining.PipelineStage does. Several
    pipelines (workers / num_stages of them) train one model: the process
    of rank r is stage r % num_stages of pipeline r // num_stages, so
    stage_index must be rank % num_stages.

    endpoints: where each rank's stage listens, rank 0 first (a list, or
    text with hostlist ranges as servers takes; default the
    PSD_STAGE_ENDPOINTS environment variable); this stage listens at the
    port of its own entry on every interface (listen= to choose) and
    connects to rank + 1's. stage_timeout_ms: a neighbour silent this long
    (no ZeroMQ heartbeat) is gone; timeout_ms: the longest wait for a
    neighbour that is there. bytes_max: the largest tensor either way.
    curve_keypair=(public, secret): CURVE between the stages, each
    holding this pair and admitting only its public key (psd.Link for
    other arrangements).

    Train its weights with DistributedOptimizer(stage, ...): its tables
    are named as submodule.state_dict() names them (an nn.Sequential
    sliced from the whole keeps the whole's names, so psctl export loads
    into the unsplit model; prefix= on the optimizer otherwise), pushed
    by this stage's processes alone, and the process in pipeline 0 sets
    their initial weights. A schedule (ScheduleGPipe, Schedule1F1B) runs
    its steps."""

    def __init__(self, submodule: torch.nn.Module, stage_index: int, num_stages: int,
                 device: str | torch.device | None = None, *,
                 endpoints: str | Sequence[str] | None = None, listen: str | None = None,
                 client: Client | None = None, servers: str | Sequence[str] | None = None,
                 rank: int | None = None, workers: int | None = None, timeout_ms: int = 60000,
                 stage_timeout_ms: int = 2000, bytes_max: int = 64 << 20,
                 curve_keypair: tuple[str, str] | None = None) -> None:
        if not isinstance(submodule, torch.nn.Module):
            raise TypeError("submodule: a torch.nn.Module is needed (got %s)"
                            % type(submodule).__name__)
        if device is not None and torch.device(device).type != "cpu":
            raise TypeError("device: the CPU only, for now (got %s)" % device)
        if not isinstance(num_stages, int) or num_stages < 2:
            raise ValueError("num_stages: 2 or more (got %r)" % (num_stages,))
        if not isinstance(stage_index, int) or not 0 <= stage_index < num_stages:
            raise ValueError("stage_index: 0 to %d (got %r)" % (num_stages - 1, stage_index))
        self.client = client if client is not None else init(servers, rank, workers,
                                                             timeout_ms=timeout_ms)
        c = self.client
        if c.workers % num_stages != 0:
            raise ValueError("workers=%d is not a multiple of num_stages=%d: each pipeline has "
                             "one process per stage" % (c.workers, num_stages))
        if c.rank % num_stages != stage_index:
            raise ValueError("rank %d runs stage %d of %d (rank %% num_stages), not stage %d"
                             % (c.rank, c.rank % num_stages, num_stages, stage_index))
        self.submod = submodule
        self.stage_index, self.num_stages = stage_index, num_stages
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1
        self.pipeline, self.pipelines = c.rank // num_stages, c.workers // num_stages
        self.pushers = [p * num_stages + stage_index for p in range(self.pipelines)]
        if endpoints is None:
            endpoints = os.environ.get("PSD_STAGE_ENDPOINTS")
            if not endpoints:
                raise ValueError("endpoints: none given, and PSD_STAGE_ENDPOINTS is not set")
        lib, _ = library()
        self.endpoints = _servers_of(lib, endpoints)
        if len(self.endpoints) != c.workers:
            raise ValueError("endpoints: %d given; workers=%d takes one per rank"
                             % (len(self.endpoints), c.workers))
        if listen is None and not self.is_first:
            port = self.endpoints[c.rank].rsplit(":", 1)
            if len(port) != 2 or not port[1]:
                raise ValueError("endpoints: %r has no port" % self.endpoints[c.rank])
            listen = "tcp://*:" + port[1]
        self._listen = listen
        self._next = None if self.is_last else self.endpoints[c.rank + 1]
        self.timeout_ms = int(timeout_ms)
        self.stage_timeout_ms = int(stage_timeout_ms)
        self.bytes_max = int(bytes_max)
        self._curve = curve_keypair
        self.link: _link.Link | None = None
        self.n_microbatches = 1
        self.activations_held = self.activations_held_max = 0
        self.idle_seconds = 0.0

    def _connect(self, window: int) -> _link.Link:
        """The link, made by the first schedule (which knows the window)."""
        if self.link is None:
            self.link = _link.Link(self.stage_index, self.num_stages, listen=self._listen,
                                   next=self._next, window=window, bytes_max=self.bytes_max,
                                   timeout_ms=self.stage_timeout_ms,
                                   curve_keypair=self._curve)
            self.link.wait_connected(self.timeout_ms)
        return self.link

    def _recv(self, direction: int, step: int, micro: int, eval_: bool) -> torch.Tensor:
        t0 = time.monotonic()
        a, s, m, e = self._open().recv(direction, self.timeout_ms)
        self.idle_seconds += time.monotonic() - t0
        if (s, m, e) != (step, micro, eval_):
            kind = lambda e_: "evaluation" if e_ else "training"  # noqa: E731
            raise RuntimeError(
                "stage %d: stage %d sent %s micro-batch %d of step %d; this stage expected %s "
                "micro-batch %d of step %d (are the stages run with the same schedule and "
                "n_microbatches?)" % (self.stage_index, self.stage_index + (1 if direction else
                                      -1), kind(e), m, s, kind(eval_), micro, step))
        return torch.from_numpy(a)

    def _send(self, direction: int, t: torch.Tensor, step: int, micro: int, eval_: bool) -> None:
        self._open().send(direction, t.detach().contiguous().numpy(), step, micro, eval_)

    def _open(self) -> _link.Link:
        if self.link is None:
            raise RuntimeError("stage %d: no link yet (a schedule makes it)" % self.stage_index)
        return self.link

    def close(self) -> None:
        """Closes the stage's link to its neighbours: what was sent still goes,
        for up to its timeout, unless the neighbour is gone (psd.Link.close).
        The client stays open."""
        if self.link is not None:
            self.link.close()
            self.link = None


class _Schedule:
    """A step of n_microbatches micro-batches through a PipelineStage."""

    gpipe = False

    def __init__(self, stage: PipelineStage, n_microbatches: int,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
                 ) -> None:
        if not isinstance(stage, PipelineStage):
            raise TypeError("stage: a psd.torch.PipelineStage is needed (got %s)"
                            % type(stage).__name__)
        if not isinstance(n_microbatches, int) or not 1 <= n_microbatches <= 1024:
            raise ValueError("n_microbatches: 1 to 1024 (got %r)" % (n_microbatches,))
        if stage.is_last and loss_fn is None:
            raise ValueError("loss_fn: the last stage computes the loss")
        self.stage, self.m, self.loss_fn = stage, n_microbatches, loss_fn
        p, s = stage.num_stages, stage.stage_index
        self.held = n_microbatches if self.gpipe else min(p - s, n_microbatches)
        stage.n_microbatches = n_microbatches
        stage._connect(self.held)
        self._step = 0
        self._evals = 0

    def order(self) -> list[int]:
        """This stage's passes of a step: +1 + j a forward, -1 - j a
        backward, of micro-batch j (psworker's pipe.c, the same)."""
        m, p, s = self.m, self.stage.num_stages, self.stage.stage_index
        if self.gpipe:
            return list(range(1, m + 1)) + [-j for j in range(1, m + 1)]
        warm, out, f, b = min(p - s - 1, m), [], 0, 0
        while f < warm:
            f += 1
            out.append(f)
        while b < m:
            if f < m:
                f += 1
                out.append(f)
            b += 1
            out.append(-b)
        return out

    def _chunks(self, x: Any, what: str) -> tuple[torch.Tensor, ...]:
        if x is None or not torch.is_tensor(x):
            raise ValueError("step: the %s is a tensor" % what)
        if x.shape[0] % self.m != 0:
            raise ValueError("step: the %s's %d rows do not split into %d micro-batches"
                             % (what, x.shape[0], self.m))
        return x.chunk(self.m)

    def step(self, *args: torch.Tensor, target: torch.Tensor | None = None,
             losses: list[torch.Tensor] | None = None) -> torch.Tensor | None:
        """One step: the first stage gives the batch (step(x)), the last
        the targets (step(target=y), losses=[] to get each micro-batch's
        loss), the ones between nothing. Each micro-batch's loss is
        scaled by 1/n_microbatches, so the summed gradients are the whole
        batch's; the last stage returns the outputs, concatenated."""
        st = self.stage
        xs = self._chunks(args[0] if args else None, "input") if st.is_first else None
        ys = self._chunks(target, "target") if st.is_last else None
        if not st.is_first and args:
            raise ValueError("step: only the first stage takes the input")
        saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        outs: list[Any] = [None] * self.m
        fwd, bwd = _link.FORWARD, _link.BACKWARD
        for op in self.order():
            j = abs(op) - 1
            if op > 0:
                x = xs[j] if xs is not None else \
                    st._recv(fwd, self._step, j, False).requires_grad_(True)
                y = st.submod(x)
                if not st.is_last:
                    st._send(fwd, y, self._step, j, False)
                saved[j] = (x, y)
                st.activations_held += 1
                st.activations_held_max = max(st.activations_held_max, st.activations_held)
                continue
            x, y = saved.pop(j)
            if self.loss_fn is not None and ys is not None:  # the last stage
                loss = self.loss_fn(y, ys[j])
                if losses is not None:
                    losses.append(loss.detach())
                outs[j] = y.detach()
                (loss / self.m).backward()
            else:
                y.backward(st._recv(bwd, self._step, j, False))
            if not st.is_first:
                st._send(bwd, x.grad, self._step, j, False)
            st.activations_held -= 1
        self._step += 1
        return torch.cat(outs) if st.is_last else None

    def eval(self, x: torch.Tensor | None = None) -> torch.Tensor | None:
        """Forward only, no gradient: the first stage gives x, the last
        returns the output (the others None). For evaluation."""
        st = self.stage
        fwd = _link.FORWARD
        with torch.no_grad():
            if st.is_first:
                if x is None:
                    raise ValueError("eval: the first stage gives the input")
            else:
                x = st._recv(fwd, self._step, self._evals, True)
            y = st.submod(x)
            if not st.is_last:
                st._send(fwd, y, self._step, self._evals, True)
        self._evals += 1
        return y if st.is_last else None


class ScheduleGPipe(_Schedule):
    """GPipe: every micro-batch's forward, then every backward (in
    micro-batch order): each stage holds n_microbatches' activations."""

    gpipe = True


class Schedule1F1B(_Schedule):
    """1F1B: the forwards that fill the pipeline below this stage, then one
    forward and one backward in turn: stage s holds min(num_stages - s,
    n_microbatches) micro-batches' activations. The backwards run in
    micro-batch order, as GPipe's, so the two give the same bits."""
