#!/usr/bin/env python3
"""Replicas: how long a shard is gone when its primary is killed, and what
replication costs training.

failover: 1 shard, a primary and a backup (psd --etcd), a client (the psd
Python package, "primary|backup") doing push + pull of a 1,024-float
table in a loop. kill -9 of the primary; the time from the kill to the
first request answered after it (by the new primary), and to the backup's
"primary now" line. --repeat rounds, each on a fresh cluster.

cost: psworker (the MLP, 1 epoch of Fashion-MNIST, batch 64, bsp) on 1
shard, with the shard alone and with a backup (1+1 against 1+1+backup),
--repeat runs each, interleaved; samples/s medians and their ratio.

backlog: what keeping the primary's newest records costs the 4 KiB push
path (psd --replica-backlog-mib, from which a restarted backup resumes):
1 shard with a backup, a client doing push + pull of 1,024 floats 3,000
times, with --replica-backlog-mib 0 and 64 (the default), interleaved
over --repeat clusters each; microseconds a push + pull, medians, ratio.

--only failover|cost|backlog runs one of them. Needs etcd (Debian's etcd-server), Debian's python3 with numpy, and the
release build: tests/bench/replica_bench.py [--build-dir build-release]
[--repeat N] [--json PATH]."""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "worker", "python"))
DATA = "/usr/share/datasets/fashion-mnist"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, fn, limit=30):
    deadline = time.monotonic() + limit
    while not fn():
        if time.monotonic() > deadline:
            raise RuntimeError(what + ": not within %d s" % limit)
        time.sleep(0.01)


class Cluster:
    def __init__(self, build, tmp, backup=True, args=()):
        self.procs, self.tmp, self.build = [], tmp, build
        c, p = free_port(), free_port()
        self.etcd_url = "http://127.0.0.1:%d" % c
        self.spawn(["etcd", "--data-dir", os.path.join(tmp, "etcd"), "--listen-client-urls",
                    self.etcd_url, "--advertise-client-urls", self.etcd_url,
                    "--listen-peer-urls", "http://127.0.0.1:%d" % p, "--heartbeat-interval",
                    "50", "--election-timeout", "500"], "etcd")
        wait_for("etcd", self.etcd_up)
        base = ["--consistency", "bsp", "--workers", "1", "--etcd", self.etcd_url] + list(args)
        self.a, self.ea = self.psd(base, "a")
        wait_for("the primary", lambda: "S0715" in self.log("a"))
        self.eps = [self.ea]
        if backup:
            self.b, self.eb = self.psd(base + ["--replica-of", self.ea], "b")
            wait_for("the backup in sync", lambda: "S0703" in self.log("a"))
            self.eps.append(self.eb)
        self.servers = "|".join(self.eps)

    def etcd_up(self):
        try:
            urllib.request.urlopen(self.etcd_url + "/health", timeout=1).read()
            return True
        except OSError:
            return False

    def spawn(self, argv, name):
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                             stderr=open(os.path.join(self.tmp, name + ".log"), "w"))
        self.procs.append(p)
        return p

    def log(self, name):
        return open(os.path.join(self.tmp, name + ".log")).read()

    def psd(self, args, name):
        ep = os.path.join(self.tmp, name + ".ep")
        p = self.spawn([os.path.join(self.build, "server", "psd"), "--listen",
                        "tcp://127.0.0.1:0", "--endpoint-file", ep] + args, name)
        wait_for(name, lambda: os.path.exists(ep) and open(ep).read().strip())
        return p, open(ep).read().strip()

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def stamp(line):
    """The wall time of a psd log line (UTC, ms)."""
    m = re.match(r"(\d+)-(\d+)-(\d+)T(\d+):(\d+):(\d+)\.(\d+)Z", line)
    import calendar
    t = calendar.timegm(tuple(int(x) for x in m.groups()[:6]) + (0, 0, 0))
    return t + int(m.group(7)) / 1000.0


def failover_round(build, tmp):
    import numpy as np
    import psd
    c = Cluster(build, tmp)
    try:
        done, stop = [], threading.Event()
        client = psd.Client(c.servers, timeout_ms=20000)
        client.create_table("w", 1024)
        g, out = np.ones(1024, np.float32), np.zeros(1024, np.float32)

        def loop():
            while not stop.is_set():
                client.push("w", g).wait()
                client.pull("w", out).wait()
                done.append(time.monotonic())

        t = threading.Thread(target=loop)
        t.start()
        wait_for("requests under way", lambda: len(done) > 200)
        killed_wall, killed = time.time(), time.monotonic()
        c.a.send_signal(signal.SIGKILL)
        wait_for("a request after the kill", lambda: done[-1] > killed)
        first = min(x for x in done if x > killed)
        stop.set()
        t.join(30)
        client.close()
        line = next(x for x in c.log("b").splitlines() if "S0715" in x)
        return {"answered_ms": (first - killed) * 1000,
                "promoted_ms": (stamp(line) - killed_wall) * 1000,
                "failovers": 1}
    finally:
        c.stop()


