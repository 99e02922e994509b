#!/usr/bin/env python3
"""Click-through prediction with an embedding table on psd.

The model is logistic regression over sparse features written as PyTorch:
a psd.torch.EmbeddingBag of dimension 1 (one weight per feature, summed
over the example's features: its rows live in psd's sparse table and
only the batch's rows move) plus a bias trained by DistributedOptimizer,
in the same loop. The data is gen_clicks' (libsvm text, built with the
tests: BUILD/tests/gen_clicks --out DIR), whose truth.json holds the
true model's own held-out log-loss.

    PSD_SERVERS=tcp://127.0.0.1:5555 python3 clicks.py --data DIR
    python3 clicks.py --data DIR --ddp      # the same loop on DDP (gloo)

Environment: PSD_SERVERS, RANK and WORLD_SIZE (as torchrun sets them);
each rank trains on its own share of the batches."""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def read_svm(path):
    """(labels, feature ids, offsets) of a libsvm file of binary features."""
    labels, ids, offsets = [], [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            try:
                labels.append(float(parts[0]))
                offsets.append(len(ids))
                ids.extend(int(p.split(":", 1)[0]) for p in parts[1:])
            except ValueError:
                raise SystemExit("%s:%d: not a libsvm line: %r" % (path, n, line[:80]))
    return (torch.tensor(labels, dtype=torch.float32), torch.tensor(ids, dtype=torch.int64),
            torch.tensor(offsets, dtype=torch.int64))


def batch(data, rows):
    """The examples rows (a range) as (labels, ids, offsets) of one bag each."""
    y, ids, off = data
    lo, hi = rows.start, rows.stop
    first = off[lo]
    last = off[hi] if hi < len(off) else torch.tensor(len(ids))
    return y[lo:hi], ids[first:last], off[lo:hi] - first


class Clicks(torch.nn.Module):
    def __init__(self, features, emb):
        super().__init__()
        self.weights = emb  # features x 1, summed per example
        self.bias = torch.nn.Parameter(torch.zeros(1))

    def forward(self, ids, offsets):
        return self.weights(ids, offsets).squeeze(1) + self.bias


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="gen_clicks' output folder")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256, help="examples per worker and step")
    ap.add_argument("--lr", type=float, default=0.2, help="Adagrad's learning rate")
    ap.add_argument("--ddp", action="store_true", help="train on torch DDP (gloo) instead")
    ap.add_argument("--json", help="write the held-out log-loss here")
    a = ap.parse_args()
    if a.epochs < 1 or a.batch < 1 or not a.lr > 0:
        ap.error("--epochs and --batch must be >= 1 and --lr > 0")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.manual_seed(0)
    train = read_svm(os.path.join(a.data, "train.svm"))
    test = read_svm(os.path.join(a.data, "test.svm"))
    features = int(max(train[1].max(), test[1].max())) + 1

    if a.ddp:
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group("gloo", rank=rank, world_size=world)
        emb = torch.nn.EmbeddingBag(features, 1, mode="sum")
        torch.nn.init.zeros_(emb.weight)
        net = torch.nn.parallel.DistributedDataParallel(Clicks(features, emb))
        opt = torch.optim.Adagrad(net.parameters(), lr=a.lr)
        model = net.module
    else:
        import psd.torch
        emb = psd.torch.EmbeddingBag(features, 1, "clicks.weights", mode="sum",
                                     optimizer="adagrad", lr=a.lr, init="zeros")
        model = net = Clicks(features, emb)
        opt = psd.torch.DistributedOptimizer(net, "adagrad", lr=a.lr)

    n = len(train[0])
    steps = n // (a.batch * world)
    t0 = time.monotonic()
    for epoch in range(a.epochs):
        total = 0.0
        for s in range(steps):
            lo = (s * world + rank) * a.batch
            y, ids, off = batch(train, range(lo, lo + a.batch))
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(net(ids, off), y)
            loss.backward()
            opt.step()
            total += loss.item()
        print("rank %d epoch %d/%d: train log-loss %.5f, %.0f examples/s"
              % (rank, epoch + 1, a.epochs, total / steps,
                 (epoch + 1) * steps * a.batch / (time.monotonic() - t0)), flush=True)
    model.eval()
    with torch.no_grad():
        y, ids, off = batch(test, range(0, len(test[0])))
        logloss = torch.nn.functional.binary_cross_entropy_with_logits(model(ids, off), y).item()
    truth = os.path.join(a.data, "truth.json")
    best = json.load(open(truth))["test_logloss"] if os.path.exists(truth) else math.nan
    print("rank %d: held-out log-loss %.5f (the true model's: %.5f)" % (rank, logloss, best))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"test_logloss": logloss, "true_logloss": best}, f)


if __name__ == "__main__":
    main()
