"""Sparse tables' life cycle through real psd processes: a restart from a
checkpoint admits and evicts exactly as a run that never stopped (with
row-wise Adagrad: its accumulators are in the checkpoint too); a peer
pushing junk ids cannot push the hot rows out, nor the table past its
budget; /metrics and psctl show the counts."""
import json
import os
import re
import subprocess
import time
import urllib.request

import numpy as np
import pytest

import psd
from conftest import child_env, export

DIM = 4
SPEC = dict(optimizer="rowwise_adagrad", lr=0.5, rows_max=60, init="uniform", init_scale=0.1, seed=5, admit_after=2,
            evict_after=40, evict_at_budget=True, admit_counters=4096)


def workload(step):
    """Step's keys (increasing) and gradients: a hot set and a long tail."""
    rng = np.random.default_rng(step)
    hot = rng.choice(20, 6, replace=False)
    tail = 1000 + rng.zipf(1.3, 12) % 5000
    keys = np.unique(np.concatenate([hot, tail])).astype(np.uint64)
    return keys, rng.standard_normal((keys.size, DIM)).astype(np.float32)


def run(cluster, tmp, steps, restart_at=None, spec=SPEC):
    ckpt = str(tmp / "ckpt")
    args = ["--checkpoint-dir", ckpt]
    servers = cluster.start(shards=2, args=args)
    c = psd.Client(servers)
    c.create_sparse_table("e", DIM, **spec)
    for step in range(steps):
        if step == restart_at:
            c.close()
            assert set(cluster.stop()) == {0}  # each shard writes a checkpoint at shutdown
            servers = cluster.start(shards=2, args=args)
            c = psd.Client(servers)
            c.create_sparse_table("e", DIM, **spec)  # the same spec: the restored table
        keys, g = workload(step)
        c.push_rows("e", keys, g).wait()
    c.close()
    out = export(servers, tmp / "export.safetensors")
    assert set(cluster.stop()) == {0}
    return out


@pytest.mark.parametrize("half_life", [0, 30])
def test_a_restart_admits_and_evicts_as_before(cluster, tmp_path, half_life):
    """With the budget's victims by last push, and by decayed frequency
    (a budget small enough that most new rows evict one)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    spec = dict(SPEC, evict_half_life=half_life, rows_max=12 if half_life else SPEC["rows_max"])
    whole = run(cluster, tmp_path / "a", 300, spec=spec)
    broken = run(cluster, tmp_path / "b", 300, restart_at=170, spec=spec)
    assert sorted(whole) == sorted(broken)
    for name in whole:
        np.testing.assert_array_equal(whole[name], broken[name], err_msg=name)
    assert len(whole) > 0


def metric(text, name, table="e"):
    for line in text.splitlines():
        if line.startswith(name + "{") and 'table="%s"' % table in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no %s for table %s in /metrics:\n%s" % (name, table, text[:3000]))


def test_junk_ids_cannot_push_the_hot_rows_out(cluster):
    servers = cluster.start(args=["--metrics-listen", "127.0.0.1:0"])
    budget = 200
    hot = np.arange(50, dtype=np.uint64)
    with psd.Client(servers, rank=0, workers=2) as c, \
            psd.Client(servers, rank=1, workers=2) as junk:
        spec = dict(SPEC, optimizer="sgd", rows_max=budget, evict_after=0, admit_after=3,
                    init="zeros")
        c.create_sparse_table("e", DIM, **spec)
        junk.create_sparse_table("e", DIM, **spec)
        one = np.ones((hot.size, DIM), np.float32)
        rng = np.random.default_rng(9)
        pushes = 0
        for step in range(400):
            c.push_rows("e", hot, one).wait()
            pushes += 1
            for _ in range(3):  # three junk pushes of 150 new ids each per hot push
                ids = np.unique(rng.integers(10**6, 10**12, 150)).astype(np.uint64)
                junk.push_rows("e", ids, np.ones((ids.size, DIM), np.float32)).wait()
        w = np.empty((hot.size, DIM), np.float32)
        c.pull_rows("e", hot, w).wait()
        # every hot id was admitted within its first few pushes (at the 3rd;
        # a count-min sketch may count one too many, and its halvings may
        # take one off) and never evicted: each push since moved it by lr
        # (0.5) x 1, where an eviction would have taken it back to 0
        steps = -w[:, 0] / 0.5
        assert np.all(w == w[:, :1]), w
        assert np.all((steps >= pushes - 5) & (steps <= pushes)), steps
    text = metrics_text(cluster, pushes * 4)
    got = {n: metric(text, "psd_table_" + n) for n in (
        "rows", "rows_admitted_total", "pushes_held_back_total", "rows_evicted_budget_total",
        "rows_refused_total", "held_bytes")}
    print("junk flood: %s" % got)
    assert got["rows"] <= budget
    assert got["pushes_held_back_total"] > 100000  # the junk, counted and not applied
    # the sketch and each row's record are all the life cycle holds
    assert got["held_bytes"] <= budget * DIM * 4 + 4096 + budget * 8


def metrics_text(cluster, pushes_wanted):
    """/metrics of the first psd, its port read from its log."""
    log = os.path.join(cluster.tmp, "psd0.log")
    deadline = time.monotonic() + 10
    while True:
        m = re.search(r"metrics on \S+ \(port (\d+)\)", open(log).read())
        if m or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert m, "no metrics port in psd's log"
    url = "http://127.0.0.1:%s/metrics" % m.group(1)
    # the page is what the loop last published: polled until it has the
    # table and its last push
    while True:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        if ('psd_table_rows{table="e"}' in text and
                'psd_requests_total{op="push"} %d' % pushes_wanted in text) or \
                time.monotonic() > deadline + 10:
            return text
        time.sleep(0.05)


def psctl_export(servers, out, since=None):
    """psctl export [--since PREV] OUT: its return code, stderr, and the
    tensors with the header's metadata."""
    psctl = os.environ.get("PSCTL_BIN")
    if not psctl:
        pytest.skip("PSCTL_BIN is not set")
    cmd = [psctl, "--servers", servers, "export", str(out)]
    if since is not None:
        cmd[3:3] = ["--since", str(since)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=child_env())
    return r.returncode, r.stderr, (psd.load_safetensors(out) if r.returncode == 0 else None)


