#!/usr/bin/env python3
"""A CNN on Fashion-MNIST, trained through psd with psd.torch.

The model: conv 1->32 3x3, ReLU, max-pool 2, conv 32->64 3x3, ReLU,
max-pool 2, fc 1600->128, ReLU, fc 128->10. Each worker takes its share
of every epoch's shuffled batches (batch 64 per worker). The three lines
that make it train on psd are marked "psd:"; --ddp runs the same loop
on torch.distributed DDP (gloo) instead, --local on one process with a
local optimizer.

    PSD_SERVERS=tcp://h:p,tcp://h:p RANK=0 WORLD_SIZE=2 python3 fashion_cnn.py
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 RANK=0 WORLD_SIZE=2 \\
        python3 fashion_cnn.py --ddp

deploy/quickstart.sh --python starts psd shards and runs it on them."""
import argparse
import gzip
import json
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An IDX file (gzip): images as float32 in [0, 1] (n, 1, 28, 28), or labels."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise SystemExit("%s: too short for an IDX file" % path)
    magic, n = struct.unpack(">II", raw[:8])
    if magic == 2051:
        rows, cols = struct.unpack(">II", raw[8:16])
        a = np.frombuffer(raw, np.uint8, n * rows * cols, 16)
        return torch.from_numpy(a.reshape(n, 1, rows, cols).astype(np.float32) / 255.0)
    if magic == 2049:
        return torch.from_numpy(np.frombuffer(raw, np.uint8, n, 8).astype(np.int64))
    raise SystemExit("%s: not an IDX image or label file (magic %#x)" % (path, magic))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(1600, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def accuracy(model, x, y, bf16):
    model.eval()
    right = 0
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        for i in range(0, len(x), 1000):
            right += (model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum().item()
    model.train()
    return right / len(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=DATA, help="Fashion-MNIST's IDX files (default %(default)s)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64, help="per worker")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--bf16", action="store_true", help="torch.autocast('cpu', bfloat16)")
    ap.add_argument("--wire-dtype", default="f32", choices=["f32", "f16", "bf16"])
    ap.add_argument("--topk", type=float, help="send this fraction of each gradient")
    ap.add_argument("--bucket-bytes", type=int, default=None,
                    help="DistributedOptimizer's bucket size (default: its own)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--steps", type=int, default=0,
                    help="stop after this many steps and report samples/s (benchmarks)")
    ap.add_argument("--seed", type=int, default=1)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--ddp", action="store_true", help="torch DDP over gloo instead of psd")
    mode.add_argument("--local", action="store_true", help="one process, a local optimizer")
    ap.add_argument("--json", help="write the summary here")
    a = ap.parse_args()
    if a.epochs < 1 or a.batch < 1 or not a.lr > 0 or a.threads < 1 or a.steps < 0:
        ap.error("--epochs, --batch and --threads must be >= 1, --lr > 0, --steps >= 0")
    torch.set_num_threads(a.threads)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if a.local and world != 1:
        ap.error("--local trains one process (WORLD_SIZE=1)")
    x = read_idx(os.path.join(a.data, "train-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz"))
    tx = read_idx(os.path.join(a.data, "t10k-images-idx3-ubyte.gz"))
    ty = read_idx(os.path.join(a.data, "t10k-labels-idx1-ubyte.gz"))
    torch.manual_seed(a.seed)
    model = Net()

    if a.ddp:
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group("gloo", rank=rank, world_size=world)
        net = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum)
    elif a.local:
        net = model
        opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum)
    else:
        import psd.torch                                                       # psd:
        bucket = {} if a.bucket_bytes is None else {"bucket_bytes": a.bucket_bytes}
        net = model
        opt = psd.torch.DistributedOptimizer(net, "momentum", lr=a.lr,         # psd:
                                             momentum=a.momentum, topk=a.topk,
                                             wire_dtype=a.wire_dtype, **bucket)

    per_epoch = len(x) // (a.batch * world)
    g = torch.Generator().manual_seed(a.seed)  # the same order on every rank
    done, t_train = 0, 0.0
    summary = {"rank": rank, "workers": world, "mode": "ddp" if a.ddp else
               "local" if a.local else "psd", "epochs": []}
    for epoch in range(a.epochs):
        perm = torch.randperm(len(x), generator=g)
        t0 = time.monotonic()
        loss_sum = 0.0
        for s in range(per_epoch):
            idx = perm[(s * world + rank) * a.batch:(s * world + rank + 1) * a.batch]
            opt.zero_grad()
            with torch.autocast("cpu", torch.bfloat16, enabled=a.bf16):
                loss = F.cross_entropy(net(x[idx]), y[idx])
            loss.backward()
            opt.step()                                                         # psd: as always
            loss_sum += loss.item()
            done += 1
            if a.steps and done == a.steps:
                break
        t_train += time.monotonic() - t0
        if a.steps and done == a.steps:
            break
        acc = accuracy(model, tx, ty, a.bf16)
        summary["epochs"].append({"loss": loss_sum / per_epoch, "test_accuracy": acc})
        print("rank %d epoch %d/%d: loss %.4f, test accuracy %.4f, %.0f samples/s"
              % (rank, epoch + 1, a.epochs, loss_sum / per_epoch, acc,
                 done * a.batch / t_train), flush=True)
    summary["steps"] = done
    summary["samples_per_sec"] = done * a.batch / t_train if t_train > 0 else 0.0
    summary["test_accuracy"] = summary["epochs"][-1]["test_accuracy"] if summary["epochs"] \
        else None
    if a.steps:
        print("rank %d: %d steps, %.1f samples/s" % (rank, done, summary["samples_per_sec"]),
              flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f)
    if a.ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
