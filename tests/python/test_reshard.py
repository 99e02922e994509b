"""psctl reshard: the checkpoints of a stopped cluster of S shards
rewritten for N shards. The new cluster serves the same model (every
weight, optimizer state and pruning mask, sparse rows on the shards their
keys hash to), at the same clock, and goes on exactly as the old one
would have; psworker stopped mid-run on 2 shards and finished on 3 ends
with the model of an unbroken run, bit for bit."""
import json
import os
import subprocess
import time

import numpy as np
import pytest

import psd
from conftest import DATA, child_env, export, worker_bin

PRUNE = ["--prune", "p:0.5:0:4:1"]  # the masks are final after step 4


def psctl(*args):
    tool = os.environ.get("PSCTL_BIN")
    if not tool:
        pytest.skip("PSCTL_BIN is not set")
    return subprocess.run([tool] + list(args), capture_output=True, text=True,
                          env=child_env(), timeout=120)


def make_tables(c):
    c.create_table("m", 1001, "momentum", 0.1, momentum=0.9)
    c.create_table("a", (3, 111), "adam", 0.01)
    c.create_table("p", 500, "sgd", 0.1, init="normal", init_scale=1.0, seed=7)
    c.create_sparse_table("e", 4, "adagrad", 0.1)


def steps(c, first, n):
    """n steps of gradients that depend on the step only."""
    for s in range(first, first + n):
        g = np.random.default_rng(s)
        c.push("m", g.standard_normal(1001).astype(np.float32)).wait()
        c.push("a", g.standard_normal(333).astype(np.float32)).wait()
        c.push("p", g.standard_normal(500).astype(np.float32)).wait()
        keys = np.unique(g.integers(0, 1 << 40, 50)).astype(np.uint64)
        c.push_rows("e", keys, g.standard_normal(keys.size * 4).astype(np.float32)).wait()


def as_dict(tensors):
    """An export with each sparse table as {key: row}: shards list rows in
    their own order."""
    out = {}
    for name, v in tensors.items():
        if name.endswith(".keys"):
            continue
        if name + ".keys" in tensors:
            out[name] = {int(k): tuple(r) for k, r in zip(tensors[name + ".keys"], v)}
        else:
            out[name] = v
    return out


