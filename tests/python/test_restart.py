"""A planned restart: every shard of a bsp run stopped with SIGTERM in the
middle of training and started again with the same flags. A shard
stopped mid-round serves on until the round ends (the workers' pushes
complete it), writes its checkpoint then, and stops before it reads
another request; the restarted shards restore it, the workers re-send
what was not acknowledged, and the run ends with the model of an
unbroken run, bit for bit."""
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import DATA, DEADLINE_S, child_env, export, finish, free_port, worker_bin

ARGS = ["--consistency", "bsp", "--checkpoint-every", "0"]
TRAIN = ["--layers", "784,64,10", "--max-steps", "200", "--epochs", "1", "--lr", "0.04",
         "--device", "cpu", "--retry-ms", "300", "--timeout-ms", "60000", "--test-delay-ms", "10"]



def start(cluster, i, port, ckpt, extra=(), shards=2):
    """Shard i of shards on port, its checkpoints in ckpt."""
    log = open(os.path.join(cluster.tmp, "restart-psd%d-%d.log" % (i, len(cluster.procs))), "w")
    p = subprocess.Popen([os.environ["PSD_BIN"], "--listen", "tcp://127.0.0.1:%d" % port,
                          "--shard", str(i), "--shards", str(shards), "--checkpoint-dir", str(ckpt)]
                         + ARGS + list(extra), stdout=subprocess.DEVNULL, stderr=log,
                         env=child_env())
    p.log = log.name
    cluster.procs.append(p)
    return p


def workers(servers, tmp, name):
    return [subprocess.Popen([worker_bin(), "--data", DATA, "--servers", servers, "--rank", str(r),
                              "--workers", "2"] + TRAIN, stdout=subprocess.DEVNULL,
                             stderr=open(str(tmp / ("%s%d.log" % (name, r))), "w"),
                             env=child_env())
            for r in range(2)]




def status(servers):
    """psctl status of every shard, [] while they do not all answer."""
    r = subprocess.run([os.environ["PSCTL_BIN"], "--servers", servers, "--timeout-ms", "2000",
                        "--json", "status"], capture_output=True, text=True,
                       env=child_env(), timeout=30)
    return json.loads(r.stdout)["shards"] if r.returncode == 0 else []


def served(servers):
    """The clock the slowest table reached, 0 while the shards do not answer."""
    clocks = [t["clock"] for sh in status(servers) for t in sh.get("tables", [])]
    return min(clocks) if len(clocks) == 8 else 0


def run(cluster, tmp, name, stop_at=None):
    ports = [free_port(), free_port()]
    servers = ",".join("tcp://127.0.0.1:%d" % p for p in ports)
    ckpt = [tmp / name / "ck" / str(i) for i in range(2)]  # psd makes the folders
    shards = [start(cluster, i, ports[i], ckpt[i], ["--workers", "2"]) for i in range(2)]
    w = workers(servers, tmp, name)
    if stop_at is not None:
        deadline = time.monotonic() + DEADLINE_S
        while served(servers) < stop_at:
            assert time.monotonic() < deadline and all(p.poll() is None for p in w), \
                "training did not reach clock %d" % stop_at
            time.sleep(0.05)
        # mid-round: worker 1 stopped, worker 0's pulls wait for its pushes
        # (on both shards, or on the one worker 1 had not pushed to yet)
        w[1].send_signal(signal.SIGSTOP)
        while not any(sh.get("waiting", 0) > 0 for sh in status(servers)):
            assert time.monotonic() < deadline, "no shard waits for worker 1"
            time.sleep(0.05)
        for p in shards:
            p.send_signal(signal.SIGTERM)
        for p in shards:  # each stops at once (between rounds) or waits for the end
            while p.poll() is None and "S0605" not in open(p.log).read():
                assert time.monotonic() < deadline, open(p.log).read()
                time.sleep(0.02)
        w[1].send_signal(signal.SIGCONT)  # its pushes end the round
        for p in shards:
            assert p.wait(timeout=30) == 0
            cluster.procs.remove(p)
        logs = [open(p.log).read() for p in shards]
        for text in logs:  # a checkpoint at the stop, of every table
            assert "S0600" in text and "shutdown, 4 tables" in text, text[-2000:]
            assert "S0603" not in text and "S0607" not in text, text[-2000:]
        assert any("S0606" in text for text in logs), "no shard was stopped mid-round"
        assert all(p.poll() is None for p in w), "the run ended before the stop"
        shards = [start(cluster, i, ports[i], ckpt[i], ["--workers", "2"]) for i in range(2)]
    finish(w, tmp, name)
    out = export(servers, tmp / ("%s.safetensors" % name))
    for p in shards:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
        cluster.procs.remove(p)
    if stop_at is not None:
        for p in shards:
            assert "S0610" in open(p.log).read()  # restored
    return out


