"""psworker --model cnn: one worker in bsp equals --standalone bit for
bit, the export loads into the same network written in PyTorch and
scores what psworker scored, and --arch says what is wrong with a bad
layer list."""
import json
import os
import subprocess

import numpy as np
import pytest

import psd
from conftest import DATA, child_env, export, run_psworkers, worker_bin

torch = pytest.importorskip("torch")
F = torch.nn.functional

STEPS = "30"


def train(tmp, name, extra):
    out = tmp / (name + ".safetensors")
    summary = tmp / (name + ".json")
    r = subprocess.run([worker_bin(), "--model", "cnn", "--data", DATA, "--device", "cpu",
                        "--max-steps", STEPS, "--epochs", "1", "--batch", "32", "--optimizer",
                        "momentum", "--momentum", "0.9", "--lr", "0.05", "--save", str(out),
                        "--summary-json", str(summary)] + extra,
                       capture_output=True, text=True, env=child_env(), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return psd.load_safetensors(out), json.load(open(summary))


def test_one_bsp_worker_equals_standalone(cluster, tmp_path):
    alone, s_alone = train(tmp_path, "alone", ["--standalone"])
    servers = cluster.start(args=["--consistency", "bsp"])
    dist, s_dist = train(tmp_path, "dist", ["--servers", servers])
    assert list(alone) == ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                           "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    for k in alone:
        np.testing.assert_array_equal(dist[k], alone[k], err_msg=k)
    assert s_dist["test_accuracy"] == s_alone["test_accuracy"]
    assert s_alone["test_accuracy"] > 0.5  # 30 steps of 32 learn something


class Net(torch.nn.Module):
    """--arch's default, as the PyTorch user writes it."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3)
        self.conv2 = torch.nn.Conv2d(32, 64, 3)
        self.fc1 = torch.nn.Linear(1600, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def test_the_export_is_the_pytorch_model(cluster, tmp_path):
    servers = cluster.start(shards=2, args=["--consistency", "bsp"])
    _, summary = train(tmp_path, "w", ["--servers", servers])
    tensors = export(servers, tmp_path / "export.safetensors")
    assert tensors["conv2.weight"].shape == (64, 32, 3, 3)
    net = Net()
    net.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()})
    import gzip
    with gzip.open(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    with torch.no_grad():
        # psworker's normalisation (worker/data.c): Fashion-MNIST's mean and deviation
        pixels = (x.astype(np.float32) / 255.0 - 0.2860) / 0.3530
        pred = net(torch.from_numpy(pixels.astype(np.float32))).argmax(1).numpy()
    acc = float((pred == y).mean())
    print("psworker: %.4f, the export in PyTorch: %.4f" % (summary["test_accuracy"], acc))
    assert abs(acc - summary["test_accuracy"]) <= 0.002  # a few near-ties may flip


@pytest.mark.parametrize("arch,says", [
    ("conv3x3:32,relu,relu,fc:10", "a relu goes right after a convolution"),
    ("fc:10", "at least one convolution"),
    ("conv3x3:32,fc:128,fc:10", "a relu between fc layers"),
    ("conv3x5:32,fc:10", "is not convKxK:CHANNELS"),
    ("conv29x29:8,fc:10", "is not convKxK:CHANNELS"),
    ("conv3x3:8,maxpool40,fc:10", "one pooling of 1..26"),
    ("conv3x3:8,fc:10,relu", "ending in an fc"),
    ("conv3x3:8,softmax,fc:10", "'softmax' is not"),
])
def test_bad_arch_is_named(tmp_path, arch, says):
    r = subprocess.run([worker_bin(), "--model", "cnn", "--standalone", "--data", DATA, "--arch",
                        arch], capture_output=True, text=True, env=child_env(), timeout=60)
    assert r.returncode != 0
    assert says in r.stderr, r.stderr


def _two_workers(cluster, tmp, extra):
    servers = cluster.start(shards=2, args=["--consistency", "bsp", "--workers", "2"])
    out = run_psworkers([worker_bin(), "--model", "cnn", "--data", DATA, "--device", "cpu",
                         "--servers", servers, "--workers", "2", "--max-steps", "20",
                         "--epochs", "1", "--batch", "32", "--lr", "0.03"] + extra, tmp,
                        lambda r: ["--rank", str(r)], 2)
    return [summary for summary, _ in out]


@pytest.mark.parametrize("extra", [["--topk", "0.05"], ["--wire-dtype", "f16"],
                                   ["--accum-steps", "2"]])
def test_the_cnn_trains_with(cluster, tmp_path, extra):
    s0, s1 = _two_workers(cluster, tmp_path, extra)
    assert s0["steps"] == s1["steps"] == 20
    assert s0["test_accuracy"] > 0.3, s0  # 10 classes: 0.1 is chance
