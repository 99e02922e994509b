"""psworker --precision: 16-bit compute with f32 accumulation, and f16's
dynamic loss scaling with the workers agreeing, through a vote table in
psd, on the steps they skip. The rounding itself is checked against
torch's casts in test_layers.py."""
import json
import os
import subprocess

import numpy as np
import pytest

import psd
from conftest import DATA, child_env, export, run_psworkers, worker_bin


def run_workers(tmp, args_of, n, name="w"):
    return run_psworkers([worker_bin(), "--data", DATA, "--device", "cpu", "--epochs", "1",
                          "--batch", "32"], tmp, args_of, n, name)


def status(servers):
    psctl = os.environ.get("PSCTL_BIN")
    if not psctl:
        pytest.skip("PSCTL_BIN is not set")
    r = subprocess.run([psctl, "--servers", servers, "--json", "status"], capture_output=True,
                       text=True, env=child_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def train(tmp, name, extra):
    out = tmp / (name + ".safetensors")
    (s, err), = run_workers(tmp, lambda r: ["--max-steps", "40", "--save", str(out)] + extra, 1,
                            name)
    return psd.load_safetensors(out), s, err


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_bf16_one_bsp_worker_equals_standalone(cluster, tmp_path, model):
    common = ["--model", model, "--precision", "bf16"]
    alone, s_alone, err = train(tmp_path, "alone", common + ["--standalone"])
    assert "computing in bf16 with f32 accumulation" in err
    servers = cluster.start(args=["--consistency", "bsp"])
    dist, s_dist, _ = train(tmp_path, "dist", common + ["--servers", servers])
    for k in alone:
        np.testing.assert_array_equal(dist[k], alone[k], err_msg=k)
    assert s_dist["precision"] == s_alone["precision"] == "bf16"
    # the same run in f32 ends elsewhere (the rounding did something) and
    # about as well
    f32, s_f32, _ = train(tmp_path, "f32", ["--model", model, "--standalone"])
    assert any(not np.array_equal(f32[k], alone[k]) for k in alone)
    assert s_alone["test_accuracy"] > 0.5 and s_f32["test_accuracy"] > 0.5
    assert abs(s_alone["test_accuracy"] - s_f32["test_accuracy"]) < 0.05


def test_an_overflow_is_skipped_on_every_worker(cluster, tmp_path):
    """Worker 1's gradients overflow at clock 5 (injected): both workers
    skip that step, the scale halves on both, the servers take no round
    for it, and training goes on to the last step."""
    servers = cluster.start(shards=2, args=["--consistency", "bsp", "--workers", "2"])
    steps = 20
    out = run_workers(tmp_path, lambda r: [
        "--servers", servers, "--rank", str(r), "--workers", "2", "--max-steps", str(steps),
        "--precision", "f16"] + (["--test-overflow-at", "5"] if r == 1 else []), 2)
    (s0, e0), (s1, e1) = out
    assert "step at clock 5 skipped: gradients overflowed at loss scale 65536 (here: 1 non-finite)" \
        in e1, e1[-2000:]
    assert "step at clock 5 skipped: gradients overflowed at loss scale 65536 (on another " \
        "worker)" in e0, e0[-2000:]
    for s in (s0, s1):
        assert s["skipped_steps"] == 1
        assert s["loss_scale"] == 32768
        assert s["steps"] == steps
        assert s["test_accuracy"] > 0.5
    # every model round happened once: the tables are at the last clock,
    # and the vote table (not part of the model) is not exported
    clocks = {}
    for shard in status(servers)["shards"]:
        for t in shard["tables"]:
            clocks[t["name"]] = max(clocks.get(t["name"], 0), t["clock"])
    assert clocks["fc1.weight"] == steps, clocks
    assert clocks["psd:found_inf"] == steps + 1, clocks  # one more vote: the skipped step
    assert "psd:found_inf" not in export(servers, tmp_path / "e.safetensors")


def test_the_scale_grows_after_clean_steps(tmp_path):
    (s, err), = run_workers(tmp_path, lambda r: [
        "--standalone", "--max-steps", "12", "--precision", "f16", "--loss-scale", "1",
        "--growth-interval", "5"], 1)
    assert s["loss_scale"] == 4 and s["skipped_steps"] == 0
    assert err.count("after 5 steps without an overflow") == 2


def test_a_diverging_f16_run_stops(tmp_path):
    """A forward pass that overflows f16 is no loss-scale matter: the run
    stops at the non-finite loss and says so, rather than skipping steps
    and halving the scale for ever."""
    r = subprocess.run([worker_bin(), "--data", DATA, "--device", "cpu", "--standalone",
                        "--max-steps", "100", "--precision", "f16", "--loss-scale", "2",
                        "--lr", "100", "--optimizer", "sgd"],
                       capture_output=True, text=True, env=child_env(), timeout=300)
    assert r.returncode != 0
    assert "W0305 the loss became" in r.stderr, r.stderr[-2000:]
    assert "skipped" not in r.stderr


@pytest.mark.parametrize("flags,says", [
    (["--standalone", "--precision", "f8"], "--precision: 'f8' is not f32, bf16 or f16"),
    (["--precision", "bf16", "--model", "sparse-lr", "--servers", "tcp://127.0.0.1:1"],
     "--model sparse-lr computes in f32"),
    (["--standalone", "--precision", "f16", "--loss-scale", "0.5"], "loss-scale"),
])
def test_bad_precision_flags_are_named(flags, says):
    r = subprocess.run([worker_bin(), "--data", DATA] + flags,
                       capture_output=True, text=True, env=child_env(), timeout=60)
    assert r.returncode != 0
    assert says in r.stderr, r.stderr
