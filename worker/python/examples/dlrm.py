#!/usr/bin/env python3
"""A DLRM-style click model on psd, streamed once through Criteo-shaped data.

One psd.torch.EmbeddingBag per categorical field (26 sparse tables, ids
of 40 bits used as they come: no hashing, no fixed vocabulary), a bottom
MLP over the 13 count features, the pairwise dot products of all 27
vectors, and a top MLP: the model of Naumov et al. (2019), small. The
tables live in psd with a row budget per field, and optionally admission
(an id gets a row at its Nth push) and eviction (rows not pushed lately
go; a new row at the budget pushes out the row of least decayed push
count). The
MLPs train through psd.torch.DistributedOptimizer.

The data is gen_clicks --criteo's (built with the tests:
BUILD/tests/gen_clicks --criteo --out DIR), whose truth.json holds the
true model's own held-out log-loss and the distinct ids of each field.

    PSD_SERVERS=tcp://127.0.0.1:5555 python3 dlrm.py --data DIR
    python3 dlrm.py --data DIR --ddp   # the baseline: torch DDP (gloo),
                                       # nn.EmbeddingBag hashed to the budget

Environment: PSD_SERVERS, RANK and WORLD_SIZE (as torchrun sets them);
each rank trains on its own share of each step's examples."""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

COUNTS, FIELDS = 13, 26
RECORD = np.dtype([("label", "<f4"), ("counts", "<f4", (COUNTS,)), ("ids", "<u8", (FIELDS,))])
ID_SPACE = 1 << 40  # gen_clicks' ids are 40-bit hashes


def load(path):
    """The records of a gen_clicks --criteo file, as a read-only array."""
    size = os.path.getsize(path)
    if size == 0 or size % RECORD.itemsize:
        raise SystemExit("%s: %d bytes, not a whole number of %d-byte records (is it "
                         "gen_clicks --criteo output?)" % (path, size, RECORD.itemsize))
    return np.memmap(path, RECORD, mode="r")


def batch(data, lo, hi):
    """(log(1 + counts), ids, labels) of examples [lo, hi) as tensors."""
    part = data[lo:hi]
    ids = part["ids"].astype(np.int64)
    if ids.size and int(ids.max()) >= ID_SPACE:
        raise SystemExit("an id past 2^40 at examples %d..%d: not gen_clicks --criteo data"
                         % (lo, hi))
    return (torch.from_numpy(np.log1p(part["counts"])), torch.from_numpy(ids),
            torch.from_numpy(np.array(part["label"])))


