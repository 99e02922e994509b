#!/usr/bin/env python3
"""Pipelines in psworker (--stages): a 2-stage pipeline with 4
micro-batches trains the same weights as one worker without stages, to
float rounding, and GPipe and 1F1B give the same bits; 3 stages hold at
most min(P - s, M) micro-batches' activations under 1F1B and M under
GPipe (the counter in the summary); fewer micro-batches than stages
trains; a stage killed mid-run is named by its neighbours and every
process of the run exits; with CURVE the stages encrypt with the
workers' key pair and a stage holding another pair is refused by name;
bad splits and mismatched stages are refused with an error that says
what is wrong."""
import array
import json
import os
import signal
import socket
import struct
import subprocess
import tempfile
import time

from pstest import check, finish, poll, reap, spawn

PSD = os.environ["PSD_BIN"]
PSW = os.environ["PSWORKER_BIN"]
PSCTL = os.environ["PSCTL_BIN"]

LAYERS = "784,64,32,10"  # three fc layers: up to 3 stages
STEPS = 50


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start_psd(tmp, name, workers, extra=()):
    ep = os.path.join(tmp, name + ".ep")
    spawn([PSD, "--listen", "tcp://127.0.0.1:0", "--endpoint-file", ep, "--workers",
           str(workers), "--consistency", "bsp"] + list(extra), os.path.join(tmp, name + ".log"))
    return poll(lambda: os.path.exists(ep) and open(ep).read().strip(), name + "'s endpoint")


def workers(tmp, name, endpoint, n, extra, stages=None):
    """Starts n psworkers (ranks 0..n-1) against endpoint; their Popen and
    the paths of their summaries."""
    procs, sums = [], []
    stage_eps = ",".join("tcp://127.0.0.1:%d" % p for p in free_ports(n))
    for r in range(n):
        s = os.path.join(tmp, "%s-%d.json" % (name, r))
        args = [PSW, "--servers", endpoint, "--rank", str(r), "--workers", str(n), "--layers",
                LAYERS, "--device", "cpu", "--epochs", "1", "--log-every", "1",
                "--summary-json", s, "--timeout-ms", "20000"] + extra
        if stages:
            args += ["--stages", str(stages), "--stage-endpoints", stage_eps]
        procs.append(spawn(args, os.path.join(tmp, "%s-%d.log" % (name, r))))
        sums.append(s)
    return procs, sums


def wait_all(procs, timeout=300):
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    return codes


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        v = array.array("f")
        v.frombytes(data[a:b])  # little-endian, as this machine
        out[name] = (tuple(t["shape"]), v)
    return out


def train_and_export(tmp, name, stages, extra):
    """One run of STEPS steps on a fresh psd; its exported weights and the
    summaries."""
    ep = start_psd(tmp, name + "-psd", stages or 1)
    if not ep:
        return None, []
    procs, sums = workers(tmp, name, ep, stages or 1, ["--max-steps", str(STEPS)] + extra, stages)
    codes = wait_all(procs)
    check(codes == [0] * len(procs), "%s: every process exits 0 (%s)" % (name, codes))
    out = os.path.join(tmp, name + ".safetensors")
    r = subprocess.run([PSCTL, "--servers", ep, "export", out], capture_output=True, text=True,
                       timeout=60)
    check(r.returncode == 0, "%s: psctl export (%s)" % (name, r.stderr.strip()))
    summaries = [json.load(open(s)) for s in sums if os.path.exists(s)]
    return (read_safetensors(out) if r.returncode == 0 else None), summaries


def equal_to_unpipelined(tmp):
    base, _ = train_and_export(tmp, "whole", None, [])
    gpipe, gs = train_and_export(tmp, "gpipe", 2, ["--microbatches", "4", "--schedule", "gpipe"])
    f1b, fs = train_and_export(tmp, "1f1b", 2, ["--microbatches", "4", "--schedule", "1f1b"])
    if base is None or gpipe is None or f1b is None:
        return
    check(sorted(base) == sorted(gpipe) == sorted(f1b) and len(base) == 6,
          "the pipelines' export has the unsplit model's tables (%s)" % sorted(gpipe))
    same = all(gpipe[k][1].tobytes() == f1b[k][1].tobytes() for k in base)
    check(same, "GPipe and 1F1B give the same bits")
    worst = 0.0
    for k in base:
        check(gpipe[k][0] == base[k][0], "%s has the unsplit shape %s" % (k, base[k][0]))
        scale = max(abs(x) for x in base[k][1])
        diff = max(abs(x - y) for x, y in zip(gpipe[k][1], base[k][1]))
        worst = max(worst, diff / scale)
    changed = all(len(base[k][1]) > 0 for k in base)
    check(changed and worst <= 1e-5,
          "%d steps of 2 stages x 4 micro-batches equal one worker's to %.2e relative "
          "(<= 1e-5)" % (STEPS, worst))
    for s in gs + fs:
        check(s.get("steps") == STEPS and s.get("test_accuracy", 0) > 0.5,
              "stage %s (%s): %s steps, accuracy %s" % (s.get("stage"), s.get("schedule"),
                                                       s.get("steps"), s.get("test_accuracy")))