def test_a_delta_chain_restores_the_last_state(cluster, tmp_path):
    servers = cluster.start(shards=2)
    spec = dict(SPEC, rows_max=40, admit_after=0, admit_counters=0, evict_after=25)
    with psd.Client(servers) as c:
        c.create_sparse_table("e", DIM, **spec)
        step = 0

        def push(n):
            nonlocal step
            for _ in range(n):
                keys, g = workload(step)
                c.push_rows("e", keys, g).wait()
                step += 1

        push(60)
        rc, err, base = psctl_export(servers, tmp_path / "base.safetensors")
        assert rc == 0, err
        state = dict(zip(base["e.keys"].tolist(), base["e"]))
        prev = tmp_path / "base.safetensors"
        evicted = 0
        for i, n in enumerate((40, 3, 40)):
            push(n)
            out = tmp_path / ("delta%d.safetensors" % i)
            rc, err, d = psctl_export(servers, out, since=prev)
            assert rc == 0, err
            assert 0 < len(d["e.keys"])
            if n == 3:  # 3 pushes of at most 18 ids: fewer rows than the table's
                assert len(d["e.keys"]) <= 54 < len(state)
            for k in d["e.evicted"].tolist():
                state.pop(k, None)
            evicted += len(d["e.evicted"])
            state.update(zip(d["e.keys"].tolist(), d["e"]))
            prev = out
        rc, err, full = psctl_export(servers, tmp_path / "full.safetensors")
        assert rc == 0, err
    assert evicted > 0
    keys = sorted(state)
    assert keys == full["e.keys"].tolist()  # evicted ids absent, every live one there
    np.testing.assert_array_equal(np.stack([state[k] for k in keys]), full["e"])


def test_a_delta_from_before_the_kept_evictions_is_refused(cluster, tmp_path):
    servers = cluster.start()
    spec = dict(SPEC, optimizer="sgd", rows_max=100, admit_after=0, admit_counters=0,
                evict_after=0)
    with psd.Client(servers) as c:
        c.create_sparse_table("e", DIM, **spec)
        ones = np.ones((100, DIM), np.float32)
        for b in range(2):
            c.push_rows("e", np.arange(b * 100, b * 100 + 100, dtype=np.uint64), ones).wait()
        rc, err, _ = psctl_export(servers, tmp_path / "base.safetensors")
        assert rc == 0, err
        # 4,200 more new ids evict 4,200 rows: past the 4,096 tombstones a
        # table of 100 rows keeps
        for b in range(2, 44):
            c.push_rows("e", np.arange(b * 100, b * 100 + 100, dtype=np.uint64), ones).wait()
        rc, err, _ = psctl_export(servers, tmp_path / "d.safetensors",
                                  since=tmp_path / "base.safetensors")
        assert rc != 0
        assert "older than the evictions" in err and "take a full export" in err, err
        rc, err, _ = psctl_export(servers, tmp_path / "d.safetensors",
                                  since=tmp_path / "nothing.safetensors")
        assert rc != 0 and "cannot read it" in err, err


