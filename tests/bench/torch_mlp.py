#!/usr/bin/python3
"""The psworker MLP (784-256-128-10, ReLU, softmax cross-entropy, plain
SGD, batch 64) trained by PyTorch on the CPU, for the comparison with
`psworker --standalone` in tests/bench/README.md. Prints samples/s of the
training loop only (data loading excluded), for 1 thread and for
PyTorch's default. Debian's python3-torch; run with /usr/bin/python3.
  tests/bench/torch_mlp.py [--steps N] [--batch B] [--data DIR] [--threads N]"""
import argparse
import gzip
import os
import sys
import time

import numpy as np

try:
    import torch
except ImportError:
    sys.exit("torch_mlp: needs python3-torch (apt-get install python3-torch), "
             "run with /usr/bin/python3")


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def run(x, y, steps, batch, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    n = x.shape[0]
    for phase, count in (("warm", 20), ("timed", steps)):
        t0 = time.perf_counter()
        for s in range(count):
            i = (s * batch) % (n - batch)
            xb, yb = x[i:i + batch], y[i:i + batch]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        dt = time.perf_counter() - t0
    return steps * batch / dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--threads", type=int, default=0,
                    help="only this many threads; print the samples/s alone")
    a = ap.parse_args()
    x = idx(a.data + "/train-images-idx3-ubyte.gz").reshape(-1, 784)
    y = idx(a.data + "/train-labels-idx1-ubyte.gz")
    x = torch.from_numpy(x.astype(np.float32) / 255.0)
    y = torch.from_numpy(y.astype(np.int64))
    if a.threads > 0:
        print("%.1f" % run(x, y, a.steps, a.batch, a.threads))
        return
    for threads in sorted({1, torch.get_num_threads(), os.cpu_count() or 1}):
        sps = run(x, y, a.steps, a.batch, threads)
        print("pytorch %s, %d thread(s): %.1f samples/s" % (torch.__version__, threads, sps))


if __name__ == "__main__":
    main()
