#!/usr/bin/env python3
"""How long a request waits while a large shard writes its checkpoints:
one psd holding a dense table of --gib GiB (random values, every page
touched) with --checkpoint-every 1, and a client that pushes and pulls 4
KiB at a time as fast as it can for --seconds; the latency of each pull
(a push before it changes the state, so every interval writes). Prints
the longest, the 99.9th percentile and how many passed 50 ms, for each
psd binary given (--psd, repeatable: the one before a change against
the one after, in the same run), with the checkpoints each wrote.

--while etcd-stopped measures instead a replicated shard (a primary and
a backup, --lease-ttl 3, a 4 KiB table) whose etcd is stopped (SIGSTOP)
for 1.5 s of every 3: the pulls' latencies while etcd is stopped, and
while it runs. A lease of 3 s outlasts each stop, so the primary serves
throughout; what a stop may cost is the time its renewals hold its loop.
Needs Debian's etcd-server.
Reports; never fails on a number.

    /usr/bin/python3 tests/bench/pause_bench.py --psd OLD --psd NEW
        [--gib 2] [--seconds 10] [--while checkpoint|etcd-stopped] [--json PATH]"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "worker", "python"))


def run(psd_bin, gib, seconds, tmp):
    import numpy as np
    import psd
    ck = os.path.join(tmp, "ck")
    shutil.rmtree(ck, ignore_errors=True)
    epf = os.path.join(tmp, "ep")
    if os.path.exists(epf):
        os.unlink(epf)
    log = os.path.join(tmp, "psd.log")
    p = subprocess.Popen([psd_bin, "--listen", "tcp://127.0.0.1:0", "--endpoint-file", epf,
                          "--checkpoint-dir", ck, "--checkpoint-every", "1",
                          "--max-table-bytes", str((gib + 1) << 30)],
                         stderr=open(log, "w"))
    try:
        deadline = time.monotonic() + 30
        while not (os.path.exists(epf) and open(epf).read().strip()):
            if p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("psd did not start:\n" + open(log).read())
            time.sleep(0.01)
        n = gib << 28  # floats
        with psd.Client(open(epf).read().strip(), timeout_ms=120000) as c:
            c.create_table("big", n, "sgd", lr=0.01, init="uniform", init_scale=0.1)
            g, out = np.ones(1024, np.float32), np.empty(1024, np.float32)
            lat = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                c.push("big", g).wait()
                t0 = time.perf_counter()
                c.pull("big", out).wait()
                lat.append(time.perf_counter() - t0)
        lat = np.sort(np.array(lat)) * 1e3
        text = open(log).read()
        return {"pulls": int(lat.size), "max_ms": float(lat[-1]),
                "p999_ms": float(lat[int(0.999 * (lat.size - 1))]),
                "p50_ms": float(lat[lat.size // 2]),
                "over_50ms": int((lat > 50).sum()), "checkpoints": text.count("S0600"),
                "forked": text.count("by a forked writer"),
                "fork_max_ms": max([int(x) / 1e3 for x in re.findall(r"the fork held it (\d+) us",
                                                                      text)] or [0.0])}
    finally:
        p.terminate()
        p.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, fn, procs, deadline_s=30):
    deadline = time.monotonic() + deadline_s
    while not fn():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise SystemExit("%s: not within %d s" % (what, deadline_s))
        time.sleep(0.02)


def summary(lat):
    import numpy as np
    lat = np.sort(np.array(lat)) * 1e3
    if lat.size == 0:
        return {"pulls": 0}
    return {"pulls": int(lat.size), "max_ms": float(lat[-1]),
            "p999_ms": float(lat[int(0.999 * (lat.size - 1))]),
            "p50_ms": float(lat[lat.size // 2]), "over_50ms": int((lat > 50).sum())}


def run_etcd_stopped(psd_bin, seconds, tmp):
    """A primary and a backup; etcd stopped 1.5 s of every 3."""
    import numpy as np
    import psd
    exe = shutil.which("etcd")
    if exe is None:
        raise SystemExit("--while etcd-stopped needs etcd (Debian's etcd-server)")
    work = tempfile.mkdtemp(dir=tmp)
    url = "http://127.0.0.1:%d" % free_port()
    procs = [subprocess.Popen(
        [exe, "--data-dir", os.path.join(work, "etcd"), "--listen-client-urls", url,
         "--advertise-client-urls", url, "--listen-peer-urls",
         "http://127.0.0.1:%d" % free_port()], stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(work, "etcd.log"), "w"))]

    def healthy():
        try:
            return urllib.request.urlopen(url + "/health", timeout=1).read() is not None
        except OSError:
            return False
    try:
        wait_for("etcd", healthy, procs)
        eps = []
        for i in range(2):
            epf = os.path.join(work, "ep%d" % i)
            args = [psd_bin, "--listen", "tcp://127.0.0.1:0", "--endpoint-file", epf,
                    "--etcd", url, "--lease-ttl", "3"]
            if i == 1:
                args += ["--replica-of", eps[0]]
            procs.append(subprocess.Popen(args, stderr=open(os.path.join(work, "psd%d.log" % i),
                                                           "w")))
            wait_for("psd %d" % i, lambda: os.path.exists(epf) and open(epf).read().strip(),
                     procs)
            eps.append(open(epf).read().strip())
            if i == 0:
                wait_for("the primary", lambda: "S0715" in open(
                    os.path.join(work, "psd0.log")).read(), procs)
        wait_for("the backup in sync", lambda: "S0703 in sync: this primary and 1" in open(
            os.path.join(work, "psd0.log")).read(), procs)
        stopped, running = [], []
        with psd.Client("|".join(eps), timeout_ms=20000) as c:
            c.create_table("w", 1024, "sgd", lr=0.01)
            g, out = np.ones(1024, np.float32), np.empty(1024, np.float32)
            start = time.monotonic()
            is_stopped = False
            while time.monotonic() - start < seconds:
                want = (time.monotonic() - start) % 3.0 >= 1.5
                if want != is_stopped:
                    procs[0].send_signal(signal.SIGSTOP if want else signal.SIGCONT)
                    is_stopped = want
                c.push("w", g).wait()
                t0 = time.perf_counter()
                c.pull("w", out).wait()
                (stopped if is_stopped else running).append(time.perf_counter() - t0)
            if is_stopped:
                procs[0].send_signal(signal.SIGCONT)
        text = open(os.path.join(work, "psd0.log")).read()
        return {"stopped": summary(stopped), "running": summary(running),
                "renewals_failed": text.count("S0717"), "stepped_down": text.count("S0716")}
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGCONT)
            p.terminate()
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--psd", action="append", required=True, help="a psd binary (repeat)")
    ap.add_argument("--gib", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--while", dest="during", choices=["checkpoint", "etcd-stopped"],
                    default="checkpoint")
    ap.add_argument("--json")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pause-bench-")
    out = []
    try:
        for b in a.psd:
            if a.during == "etcd-stopped":
                r = run_etcd_stopped(b, a.seconds, tmp)
                r["psd"] = b
                out.append(r)
                for k in ("stopped", "running"):
                    x = r[k]
                    print("%-40s etcd %-8s %6d pulls  p50 %.2f ms  p99.9 %.1f ms  max %.1f ms  "
                          "%d over 50 ms" % (b, k, x["pulls"], x.get("p50_ms", 0),
                                              x.get("p999_ms", 0), x.get("max_ms", 0),
                                              x.get("over_50ms", 0)), flush=True)
                print("%-40s %d renewals failed (S0717), %d step-downs (S0716)"
                      % (b, r["renewals_failed"], r["stepped_down"]), flush=True)
                continue
            r = run(b, a.gib, a.seconds, tmp)
            r["psd"] = b
            out.append(r)
            print("%-40s %6d pulls  p50 %.2f ms  p99.9 %.1f ms  max %.1f ms  %d over 50 ms; "
                  "%d checkpoints (%d by a forked writer, the longest fork %.1f ms)"
                  % (b, r["pulls"], r["p50_ms"], r["p999_ms"], r["max_ms"], r["over_50ms"],
                     r["checkpoints"], r["forked"], r["fork_max_ms"]), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