def activations_held(tmp):
    for sched, m, want in (("1f1b", 4, [3, 2, 1]), ("gpipe", 4, [4, 4, 4]),
                           ("1f1b", 2, [2, 2, 1])):
        name = "held-%s-%d" % (sched, m)
        ep = start_psd(tmp, name + "-psd", 3)
        if not ep:
            return
        procs, sums = workers(tmp, name, ep, 3, ["--max-steps", "6", "--schedule", sched,
                                                 "--microbatches", str(m), "--batch", "16"], 3)
        codes = wait_all(procs)
        check(codes == [0, 0, 0], "%s: 3 stages, M = %d: every process exits 0 (%s)"
              % (sched, m, codes))
        held = [json.load(open(s)).get("activations_held_max") if os.path.exists(s) else None
                for s in sums]
        check(held == want, "%s, M = %d: stages 0..2 held at most %s micro-batches (%s)"
              % (sched, m, want, held))


def killed_stage(tmp):
    ep = start_psd(tmp, "kill-psd", 3)
    if not ep:
        return
    procs, _ = workers(tmp, "kill", ep, 3, ["--test-delay-ms", "20", "--stage-timeout-ms",
                                            "1000"], 3)
    log1 = os.path.join(tmp, "kill-1.log")
    if not poll(lambda: "W0250" in open(log1).read(), "stage 1 training", timeout=60):
        return
    procs[1].send_signal(signal.SIGKILL)
    codes = wait_all([procs[0], procs[2]], timeout=60)
    check(codes[0] not in (None, 0) and codes[1] not in (None, 0),
          "stages 0 and 2 exit with an error once stage 1 is killed (%s)" % codes)
    for r in (0, 2):
        text = open(os.path.join(tmp, "kill-%d.log" % r)).read()
        check("W0320" in text and "stage 1 (" in text and "is gone" in text,
              "stage %d's error names stage 1 as gone" % r)


