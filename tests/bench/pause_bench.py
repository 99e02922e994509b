#!/usr/bin/env python3
"""How long a request waits while a large shard writes its checkpoints:
one psd holding a dense table of --gib GiB (random values, every page
touched) with --checkpoint-every 1, and a client that pushes and pulls 4
KiB at a time as fast as it can for --seconds; the latency of each pull
(a push before it changes the state, so every interval writes). Prints
the longest, the 99.9th percentile and how many passed 50 ms, for each
psd binary given (--psd, repeatable: the one before a change against
the one after, in the same run), with the checkpoints each wrote.
Reports; never fails on a number.

    /usr/bin/python3 tests/bench/pause_bench.py --psd OLD --psd NEW
        [--gib 2] [--seconds 10] [--json PATH]"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--psd", action="append", required=True, help="a psd binary (repeat)")
    ap.add_argument("--gib", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pause-bench-")
    out = []
    try:
        for b in a.psd:
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
