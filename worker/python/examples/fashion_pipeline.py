#!/usr/bin/env python3
"""fashion_cnn.py's CNN split into pipeline stages, trained through psd.

Stage 0 runs conv1, conv2 and fc1; stage 1 runs fc2 (--stages 2), with
--microbatches micro-batches a step under --schedule (1f1b or gpipe).
Every process is one stage of one pipeline: rank r runs stage
r % stages of pipeline r // stages, and the WORLD_SIZE / stages
pipelines each take their share of every epoch's batches, as
fashion_cnn.py's workers do. The stages' tables are named as Net's
state_dict, so psctl export loads into fashion_cnn.py's Net.

    PSD_SERVERS=tcp://h:p,tcp://h:p PSD_STAGE_ENDPOINTS=tcp://a:5590,tcp://b:5590 \\
        RANK=0 WORLD_SIZE=2 python3 fashion_pipeline.py --stages 2

Evaluation runs through the stages; the last stage prints the accuracy."""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from fashion_cnn import DATA, Net, read_idx  # noqa: E402


class Front(nn.Module):
    """conv1, conv2 and fc1 of a Net, under the Net's names."""

    def __init__(self, net):
        super().__init__()
        self.conv1, self.conv2, self.fc1 = net.conv1, net.conv2, net.fc1

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return F.relu(self.fc1(x.flatten(1)))


class Head(nn.Module):
    """fc2 of a Net."""

    def __init__(self, net):
        super().__init__()
        self.fc2 = net.fc2

    def forward(self, x):
        return self.fc2(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=DATA, help="Fashion-MNIST's IDX files (default %(default)s)")
    ap.add_argument("--stages", type=int, default=2, choices=[2],
                    help="pipeline stages (this model splits in 2)")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    ap.add_argument("--stage-endpoints", help="default: PSD_STAGE_ENDPOINTS")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64, help="per pipeline")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the summary here")
    a = ap.parse_args()
    if (a.epochs < 1 or a.batch < 1 or not a.lr > 0 or a.threads < 1 or a.steps < 0 or
            a.microbatches < 1 or a.batch % a.microbatches):
        ap.error("--epochs, --batch, --threads and --microbatches must be >= 1, --batch a "
                 "multiple of --microbatches, --lr > 0, --steps >= 0")
    torch.set_num_threads(a.threads)
    import psd.torch                                                           # psd:
    client = psd.torch.init(timeout_ms=120000)
    rank, world = client.rank, client.workers
    s, pipeline, pipelines = rank % a.stages, rank // a.stages, world // a.stages
    x = read_idx(os.path.join(a.data, "train-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz"))
    tx = read_idx(os.path.join(a.data, "t10k-images-idx3-ubyte.gz"))
    ty = read_idx(os.path.join(a.data, "t10k-labels-idx1-ubyte.gz"))
    torch.manual_seed(a.seed)
    net = Net()
    stage = psd.torch.PipelineStage(Front(net) if s == 0 else Head(net), s, a.stages,  # psd:
                                    endpoints=a.stage_endpoints)
    kind = psd.torch.Schedule1F1B if a.schedule == "1f1b" else psd.torch.ScheduleGPipe
    schedule = kind(stage, a.microbatches, loss_fn=F.cross_entropy)           # psd:
    opt = psd.torch.DistributedOptimizer(stage, "momentum", lr=a.lr,          # psd:
                                         momentum=a.momentum)

    per_epoch = len(x) // (a.batch * pipelines)
    g = torch.Generator().manual_seed(a.seed)  # the same order on every rank
    done, t_train = 0, 0.0
    summary = {"rank": rank, "workers": world, "stage": s, "stages": a.stages,
               "pipeline": pipeline, "schedule": a.schedule, "microbatches": a.microbatches,
               "epochs": []}
    for epoch in range(a.epochs):
        perm = torch.randperm(len(x), generator=g)
        t0 = time.monotonic()
        loss_sum = 0.0
        for i in range(per_epoch):
            idx = perm[(i * pipelines + pipeline) * a.batch:(i * pipelines + pipeline + 1) * a.batch]
            opt.zero_grad()
            losses = []
            if stage.is_first:
                schedule.step(x[idx])
            else:
                schedule.step(target=y[idx], losses=losses)
            opt.step()
            loss_sum += float(sum(losses)) / a.microbatches if losses else 0.0
            done += 1
            if a.steps and done == a.steps:
                break
        t_train += time.monotonic() - t0
        if a.steps and done == a.steps:
            break
        right = 0
        for j in range(0, len(tx), 1000):  # evaluation through the stages
            out = schedule.eval(tx[j:j + 1000] if stage.is_first else None)
            if out is not None:
                right += (out.argmax(1) == ty[j:j + 1000]).sum().item()
        acc = right / len(tx) if stage.is_last else None
        summary["epochs"].append({"loss": loss_sum / per_epoch if stage.is_last else None,
                                  "test_accuracy": acc})
        if stage.is_last:
            print("rank %d (stage %d of pipeline %d) epoch %d/%d: loss %.4f, test accuracy "
                  "%.4f, %.0f samples/s" % (rank, s, pipeline, epoch + 1, a.epochs,
                                            loss_sum / per_epoch, acc, done * a.batch / t_train),
                  flush=True)
    opt.close()
    stage.close()
    summary["steps"] = done
    summary["samples_per_sec"] = done * a.batch / t_train if t_train > 0 else 0.0
    summary["activations_held_max"] = stage.activations_held_max
    summary["idle_seconds"] = stage.idle_seconds
    summary["test_accuracy"] = summary["epochs"][-1]["test_accuracy"] if summary["epochs"] \
        else None
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f)


if __name__ == "__main__":
    main()
