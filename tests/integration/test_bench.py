#!/usr/bin/env python3
"""The benchmarks still run: `bench_wire --quick` against real psd
processes (every cell of 1 and 2 shards, the latency rows, the sparse
pushes over tcp, the Unix socket and shared memory) and `bench_apply
--repeat 1`, each ending with status 0 and a --json file with every row
and no empty number. Never a check on speed: a number only has to be
there, finite and above zero. In the test build (ASan, UBSan) this also
runs the client library's windowed, zero-copy and shared-memory paths
under the sanitizers. Flags a benchmark cannot use are refused, naming
the flag."""
import json
import math
import os
import subprocess
import sys
import tempfile

from pstest import check, finish

PSD = os.environ["PSD_BIN"]


def run(args, what, timeout):
    """Runs args to the end (a benchmark reaps its own psd processes, and
    they die with it); its output goes to the test's log."""
    try:
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        check(False, "%s ends within %d s" % (what, timeout))
        return None
    sys.stdout.write(p.stdout)
    check(p.returncode == 0, "%s exits 0 (got %d)" % (what, p.returncode))
    return p


def positive(row, *keys):
    return all(isinstance(row.get(k), (int, float)) and math.isfinite(row[k]) and row[k] > 0
               for k in keys)


def load(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        check(False, "%s writes valid JSON to --json (%s)" % (what, e))
        return None


def wire(bench, tmp):
    out = os.path.join(tmp, "wire.json")
    if run([bench, "--psd", PSD, "--quick", "--seconds", "0.05", "--json", out], "bench_wire",
           600) is None:
        return
    rows = load(out, "bench_wire")
    if rows is None:
        return
    cells = {(r.get("shards"), r.get("op"), r.get("bytes"), r.get("window")): r
             for r in rows if r.get("bench") == "throughput"}
    want = [(n, op, b, w) for n in (1, 2) for op in ("push", "pull", "push-pull", "pull-view")
            for b in (4096, 65536, 1 << 20) for w in (1, 8)]
    missing = [c for c in want if c not in cells]
    check(not missing, "bench_wire has all %d throughput cells (missing: %s)"
          % (len(want), missing[:4]))
    bad = [c for c in want if c in cells and not positive(cells[c], "psd_rps", "raw_rps", "ratio")]
    check(not bad, "every cell has psd and raw requests/s and a ratio above 0 (bad: %s)" % bad[:4])
    check(len(cells) == len(want), "no other throughput cells (%d)" % len(cells))
    lat = {r.get("bytes"): r for r in rows if r.get("bench") == "latency"}
    check(sorted(lat) == [64, 1 << 20], "latency rows for 64 B and 1 MiB (%s)" % sorted(lat))
    for b, r in lat.items():
        check(positive(r, "psd_p50_us", "psd_p99_us", "raw_p50_us", "raw_p99_us") and
              r["psd_p50_us"] <= r["psd_p99_us"] and r["raw_p50_us"] <= r["raw_p99_us"],
              "latency %d B: p50 <= p99 on both sides, above 0 (%s)" % (b, r))
    sparse = [r for r in rows if r.get("bench") == "sparse"]
    check(len(sparse) == 6, "6 sparse rows (%d)" % len(sparse))
    check(sorted({r.get("via") for r in sparse}) == ["ipc", "shm", "tcp"],
          "sparse pushes over tcp, ipc and shared memory (%s)"
          % sorted({str(r.get("via")) for r in sparse}))
    check(all(positive(r, "requests_per_s", "keys", "dim") for r in sparse),
          "every sparse row has requests/s above 0")


def apply_(bench, tmp):
    out = os.path.join(tmp, "apply.json")
    if run([bench, "--repeat", "1", "--json", out], "bench_apply", 600) is None:
        return
    r = load(out, "bench_apply")
    if r is None:
        return
    keys = ["memcpy_gbps", "sgd_ratio", "momentum_ratio", "adam_ratio", "sparse_updates_per_s",
            "scatter_updates_per_s", "sparse_ratio", "rows_updates_per_s", "rows_ratio"]
    check(isinstance(r, dict) and positive(r, *keys),
          "bench_apply's JSON has every number, above 0 (%s)" % r)


def refused(args, flag, what):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=60)
    check(p.returncode != 0 and flag in p.stdout,
          "%s is refused, naming %s (status %d: %s)" % (what, flag, p.returncode,
                                                       p.stdout.strip()[:200]))


def main():
    if len(sys.argv) != 3:
        print("usage: test_bench.py BENCH_WIRE BENCH_APPLY", file=sys.stderr)
        return 2
    bench_wire, bench_apply = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="psd-bench.")
    refused([bench_apply, "--repeat", "0"], "--repeat", "bench_apply --repeat 0")
    refused([bench_apply, "--repeat", "5x"], "--repeat", "bench_apply --repeat 5x")
    refused([bench_apply, "--json", os.path.join(tmp, "no", "such", "dir.json")], "--json",
            "bench_apply --json in a missing directory")
    refused([bench_wire, "--psd", PSD, "--size", "1000"], "--size", "bench_wire --size 1000")
    refused([bench_wire, "--psd", PSD, "--seconds", "0"], "--seconds", "bench_wire --seconds 0")
    wire(bench_wire, tmp)
    apply_(bench_apply, tmp)
    finish(tmp)


if __name__ == "__main__":
    sys.exit(main())