def test_a_stream_in_a_fifth_of_its_ids(cluster, tmp_path):
    """The click model (gen_clicks: 50,000 features, Zipf exponent 1.3,
    8 a click) streamed for 3 epochs through 2 shards and 2 workers, its
    weights in a table of a fifth of the ids it sees (evicting the least
    recently pushed, admitting at the 2nd push), against the same run
    unbounded: the table never holds more, and the held-out log-loss
    stays within 2%."""
    import threading
    gen, worker = os.environ.get("GEN_CLICKS_BIN"), os.environ.get("PSWORKER_BIN")
    psctl = os.environ.get("PSCTL_BIN")
    if not gen or not worker or not psctl:
        pytest.skip("GEN_CLICKS_BIN, PSWORKER_BIN and PSCTL_BIN are needed")
    data = tmp_path / "clicks"
    subprocess.run([gen, "--out", str(data), "--train", "400000", "--test", "20000",
                    "--features", "50000", "--active", "8", "--alpha", "1.3", "--seed", "3"],
                   check=True, capture_output=True, env=child_env())
    ids = set()
    with open(data / "train.svm") as f:
        for line in f:
            ids.update(tok.split(":", 1)[0] for tok in line.split()[1:])
    per_shard = len(ids) // 5 // 2

    def train(extra, name):
        servers = cluster.start(shards=2, args=["--workers", "2"])
        seen, stop = [0, 0], threading.Event()

        def watch():  # the rows each shard holds, while the workers train
            while not stop.is_set():
                r = subprocess.run([psctl, "--servers", servers, "--json", "status"],
                                   capture_output=True, text=True, env=child_env())
                try:
                    for i, s in enumerate(json.loads(r.stdout)["shards"]):
                        for t in s.get("tables", []):
                            if t["name"] == "lr.weight":
                                seen[i] = max(seen[i], t["rows"])
                except (ValueError, KeyError):
                    pass
                stop.wait(0.1)
        w = threading.Thread(target=watch)
        w.start()
        procs = [subprocess.Popen(
            [worker, "--model", "sparse-lr", "--data", str(data), "--servers", servers,
             "--rank", str(r), "--workers", "2", "--optimizer", "adagrad", "--lr", "0.2",
             "--batch", "256", "--epochs", "3", "--device", "cpu", "--summary-json",
             str(tmp_path / ("%s%d.json" % (name, r)))] + extra,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env())
            for r in range(2)]
        for p in procs:
            _, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-3000:]
        r = subprocess.run([psctl, "--servers", servers, "--json", "status"],
                           capture_output=True, text=True, env=child_env())
        stop.set()
        w.join()
        last = [t for s in json.loads(r.stdout)["shards"] for t in s["tables"]
                if t["name"] == "lr.weight"]
        assert set(cluster.stop()) == {0}
        loss = json.load(open(tmp_path / ("%s0.json" % name)))["test_logloss"]
        return loss, seen, last

    free, _, _ = train([], "free")
    bound, seen, last = train(["--rows-max", str(per_shard), "--evict-at-budget",
                               "--admit-after", "2"], "bound")
    print("stream: %d ids, %d rows a shard at most; log-loss %.5f unbounded, %.5f bounded "
          "(%+.2f%%); rows seen %s; evicted %s" % (
              len(ids), per_shard, free, bound, 100 * (bound - free) / free, seen,
              [t["evicted_budget"] for t in last]))
    assert max(seen) <= per_shard and max(seen) > 0
    assert all(t["rows"] <= per_shard for t in last)
    assert sum(t["evicted_budget"] for t in last) > 0
    assert bound <= free * 1.02


def test_a_restart_keeps_the_age_floor(cluster, tmp_path):
    """evict_after_s: once the floor passed the rows pushed first (polled
    on /metrics, no push since, so none was evicted yet), a restart from
    the checkpoint keeps it: the first push after evicts them (a floor
    started afresh would take another evict_after_s)."""
    args = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--metrics-listen", "127.0.0.1:0"]
    servers = cluster.start(args=args)
    old = np.arange(50, dtype=np.uint64)
    with psd.Client(servers) as c:
        c.create_sparse_table("e", DIM, "sgd", lr=0.5, rows_max=1000, evict_after_s=1)
        c.push_rows("e", old, np.ones((old.size, DIM), np.float32)).wait()
    deadline = time.monotonic() + 30
    while True:  # the floor past tick 1, the old rows' push
        text = metrics_text(cluster, 1)
        if metric(text, "psd_table_age_floor") >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert metric(text, "psd_table_age_floor") >= 2, text
    assert metric(text, "psd_table_rows") == old.size
    assert metric(text, "psd_table_rows_evicted_age_total") == 0
    assert set(cluster.stop()) == {0}  # a checkpoint at shutdown
    servers = cluster.start(args=args)
    with psd.Client(servers) as c:
        c.create_sparse_table("e", DIM, "sgd", lr=0.5, rows_max=1000, evict_after_s=1)
        c.push_rows("e", np.array([7000], np.uint64), np.ones((1, DIM), np.float32)).wait()
        r = subprocess.run([os.environ["PSCTL_BIN"], "--servers", servers, "--json", "status"],
                           capture_output=True, text=True, env=child_env())
    assert r.returncode == 0, r.stderr
    t = [t for s in json.loads(r.stdout)["shards"] for t in s["tables"] if t["name"] == "e"][0]
    assert t["evicted_age"] == old.size and t["rows"] == 1, t