def mlp(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        layers += [torch.nn.Linear(sizes[i], sizes[i + 1]), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


class Hashed(torch.nn.Module):
    """nn.EmbeddingBag over ids taken modulo its rows: DDP's fixed table."""

    def __init__(self, rows, dim):
        super().__init__()
        self.rows = rows
        self.bag = torch.nn.EmbeddingBag(rows, dim, mode="sum")
        torch.nn.init.normal_(self.bag.weight, std=0.01)

    def forward(self, ids):
        return self.bag(ids % self.rows)


class HashedTables(torch.nn.ModuleList):
    """The DDP model's tables, looked up as psd.torch.EmbeddingBagCollection's."""

    def forward(self, inputs):
        return [t(x) for t, x in zip(self, inputs)]


class DLRM(torch.nn.Module):
    def __init__(self, tables, dim):
        super().__init__()
        self.tables = tables  # one bag per field: forward(list of (B, 1) ids)
        self.bottom = torch.nn.Sequential(mlp([COUNTS, 64, dim]), torch.nn.ReLU())
        n = len(tables) + 1
        self.register_buffer("pairs", torch.triu_indices(n, n, offset=1), persistent=False)
        self.top = mlp([dim + n * (n - 1) // 2, 128, 64, 1])

    def forward(self, counts, ids):
        x = self.bottom(counts)
        vs = [x] + self.tables([ids[:, f:f + 1] for f in range(len(self.tables))])
        z = torch.stack(vs, dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="gen_clicks --criteo's output folder")
    ap.add_argument("--batch", type=int, default=1024, help="examples per step, all ranks")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many (0: one pass)")
    ap.add_argument("--dim", type=int, default=16, help="floats per embedding row")
    ap.add_argument("--lr", type=float, default=0.05, help="the embeddings' Adagrad rate")
    ap.add_argument("--mlp-lr", type=float, default=0.002, help="the MLPs' Adam rate")
    ap.add_argument("--budget", type=float, default=0.2,
                    help="rows per field, as a share of its distinct training ids")
    ap.add_argument("--min-rows", type=int, default=1024, help="rows per field at least")
    ap.add_argument("--admit-after", type=int, default=2,
                    help="pushes of an id before it gets a row (psd; 0 or 1: at once)")
    ap.add_argument("--evict-after", type=int, default=1000,
                    help="pushes of a table on a shard (one a rank and step) after which a row "
                    "not pushed goes (psd; 0: only at the budget)")
    ap.add_argument("--half-life", type=int, default=2000,
                    help="psd: the budget evicts the row of least push count, halved every this "
                    "many pushes of its table on a shard (0: the least recently pushed)")
    ap.add_argument("--unbounded", action="store_true",
                    help="psd: every id gets a row (no admission, eviction or budget)")
    ap.add_argument("--ddp", action="store_true", help="train on torch DDP (gloo) instead")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    if a.batch < 1 or a.steps < 0 or a.dim < 1 or not a.lr > 0 or not a.mlp_lr > 0:
        ap.error("--batch and --dim must be >= 1, --steps >= 0, the rates > 0")
    if not 0 < a.budget <= 1 or a.min_rows < 1:
        ap.error("--budget: a share in (0, 1]; --min-rows >= 1")
    if a.admit_after < 0 or a.admit_after > 255 or a.evict_after < 0 or a.half_life < 0:
        ap.error("--admit-after: 0 to 255; --evict-after and --half-life >= 0")
    if a.threads:
        torch.set_num_threads(a.threads)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if a.batch % world:
        ap.error("--batch %d: not a multiple of the %d ranks" % (a.batch, world))
    truth = json.load(open(os.path.join(a.data, "truth.json")))
    if truth.get("format") != "criteo" or len(truth.get("distinct", ())) != FIELDS:
        raise SystemExit("%s: not gen_clicks --criteo output" % a.data)
    train, test = load(os.path.join(a.data, "train.bin")), load(os.path.join(a.data, "test.bin"))
    rows = [max(a.min_rows, math.ceil(a.budget * d)) for d in truth["distinct"]]
    torch.manual_seed(0)

    if a.ddp:
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group("gloo", rank=rank, world_size=world)
        model = DLRM(HashedTables(Hashed(r, a.dim) for r in rows), a.dim)
        net = torch.nn.parallel.DistributedDataParallel(model)
        emb = [p for n, p in model.named_parameters() if n.startswith("tables.")]
        rest = [p for n, p in model.named_parameters() if not n.startswith("tables.")]
        adagrad = torch.optim.Adagrad(emb, lr=a.lr)
        adam = torch.optim.Adam(rest, lr=a.mlp_lr)
        opts = (adagrad, adam)
    else:
        import psd.torch
        client = psd.torch.init()
        shards = len(client.servers)
        tables = []
        for f in range(FIELDS):
            life = {"rows_max": max(a.min_rows, truth["distinct"][f])}  # room for every id
            if not a.unbounded:
                per_shard = math.ceil(rows[f] / shards)
                life = dict(rows_max=per_shard, evict_at_budget=True,
                            admit_after=a.admit_after, evict_after=a.evict_after,
                            evict_half_life=a.half_life,
                            admit_counters=max(4096, 1 << (8 * per_shard - 1).bit_length()))
            tables.append(psd.torch.EmbeddingBag(
                ID_SPACE, a.dim, "dlrm.C%d" % (f + 1), mode="sum", optimizer="adagrad",
                lr=a.lr, init="normal", init_scale=0.01, seed=f + 1,
                **life))
        model = net = DLRM(psd.torch.EmbeddingBagCollection(tables), a.dim)
        opts = (psd.torch.DistributedOptimizer(net, "adam", lr=a.mlp_lr, prefix="dlrm."),)

    per = a.batch // world
    steps = len(train) // a.batch
    if a.steps:
        steps = min(steps, a.steps)
    if steps < 1:
        raise SystemExit("%s: fewer than --batch %d training examples" % (a.data, a.batch))
    t0 = time.monotonic()
    window, seen = 0.0, 0
    report = max(1, steps // 10)
    for s in range(steps):
        lo = s * a.batch + rank * per
        counts, ids, y = batch(train, lo, lo + per)
        for o in opts:
            o.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(net(counts, ids), y)
        loss.backward()
        for o in opts:
            o.step()
        window += loss.item()
        seen += 1
        if (s + 1) % report == 0 or s + 1 == steps:
            print("rank %d step %d/%d: train log-loss %.5f, %.0f examples/s"
                  % (rank, s + 1, steps, window / seen, (s + 1) * per / (time.monotonic() - t0)),
                  flush=True)
            window, seen = 0.0, 0
    if not a.ddp:
        model.tables.finish()
    elapsed = time.monotonic() - t0
    model.eval()
    total, n = 0.0, len(test)
    with torch.no_grad():
        for lo in range(0, n, 8192):
            counts, ids, y = batch(test, lo, min(n, lo + 8192))
            total += torch.nn.functional.binary_cross_entropy_with_logits(
                model(counts, ids), y, reduction="sum").item()
    logloss = total / n
    rate = steps * per / elapsed
    print("rank %d: held-out log-loss %.5f (the true model's: %.5f), %.0f examples/s"
          % (rank, logloss, truth["test_logloss"], rate), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"test_logloss": logloss, "true_logloss": truth["test_logloss"],
                       "examples_per_s": rate, "steps": steps, "rows": rows}, f)
    if a.ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