def backlog_round(build, tmp, mib, n=3000):
    """Microseconds a push + pull of 4 KiB takes on a shard with a backup
    and --replica-backlog-mib mib."""
    import numpy as np
    import psd
    c = Cluster(build, tmp, args=["--replica-backlog-mib", str(mib)])
    try:
        client = psd.Client(c.servers, timeout_ms=20000)
        client.create_table("w", 1024)
        g, out = np.full(1024, 1e-3, np.float32), np.zeros(1024, np.float32)
        for _ in range(200):  # warm
            client.push("w", g).wait()
            client.pull("w", out).wait()
        t0 = time.perf_counter()
        for _ in range(n):
            client.push("w", g).wait()
            client.pull("w", out).wait()
        us = (time.perf_counter() - t0) / n * 1e6
        client.close()
        return us
    finally:
        c.stop()


def train_once(build, tmp, backup):
    c = Cluster(build, tmp, backup=backup)
    try:
        summary = os.path.join(tmp, "summary.json")
        r = subprocess.run([os.path.join(build, "worker", "psworker"), "--data", DATA,
                            "--servers", c.servers, "--device", "cpu", "--epochs", "1",
                            "--batch", "64", "--lr", "0.05", "--summary-json", summary],
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        return json.load(open(summary))["samples_per_sec"]
    finally:
        c.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default="build-release")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--only", choices=["failover", "cost", "backlog"])
    a = ap.parse_args()
    if shutil.which("etcd") is None:
        print("replica_bench: etcd is not installed (Debian's etcd-server)", file=sys.stderr)
        return 77
    out = {}
    for section in ("failover", "cost", "backlog"):
        if a.only in (None, section):
            out.update(globals()[section](a))
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)
    return 0


def interleaved(a, run, variants):
    """run(build, tmp, variant) for each variant, --repeat times in turn,
    each on a fresh cluster: the results, a list a variant."""
    out = [[] for _ in variants]
    for i in range(a.repeat):
        for v, into in zip(variants, out):
            with tempfile.TemporaryDirectory(prefix="psd-bench-") as tmp:
                into.append(run(a.build_dir, tmp, v))
    return out


def compare(title, rows, ratio, fmt):
    """Prints title, then each (label, values) row's median and runs, then
    the ratio of the second median to the first; returns the medians."""
    print(title)
    meds = [statistics.median(v) for _, v in rows]
    for (label, v), m in zip(rows, meds):
        print("  %-26s %9s  (%s)" % (label, fmt % m, ", ".join(fmt % x for x in v)))
    print("  %s: %.3f" % (ratio, meds[1] / meds[0]))
    return meds


def backlog(a):
    off, on = interleaved(a, backlog_round, (0, 64))
    mo, mn = compare("backlog (push + pull of 1,024 floats, 1 shard with a backup), us each",
                     [("--replica-backlog-mib 0:", off), ("--replica-backlog-mib 64:", on)],
                     "ratio 64/0", "%.1f")
    return {"backlog_off_us": off, "backlog_on_us": on, "backlog_ratio": mn / mo}


def failover(a):
    rounds = []
    for i in range(a.repeat):
        with tempfile.TemporaryDirectory(prefix="psd-fo-") as tmp:
            rounds.append(failover_round(a.build_dir, tmp))
    ans = [r["answered_ms"] for r in rounds]
    pro = [r["promoted_ms"] for r in rounds]
    print("failover (kill -9 of the primary, 1 shard, defaults: --replica-timeout-ms 500)")
    print("  first request answered after the kill: median %.0f ms (min %.0f, max %.0f) over %d"
          % (statistics.median(ans), min(ans), max(ans), len(ans)))
    print("  backup's 'primary now' after the kill:  median %.0f ms (min %.0f, max %.0f)"
          % (statistics.median(pro), min(pro), max(pro)))
    return {"failover": rounds}


def cost(a):
    solo, rep = interleaved(a, train_once, (False, True))
    ms, mr = compare("cost (MLP, 1 epoch, batch 64, 1 shard + 1 worker, bsp), samples/s",
                     [("without a backup:", solo), ("with a backup:", rep)],
                     "ratio with/without", "%.0f")
    return {"solo": solo, "replicated": rep, "ratio": mr / ms}


if __name__ == "__main__":
    sys.exit(main())
