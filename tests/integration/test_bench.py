#!/usr/bin/env python3
"""The benchmarks still run: `bench_wire --quick` against real psd
processes (every cell of 1 and 2 shards, the latency rows, the sparse
pushes over tcp, the Unix socket and shared memory, sparse rows with and
without a life cycle beside the plain loop), `bench_apply
--repeat 1`, `topk_bench --calls 1`, `train_bench.sh --steps 20 --repeat 1` on this build's
psd and psworker, and `conv_bench --repeat 1` where oneDNN is installed, each ending with status 0 and a --json file with every
row and no empty number. Never a check on speed: a number only has to be
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
    check(all(r.get("pinned") is False and r.get("rounds") == 5 for r in cells.values()),
          "throughput rows of a run without --pin or --rounds say pinned: false, rounds: 5")


def pinned(bench, tmp):
    """--pin: this process on its last CPU, the servers on the others; at
    the --rounds limit (99)."""
    args = [bench, "--psd", PSD, "--only", "push", "--size", "4096", "--shards", "1",
            "--seconds", "0.05", "--pin", "--rounds", "99"]
    cpus = sorted(os.sched_getaffinity(0))
    refused(args, "--pin", "bench_wire --pin on one CPU",
            lambda: os.sched_setaffinity(0, {cpus[0]}))
    if len(cpus) < 2:
        return
    out = os.path.join(tmp, "pinned.json")
    p = run(args + ["--json", out], "bench_wire --pin", 120)
    if p is None:
        return
    text = p.stdout
    where = "clients on CPU %d, servers on CPU" % cpus[-1]
    check(where in text, "bench_wire --pin says where each side runs (%r in %r)"
          % (where, text.splitlines()[:1]))
    rows = load(out, "bench_wire --pin")
    if rows is None:
        return
    check(len(rows) == 2 and all(r.get("pinned") is True and r.get("rounds") == 99 and
                                 positive(r, "psd_rps", "raw_rps") for r in rows),
          "bench_wire --pin --rounds 99: two rows, pinned: true, rounds: 99, requests/s above 0 "
          "(%s)" % rows)
    check("median over the 99 rounds" in text, "bench_wire --rounds 99 says its ratio is a "
          "median over 99 rounds")


def rows_life(bench, tmp):
    """--only rows --life: the plain loop, the table, the table with its
    life cycle on (every id given a row by the fill: the bench exits 1
    otherwise), each with keys/s above 0, at window 2."""
    out = os.path.join(tmp, "rows.json")
    if run([bench, "--psd", PSD, "--only", "rows", "--rows", "4096", "--life", "--window", "2",
            "--seconds", "0.05", "--json", out], "bench_wire --only rows --life", 120) is None:
        return
    rows = load(out, "bench_wire --only rows --life")
    if rows is None:
        return
    cases = {r.get("case"): r for r in rows if r.get("bench") == "rows"}
    check(sorted(cases) == ["life", "loop", "psd"], "rows for the loop, psd and psd with its "
          "life cycle (%s)" % sorted(map(str, cases)))
    check(all(positive(r, "pull_keys_per_s", "push_keys_per_s") for r in cases.values()),
          "each has pull and push keys/s above 0 (%s)" % cases)
    check(all(positive(cases[c], "pull_keys_per_cpu_s", "push_keys_per_cpu_s", "fill_keys_per_s")
              for c in ("life", "psd") if c in cases),
          "psd's rows have keys per CPU second and a fill rate above 0")


def apply_(bench, tmp):
    out = os.path.join(tmp, "apply.json")
    if run([bench, "--repeat", "1", "--json", out], "bench_apply", 600) is None:
        return
    r = load(out, "bench_apply")
    if r is None:
        return
    keys = ["memcpy_gbps", "sgd_ratio", "momentum_ratio", "adam_ratio", "sparse_updates_per_s",
            "scatter_updates_per_s", "sparse_ratio", "rows_updates_per_s", "rows_ratio",
            "row_pulls_per_s", "gather_per_s", "row_pull_ratio"]
    check(isinstance(r, dict) and positive(r, *keys),
          "bench_apply's JSON has every number, above 0 (%s)" % r)


def conv(bench, tmp):
    out = os.path.join(tmp, "conv.json")
    if run([bench, "--repeat", "1", "--batch", "8", "--json", out], "conv_bench", 600) is None:
        return
    r = load(out, "conv_bench")
    keys = ["conv%d_%s_ms" % (i, k) for i in (1, 2) for k in ("psk", "onednn_nchw",
                                                               "onednn_blocked")]
    check(isinstance(r, dict) and positive(r, *keys) and r.get("batch") == 8,
          "conv_bench's JSON has every time, above 0, and its batch (%s)" % r)


def topk(bench, tmp):
    out = os.path.join(tmp, "topk.json")
    if run([bench, "--calls", "1", "--json", out], "topk_bench", 600) is None:
        return
    r = load(out, "topk_bench")
    check(isinstance(r, list) and len(r) == 6 and
          all(positive(row, "n", "k", "exact_us", "sampled_us") for row in r),
          "topk_bench's JSON has its six rows, every time above 0 (%s)" % r)


def train(script, tmp):
    out = os.path.join(tmp, "train.json")
    build = os.path.dirname(os.path.dirname(os.path.abspath(PSD)))
    if run(["bash", script, "--build-dir", build, "--no-build", "--steps", "20", "--repeat", "1",
            "--cnn-steps", "3", "--no-torch", "--json", out], "train_bench.sh", 600) is None:
        return
    r = load(out, "train_bench.sh")
    if r is None:
        return
    keys = ["standalone", "standalone_1thread", "standalone_helper", "one_plus_one",
            "one_plus_one_nobatch", "one_plus_one_1thread", "one_plus_one_noshm",
            "one_plus_one_tcp", "two_plus_two", "two_plus_two_asp", "two_plus_two_topk",
            "two_plus_two_f16", "cnn_1thread", "cnn", "cnn_bf16", "cnn_f16", "standalone_bf16"]
    if len(os.sched_getaffinity(0)) > 1:
        keys.append("one_plus_one_pinned")  # only where there is a CPU to pin away from
    check(isinstance(r, dict) and positive(r, *keys),
          "train_bench.sh's JSON has samples/s above 0 for every configuration (%s)" % r)
    check(isinstance(r, dict) and r.get("steps") == 20 and r.get("batch") == 64,
          "train_bench.sh's JSON names its steps and batch (%s)" % r)


def pipeline(script, tmp):
    out = os.path.join(tmp, "pipeline.json")
    build = os.path.dirname(os.path.dirname(os.path.abspath(PSD)))
    if run(["bash", script, "--build-dir", build, "--no-build", "--steps", "3", "--repeat", "1",
            "--batch", "64", "--microbatches", "4", "--layers", "784,32,32,32,10", "--json", out],
           "pipeline_bench.sh", 600) is None:
        return
    r = load(out, "pipeline_bench.sh")
    check(isinstance(r, dict) and all(isinstance(r.get(k), dict) and
                                      r[k].get("samples_per_sec", 0) > 0
                                      for k in ("one", "1f1b", "gpipe")),
          "pipeline_bench.sh's JSON has samples/s above 0 for every configuration (%s)" % r)
    check(isinstance(r, dict) and r.get("bubble_theory") == 0.2 and
          all(0 <= r.get(k, {}).get("bubble_stage0", -1) <= 1 for k in ("1f1b", "gpipe")),
          "pipeline_bench.sh's JSON has the bubbles, measured and (P-1)/(M+P-1) = 0.2 (%s)" % r)


def refused(args, flag, what, preexec=None):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=60, preexec_fn=preexec)
    check(p.returncode != 0 and flag in p.stdout,
          "%s is refused, naming %s (status %d: %s)" % (what, flag, p.returncode,
                                                       p.stdout.strip()[:200]))


def main():
    if len(sys.argv) not in (5, 6):
        print("usage: test_bench.py BENCH_WIRE BENCH_APPLY TRAIN_BENCH_SH TOPK_BENCH "
              "[CONV_BENCH]", file=sys.stderr)
        return 2
    bench_wire, bench_apply, train_bench, topk_bench = sys.argv[1:5]
    conv_bench = sys.argv[5] if len(sys.argv) == 6 else None
    tmp = tempfile.mkdtemp(prefix="psd-bench.")
    refused([bench_apply, "--repeat", "0"], "--repeat", "bench_apply --repeat 0")
    refused([bench_apply, "--repeat", "101"], "--repeat", "bench_apply --repeat 101")
    refused([bench_apply, "--repeat", "5x"], "--repeat", "bench_apply --repeat 5x")
    refused([bench_apply, "--json", os.path.join(tmp, "no", "such", "dir.json")], "--json",
            "bench_apply --json in a missing directory")
    refused([bench_wire, "--psd", PSD, "--size", "1000"], "--size", "bench_wire --size 1000")
    refused([bench_wire, "--psd", PSD, "--size", "4096x"], "--size", "bench_wire --size 4096x")
    refused([bench_wire, "--psd", PSD, "--shards", "3"], "--shards", "bench_wire --shards 3")
    refused([bench_wire, "--psd", PSD, "--seconds", "0"], "--seconds", "bench_wire --seconds 0")
    refused([bench_wire, "--psd", PSD, "--seconds", "600"], "--seconds", "bench_wire --seconds 600")
    refused([bench_wire, "--psd", PSD, "--seconds", "1x"], "--seconds", "bench_wire --seconds 1x")
    refused([bench_wire, "--psd", PSD, "--rounds", "0"], "--rounds", "bench_wire --rounds 0")
    refused([bench_wire, "--psd", PSD, "--rounds", "100"], "--rounds", "bench_wire --rounds 100")
    refused([bench_wire, "--psd", PSD, "--life"], "--life", "bench_wire --life without --only rows")
    refused([topk_bench, "--calls", "0"], "--calls", "topk_bench --calls 0")
    refused(["bash", train_bench, "--no-build", "--repeat", "0"], "--repeat",
            "train_bench.sh --repeat 0")
    pipeline_bench = os.path.join(os.path.dirname(os.path.abspath(train_bench)),
                                  "pipeline_bench.sh")
    refused(["bash", pipeline_bench, "--no-build", "--microbatches", "0"], "--micro",
            "pipeline_bench.sh --microbatches 0")
    if conv_bench:
        refused([conv_bench, "--repeat", "0"], "--repeat", "conv_bench --repeat 0")
        refused([conv_bench, "--batch", "8x"], "--batch", "conv_bench --batch 8x")
    else:
        print("conv_bench: not built (libdnnl-dev is not installed), not run")
    wire(bench_wire, tmp)
    pinned(bench_wire, tmp)
    rows_life(bench_wire, tmp)
    apply_(bench_apply, tmp)
    topk(topk_bench, tmp)
    train(train_bench, tmp)
    pipeline(pipeline_bench, tmp)
    if conv_bench:
        conv(conv_bench, tmp)
    finish(tmp)


if __name__ == "__main__":
    sys.exit(main())