def curve(tmp):
    keys = os.path.join(tmp, "keys")
    allow = os.path.join(tmp, "allow")
    os.makedirs(allow)
    for who in ("server", "worker", "other"):
        r = subprocess.run([PSD, "--keygen", os.path.join(keys, who)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            os.makedirs(keys, exist_ok=True)
            r = subprocess.run([PSD, "--keygen", os.path.join(keys, who)], capture_output=True,
                               text=True)
        check(r.returncode == 0, "psd --keygen %s (%s)" % (who, r.stderr.strip()))
    for who in ("worker", "other"):  # psd admits both; the stages only their own pair
        with open(os.path.join(keys, who + ".pub")) as f, \
                open(os.path.join(allow, who + ".pub"), "w") as g:
            g.write(f.read())
    ep = start_psd(tmp, "curve-psd", 2, ["--curve-secret", os.path.join(keys, "server"),
                                         "--curve-allow", allow])
    if not ep:
        return
    sk = ["--curve-server-key", os.path.join(keys, "server.pub")]
    procs, sums = workers(tmp, "curve", ep, 2, ["--max-steps", "5", "--curve-secret",
                                               os.path.join(keys, "worker")] + sk, 2)
    codes = wait_all(procs)
    log0 = open(os.path.join(tmp, "curve-0.log")).read()
    check(codes == [0, 0] and "CURVE with the workers' key pair" in log0,
          "2 stages train with CURVE between them (%s)" % codes)
    # stage 0 with another key pair: it takes its own public key for stage
    # 1's, so the handshake fails, and both stages say so
    ep = start_psd(tmp, "curve2-psd", 2, ["--curve-secret", os.path.join(keys, "server"),
                                          "--curve-allow", allow])
    if not ep:
        return
    eps = ",".join("tcp://127.0.0.1:%d" % p for p in free_ports(2))
    base = [PSW, "--servers", ep, "--workers", "2", "--stages", "2", "--layers", LAYERS,
            "--device", "cpu", "--stage-endpoints", eps, "--timeout-ms", "3000"] + sk
    p0 = spawn(base + ["--rank", "0", "--curve-secret", os.path.join(keys, "other")],
               os.path.join(tmp, "curve2-0.log"))
    p1 = spawn(base + ["--rank", "1", "--curve-secret", os.path.join(keys, "worker")],
               os.path.join(tmp, "curve2-1.log"))
    codes = wait_all([p0, p1], timeout=60)
    t0 = open(os.path.join(tmp, "curve2-0.log")).read()
    t1 = open(os.path.join(tmp, "curve2-1.log")).read()
    check(codes[0] not in (None, 0) and codes[1] not in (None, 0) and
          "a handshake failed" in t0 and "a handshake failed" in t1,
          "a stage of another key pair is refused, and both stages say so (%s)" % codes)


def refused(tmp):
    ep = start_psd(tmp, "bad-psd", 2)
    if not ep:
        return
    ports = free_ports(3)
    eps = ",".join("tcp://127.0.0.1:%d" % p for p in ports)
    eps2 = ",".join("tcp://127.0.0.1:%d" % p for p in ports[:2])
    base = [PSW, "--servers", ep, "--layers", LAYERS, "--device", "cpu", "--timeout-ms", "3000"]
    cases = [
        (["--workers", "2", "--stages", "2", "--cuts", "3", "--stage-endpoints", eps],
         "--cuts: '3' is not a cut between 1 and 2"),
        (["--workers", "2", "--stages", "2", "--cuts", "1,2", "--stage-endpoints", eps],
         "more than the 1 cut(s) --stages 2 takes"),
        (["--workers", "3", "--stages", "2", "--stage-endpoints", eps],
         "--workers 3 is not a multiple of --stages 2"),
        (["--workers", "2", "--stages", "2", "--microbatches", "5", "--stage-endpoints", eps],
         "--batch 64 is not a multiple of --microbatches 5"),
        (["--workers", "2", "--stages", "2", "--topk", "0.1", "--stage-endpoints", eps],
         "--stages does not combine with --topk"),
        (["--workers", "4", "--stages", "4", "--stage-endpoints", eps + ",tcp://127.0.0.1:1"],
         "at most 3 stages"),
        (["--workers", "2", "--stages", "2"], "--stages needs --stage-endpoints"),
        (["--microbatches", "4"], "need --stages 2 or more"),
    ]
    for args, want in cases:
        r = subprocess.run(base + args, capture_output=True, text=True, timeout=60)
        text = r.stdout + r.stderr
        check(r.returncode != 0 and want in text,
              "refused: %s -> %r (exit %d: %s)" % (" ".join(args), want, r.returncode,
                                                    text.strip()[-300:]))
    # two stages started with different splits, and with different stage counts
    for name, extra0, extra1, want in (
            ("cuts", ["--stages", "2", "--cuts", "1", "--workers", "2", "--stage-endpoints", eps2],
             ["--stages", "2", "--cuts", "2", "--workers", "2", "--stage-endpoints", eps2],
             "sends 64 activations a row; this stage runs 4 of 16 with 1f1b and takes 32"),
            ("count", ["--stages", "2", "--workers", "2", "--stage-endpoints", eps2],
             ["--stages", "3", "--workers", "3", "--stage-endpoints", eps, "--microbatches", "4"],
             "stage 0's pipeline has 2 stages, this one's 3")):
        fresh = start_psd(tmp, "mismatch-%s-psd" % name, 3)  # no worker id held from before
        if not fresh:
            return
        base[2] = fresh
        p0 = spawn(base + ["--rank", "0"] + extra0, os.path.join(tmp, "mismatch-%s-0.log" % name))
        p1 = spawn(base + ["--rank", "1"] + extra1, os.path.join(tmp, "mismatch-%s-1.log" % name))
        codes = wait_all([p0, p1], timeout=60)
        text = open(os.path.join(tmp, "mismatch-%s-1.log" % name)).read()
        check(codes[0] not in (None, 0) and codes[1] not in (None, 0) and want in text,
              "mismatched %s: both stages stop, stage 1 says %r (%s)" % (name, want, codes))


def main():
    tmp = tempfile.mkdtemp(prefix="pstest-pipeline.")
    try:
        equal_to_unpipelined(tmp)
        activations_held(tmp)
        killed_stage(tmp)
        curve(tmp)
        refused(tmp)
    finally:
        reap()
    finish(tmp)


if __name__ == "__main__":
    main()