def test_a_bsp_run_stopped_mid_round_restarts_as_if_unbroken(cluster, tmp_path):
    if not os.environ.get("PSCTL_BIN") or not os.environ.get("PSWORKER_BIN"):
        pytest.skip("PSCTL_BIN and PSWORKER_BIN are needed")
    unbroken = run(cluster, tmp_path, "u")
    restarted = run(cluster, tmp_path, "r", stop_at=40)
    assert sorted(unbroken) == sorted(restarted) and len(unbroken) == 4
    for k in unbroken:
        assert np.array_equal(unbroken[k], restarted[k]), k


def test_a_round_that_never_ends_stops_at_the_timeout(cluster, tmp_path):
    """One worker of two pushes: its round cannot end. The stop serves
    on for --stop-timeout-ms, says so, and stops without a checkpoint of
    the half round."""
    import psd
    port = free_port()
    p = start(cluster, 0, port, tmp_path / "ck", ["--stop-timeout-ms", "300", "--workers", "2"],
              shards=1)
    with psd.Client("tcp://127.0.0.1:%d" % port, rank=0, workers=2) as c:
        c.create_table("t", 8, "sgd", lr=0.5)
        c.push("t", np.ones(8, np.float32)).wait()  # worker 1 never pushes
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 0
    cluster.procs.remove(p)
    text = open(p.log).read()
    assert "S0605" in text and "S0607" in text and "S0603" in text, text[-2000:]
    assert "S0600" not in text, text[-2000:]


def test_checkpoints_written_while_serving_hold_their_round(cluster, tmp_path):
    """Interval checkpoints are written by a forked writer while the shard
    serves on: each one written during a stream of bsp rounds holds the
    weights of the round it names, exactly (sgd, lr 0.5, every gradient
    1: after k rounds every weight is -0.5 k)."""
    import psd
    import struct
    ck = tmp_path / "ck"
    port = free_port()
    p = start(cluster, 0, port, ck, ["--checkpoint-every", "1", "--workers", "1"], shards=1)
    deadline = time.monotonic() + DEADLINE_S
    with psd.Client("tcp://127.0.0.1:%d" % port) as c:
        c.create_table("t", 1 << 16, "sgd", lr=0.5)
        g = np.ones(1 << 16, np.float32)
        while open(p.log).read().count("by a forked writer") < 3:
            assert time.monotonic() < deadline, open(p.log).read()[-2000:]
            c.push("t", g).wait()
    files = sorted(f for f in os.listdir(ck) if f.endswith(".safetensors"))
    assert len(files) >= 2, files
    for f in files:
        raw = open(ck / f, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        state = json.loads(json.loads(raw[8:8 + n])["__metadata__"]["state"])
        rounds = state["tables"][0]["steps"]
        w = psd.load_safetensors(ck / f)["w/t"]
        assert rounds > 0 and np.all(w == np.float32(-0.5 * rounds)), (f, rounds, w[:4])