def assert_same_model(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        if isinstance(a[k], dict):
            assert a[k] == b[k], k
        else:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def status_clocks(servers):
    r = psctl("--servers", servers, "--json", "status")
    assert r.returncode == 0, r.stderr
    return {t["name"]: t["clock"] for sh in json.loads(r.stdout)["shards"] for t in sh["tables"]
            if t["kind"] == "dense"}


def test_three_shards_serve_the_model_of_two_and_go_on_alike(cluster, tmp_path):
    ck, ck3 = str(tmp_path / "ck"), str(tmp_path / "ck3")
    args = ["--consistency", "bsp", "--workers", "1"] + PRUNE
    servers = cluster.start(shards=2, args=args + ["--checkpoint-dir", ck])
    with psd.Client(servers) as c:
        make_tables(c)
        steps(c, 0, 6)
    before = as_dict(export(servers, tmp_path / "before.safetensors"))
    assert cluster.stop() == [0, 0]  # each shard leaves a checkpoint
    r = psctl("reshard", "--from", ck, "--shards", "3", "--to", ck3)
    assert r.returncode == 0, r.stderr
    assert "resharded 2 shard(s)" in r.stdout and len(os.listdir(ck3)) == 3

    three = cluster.start(shards=3, args=args + ["--checkpoint-dir", ck3])
    assert_same_model(before, as_dict(export(three, tmp_path / "after.safetensors")))
    assert set(status_clocks(three).values()) == {6}
    with psd.Client(three) as c:
        assert c.start_clock == 6
        make_tables(c)  # the same specs: opened
        steps(c, 6, 3)
    went_on = as_dict(export(three, tmp_path / "three.safetensors"))

    # the old cluster, restored on 2 shards, takes the same 3 steps
    two = cluster.start(shards=2, args=args + ["--checkpoint-dir", ck])
    with psd.Client(two) as c:
        make_tables(c)
        steps(c, 6, 3)
    assert_same_model(as_dict(export(two, tmp_path / "two.safetensors")), went_on)
    assert float(np.mean(went_on["p"] == 0)) == 0.5  # the pruning mask moved too


@pytest.mark.parametrize("flags,says", [
    (["--shards", "3", "--to", "TO"], "reshard needs --from DIR"),
    (["--from", "EMPTY", "--shards", "3", "--to", "TO"], "holds no psd checkpoint"),
    (["--from", "MISSING", "--shards", "3", "--to", "TO"], "cannot read"),
    (["--from", "CK", "--shards", "0", "--to", "TO"], "--shards: '0' is not in"),
    (["--from", "CK", "--shards", "2", "--to", "CK"], "holds checkpoints already"),
])
def test_reshard_says_what_is_wrong(cluster, tmp_path, flags, says):
    ck = tmp_path / "ck"
    servers = cluster.start(shards=2, args=["--checkpoint-dir", str(ck)])
    with psd.Client(servers) as c:
        c.create_table("w", 10)
    cluster.stop()
    (tmp_path / "empty").mkdir()
    names = {"TO": str(tmp_path / "to"), "EMPTY": str(tmp_path / "empty"), "CK": str(ck),
             "MISSING": str(tmp_path / "missing")}
    r = psctl("reshard", *[names.get(f, f) for f in flags])
    assert r.returncode != 0
    assert says in r.stderr, r.stderr


def test_a_damaged_shard_is_named(cluster, tmp_path):
    ck = tmp_path / "ck"
    servers = cluster.start(shards=2, args=["--checkpoint-dir", str(ck)])
    with psd.Client(servers) as c:
        c.create_table("w", 10)
    cluster.stop()
    f = [p for p in os.listdir(ck) if p.startswith("shard-1-of-2-")][0]
    data = bytearray((ck / f).read_bytes())
    data[-1] ^= 0xff  # a weight's byte: the checksum no longer holds
    (ck / f).write_bytes(bytes(data))
    r = psctl("reshard", "--from", str(ck), "--shards", "3", "--to", str(tmp_path / "to"))
    assert r.returncode != 0
    assert "no valid checkpoint of shard 1 of 2" in r.stderr and "checksum" in r.stderr, r.stderr


def test_psworker_stopped_on_two_shards_finishes_on_three_as_if_unbroken(cluster, tmp_path):
    ck, ck3 = str(tmp_path / "ck"), str(tmp_path / "ck3")
    args = ["--consistency", "bsp", "--workers", "1"]
    train = [worker_bin(), "--data", DATA, "--device", "cpu", "--epochs", "1", "--batch", "256",
             "--lr", "0.05"]

    unbroken = cluster.start(shards=2, args=args)
    r = subprocess.run(train + ["--servers", unbroken], capture_output=True, text=True,
                       env=child_env(), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    want = export(unbroken, tmp_path / "unbroken.safetensors")

    servers = cluster.start(shards=2, args=args + ["--checkpoint-dir", ck,
                                                   "--checkpoint-every", "0"])
    # stopped mid-run at a step's end: a worker killed mid-step leaves some
    # shards a round further than others, and the checkpoints disagree
    r = subprocess.run(train + ["--servers", servers, "--test-stop-at", "40"], capture_output=True,
                       text=True, env=child_env(), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert min(status_clocks(servers).values()) == 40
    r = psctl("--servers", servers, "checkpoint")
    assert r.returncode == 0, r.stderr
    cluster.stop()
    r = psctl("reshard", "--from", ck, "--shards", "3", "--to", ck3)
    assert r.returncode == 0, r.stderr
    three = cluster.start(shards=3, args=args + ["--checkpoint-dir", ck3])
    r = subprocess.run(train + ["--servers", three], capture_output=True, text=True,
                       env=child_env(), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "rejoining a run in progress at clock" in r.stderr
    got = export(three, tmp_path / "resharded.safetensors")
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_a_tables_life_cycle_is_resharded(cluster, tmp_path):
    """A sparse table that admits and evicts, resharded 2 -> 3: every row
    with its value; the admission counts carried (an id pushed once before
    gets its row at its next push after); the rows' ages carried (a row
    not pushed for evict_after ticks goes); a delta from before the
    reshard refused."""
    ck, ck3 = str(tmp_path / "ck"), str(tmp_path / "ck3")
    spec = dict(lr=0.5, rows_max=1000, init="zeros", admit_after=2, evict_after=150,
                evict_at_budget=True, evict_half_life=100)  # each row's count goes too
    servers = cluster.start(shards=2, args=["--checkpoint-dir", ck])
    one = np.ones((1, 2), np.float32)
    with psd.Client(servers) as c:
        c.create_sparse_table("e", 2, **spec)
        for k in range(100):  # 100 ids admitted (pushed twice), then one pushed once
            for _ in range(2):
                c.push_rows("e", np.array([k], np.uint64), one).wait()
        c.push_rows("e", np.array([777], np.uint64), one).wait()
    before = as_dict(export(servers, tmp_path / "before.safetensors"))
    assert len(before["e"]) == 100 and 777 not in before["e"]
    assert cluster.stop() == [0, 0]
    r = psctl("reshard", "--from", ck, "--shards", "3", "--to", ck3)
    assert r.returncode == 0, r.stderr
    three = cluster.start(shards=3, args=["--checkpoint-dir", ck3])
    assert_same_model(before, as_dict(export(three, tmp_path / "after.safetensors")))
    r = psctl("--servers", three, "--since", str(tmp_path / "before.safetensors"), "export",
              str(tmp_path / "delta.safetensors"))
    assert r.returncode != 0 and "take a full export" in r.stderr, r.stderr
    with psd.Client(three) as c:
        c.create_sparse_table("e", 2, **spec)
        c.push_rows("e", np.array([777], np.uint64), one).wait()  # its second push: admitted
        w = np.zeros((1, 2), np.float32)
        c.pull_rows("e", np.array([777], np.uint64), w).wait()
        assert (w == -0.5).all(), w  # a row, one step from 0 (no row would read 0)
        keep = np.arange(50, 100, dtype=np.uint64)
        for _ in range(160):  # ids 0..49 not pushed for over 150 ticks on every shard
            c.push_rows("e", keep, np.ones((keep.size, 2), np.float32)).wait()
    after = as_dict(export(three, tmp_path / "later.safetensors"))["e"]
    assert not any(k in after for k in range(50)), sorted(after)[:10]
    assert all(k in after for k in range(50, 100))


def test_decayed_counts_are_resharded(cluster, tmp_path):
    """evict_half_life: each row's push count goes with it. Resharded
    2 -> 1 into a table at its budget, a new row evicts the row pushed
    once, not the one pushed twenty times before it (which it would,
    as the least recently pushed, were the counts lost)."""
    ck, ck1 = str(tmp_path / "ck"), str(tmp_path / "ck1")
    spec = dict(lr=0.5, rows_max=3, init="zeros", evict_at_budget=True,
                evict_half_life=10000)
    servers = cluster.start(shards=2, args=["--checkpoint-dir", ck])
    one = np.ones((1, 2), np.float32)
    with psd.Client(servers) as c:
        c.create_sparse_table("e", 2, **spec)
        for _ in range(20):
            c.push_rows("e", np.array([1], np.uint64), one).wait()
        for k in (2, 3):
            c.push_rows("e", np.array([k], np.uint64), one).wait()
    assert cluster.stop() == [0, 0]
    r = psctl("reshard", "--from", ck, "--shards", "1", "--to", ck1)
    assert r.returncode == 0, r.stderr
    servers = cluster.start(shards=1, args=["--checkpoint-dir", ck1])
    with psd.Client(servers) as c:
        c.create_sparse_table("e", 2, **spec)
        c.push_rows("e", np.array([4], np.uint64), one).wait()
    keys = sorted(as_dict(export(servers, tmp_path / "after.safetensors"))["e"])
    assert 1 in keys and 4 in keys and len(keys) == 3, keys
