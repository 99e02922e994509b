#!/usr/bin/env python3
"""The DLRM example (worker/python/examples/dlrm.py) through psd against
torch DDP, on the same Criteo-shaped stream from gen_clicks --criteo,
the same steps and the same global batch: 2 psd shards (bsp) and 2
ranks, against 2 DDP ranks (gloo) whose 26 nn.EmbeddingBag tables are
hashed to the same rows per field as psd's budget. psd runs with
admission and eviction on (its budget enforced by evicting the least
recently pushed rows) and, as a reference, unbounded. Prints examples/s
and held-out log-loss of each, and psd's against DDP's. Reports; never
fails on a number.

    /usr/bin/python3 tests/bench/dlrm_bench.py [--build-dir DIR]
        [--train N] [--test M] [--features F] [--alpha A] [--batch B]
        [--threads T] [--runs psd,psd-unbounded,ddp] [--json PATH]"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
EXAMPLE = os.path.join(ROOT, "worker", "python", "examples", "dlrm.py")


def start_psd(build, tmp, shards, workers):
    procs, eps = [], []
    for i in range(shards):
        epf = os.path.join(tmp, "ep%d" % i)
        procs.append(subprocess.Popen(
            [os.path.join(build, "server", "psd"), "--listen", "tcp://127.0.0.1:0",
             "--endpoint-file", epf, "--shard", str(i), "--shards", str(shards),
             "--workers", str(workers), "--consistency", "bsp", "--log-level", "warn"],
            stderr=open(os.path.join(tmp, "psd%d.log" % i), "w")))
    deadline = time.monotonic() + 30
    for epf, p in zip([os.path.join(tmp, "ep%d" % i) for i in range(shards)], procs):
        while not (os.path.exists(epf) and open(epf).read().strip()):
            if p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("psd did not start:\n" + "".join(
                    open(os.path.join(tmp, "psd%d.log" % i)).read() for i in range(shards)))
            time.sleep(0.01)
        eps.append(open(epf).read().strip())
    return procs, ",".join(eps)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(name, a, data, tmp):
    """Runs the example on 2 ranks; returns rank 0's results."""
    procs, env = [], dict(os.environ, PYTHONPATH=os.path.join(ROOT, "worker", "python"),
                          WORLD_SIZE="2", OMP_NUM_THREADS=str(a.threads))
    env["PSD_LIBPSCLIENT"] = os.path.join(a.build_dir, "worker", "client", "libpsclient.so.1")
    extra = ["--ddp"] if name == "ddp" else (["--unbounded"] if name == "psd-unbounded" else [])
    if name == "ddp":
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    else:
        os.makedirs(os.path.join(tmp, name))
        procs, env["PSD_SERVERS"] = start_psd(a.build_dir, os.path.join(tmp, name), 2, 2)
    try:
        ranks = []
        for r in (0, 1):
            ranks.append(subprocess.Popen(
                [sys.executable, EXAMPLE, "--data", data, "--batch", str(a.batch),
                 "--threads", str(a.threads), "--json", os.path.join(tmp, "%s%d.json" % (name, r))]
                + extra + a.example_args.split(), env=dict(env, RANK=str(r)),
                stdout=open(os.path.join(tmp, "%s%d.log" % (name, r)), "w"),
                stderr=subprocess.STDOUT))
        for r, p in enumerate(ranks):
            if p.wait() != 0:
                raise SystemExit("%s rank %d failed:\n%s" % (
                    name, r, open(os.path.join(tmp, "%s%d.log" % (name, r))).read()[-3000:]))
        res = [json.load(open(os.path.join(tmp, "%s%d.json" % (name, r)))) for r in (0, 1)]
        out = {"examples_per_s": sum(x["examples_per_s"] for x in res),
               "test_logloss": res[0]["test_logloss"], "true_logloss": res[0]["true_logloss"],
               "steps": res[0]["steps"], "budget_rows": sum(res[0]["rows"])}
        if procs:  # what the shards hold and did, summed over tables and shards
            st = subprocess.run([os.path.join(a.build_dir, "worker", "client", "psctl"),
                                 "--servers", env["PSD_SERVERS"], "--json", "status"],
                                capture_output=True, text=True)
            if st.returncode != 0:
                raise SystemExit("psctl status: " + st.stderr)
            tables = [t for s in json.loads(st.stdout)["shards"] for t in s["tables"]
                      if t["name"].startswith("dlrm.C")]
            for k in ("rows", "admitted", "held_back", "evicted_age", "evicted_budget"):
                out[k] = sum(t.get(k, 0) for t in tables)
        return out
    finally:
        for p in procs:
            p.terminate()
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build-release"))
    ap.add_argument("--train", type=int, default=400000)
    ap.add_argument("--test", type=int, default=50000)
    ap.add_argument("--features", type=int, default=100000, help="live ids of the largest fields")
    ap.add_argument("--alpha", type=float, default=1.1)
    ap.add_argument("--batch", type=int, default=1024, help="examples per step, both ranks")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--runs", default="psd,psd-unbounded,ddp")
    ap.add_argument("--example-args", default="", help="more flags for dlrm.py, in one string")
    ap.add_argument("--json")
    a = ap.parse_args()
    runs = a.runs.split(",")
    for r in runs:
        if r not in ("psd", "psd-unbounded", "ddp"):
            ap.error("--runs: psd, psd-unbounded or ddp (got %r)" % r)
    tmp = tempfile.mkdtemp(prefix="dlrm-bench-")
    try:
        bench(a, runs, tmp)
    finally:  # the data set is hundreds of MB
        shutil.rmtree(tmp, ignore_errors=True)


def bench(a, runs, tmp):
    data = os.path.join(tmp, "data")
    g = subprocess.run([os.path.join(a.build_dir, "tests", "gen_clicks"), "--criteo", "--out",
                        data, "--train", str(a.train), "--test", str(a.test), "--features",
                        str(a.features), "--alpha", str(a.alpha)], capture_output=True, text=True)
    if g.returncode != 0:
        raise SystemExit("gen_clicks: " + g.stderr)
    truth = json.load(open(os.path.join(data, "truth.json")))
    print("data: %d + %d examples, Zipf %.2f, %d distinct training ids; true log-loss %.5f"
          % (a.train, a.test, a.alpha, truth["distinct_ids"], truth["test_logloss"]))
    out = {}
    for r in runs:
        out[r] = run(r, a, data, tmp)
        o = out[r]
        print("%-14s %9.0f examples/s  held-out log-loss %.5f (%+.2f%% of the truth's)  %d steps"
              % (r, o["examples_per_s"], o["test_logloss"],
                 100 * (o["test_logloss"] / truth["test_logloss"] - 1), o["steps"]), flush=True)
        if "rows" in o:
            print("%14s rows held %d (budget %d in all), admitted %d, pushes held back %d, "
                  "evicted by age %d, for room %d" % (
                      "", o["rows"], o["budget_rows"], o["admitted"], o["held_back"],
                      o["evicted_age"], o["evicted_budget"]), flush=True)
    if "ddp" in out:
        for r in runs:
            if r != "ddp":
                print("%s / ddp: %.2fx examples/s, log-loss %+.2f%%"
                      % (r, out[r]["examples_per_s"] / out["ddp"]["examples_per_s"],
                         100 * (out[r]["test_logloss"] / out["ddp"]["test_logloss"] - 1)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"truth": truth, "runs": out, "batch": a.batch, "threads": a.threads}, f,
                      indent=1)


if __name__ == "__main__":
    main()
