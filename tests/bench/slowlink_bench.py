#!/usr/bin/env python3
"""Compression on slow links: 2 psd shards and 2 psworkers, each in its
own network namespace on a bridge, every link limited to RATE in both
directions (tc tbf on both ends: this kernel has no netem, and tbf works
in a namespace), bsp, the MLP (and with --models mlp,cnn the CNN), one
epoch or --max-steps. Dense against --topk 0.01 (its pulls bringing
what changed, and with --whole-pulls the whole tables) and against
--wire-dtype f16, at each rate; prints samples/s, test accuracy,
bytes moved per step and each against the dense run at the same rate.
Reports; never fails on a number.

    sudo /usr/bin/python3 tests/bench/slowlink_bench.py [--build-dir DIR]
        [--rates 1gbit,100mbit] [--models mlp[,cnn]] [--epochs N] [--max-steps N]
        [--json PATH]

Needs root, ip and tc; everything it creates is named after its pid and
removed at the end, also on failure."""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from pstest import bridge, check, in_namespaces, poll, sh, spawn  # noqa: E402

TAG = "sl%d" % (os.getpid() % 100000)
HUB = TAG + "hub"
NODES = ["s0", "s1", "w0", "w1"]
CONFIGS = [("dense", []), ("topk", ["--topk", "0.01"]),
           ("topk-whole", ["--topk", "0.01", "--whole-pulls"]), ("f16", ["--wire-dtype", "f16"])]


def ns(node):
    return TAG + node


def make_network():
    """A hub namespace with a bridge, each node a namespace with a veth into
    it at 10.78.0.N/24."""
    bridge(HUB, [(ns(node), "v%s%s" % (TAG, node), "10.78.0.%d/24" % (i + 1))
                 for i, node in enumerate(NODES)])


def remove_network():
    for n in [ns(x) for x in NODES] + [HUB]:
        os.system("ip netns del %s 2>/dev/null" % n)


def bits(rate):
    """tc's rate text in bits/s: 1gbit, 100mbit, 500kbit."""
    for suffix, mult in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3), ("bit", 1)):
        if rate.endswith(suffix):
            return int(float(rate[:-len(suffix)]) * mult)
    raise ValueError("--rates: %r is not NUMBER(g|m|k)bit" % rate)


def limit(rate):
    """tbf at rate on both ends of every link (replacing the last one); its
    bucket holds a 250 Hz tick's worth (a smaller one caps the rate below
    what it says)."""
    burst = str(max(bits(rate) // 250 // 8, 32 * 1024))  # bytes
    for node in NODES:
        here = "v%s%s" % (TAG, node)
        for where, dev in ((ns(node), "eth0"), (HUB, here)):
            os.system("ip netns exec %s tc qdisc del dev %s root 2>/dev/null" % (where, dev))
            sh("tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", burst,
               "latency", "200ms", ns=where)


def run(tmp, args, name, extra):
    """2 shards + 2 workers, bsp: rank 0's summary, or None."""
    psd = os.path.join(args.build_dir, "server", "psd")
    psw = os.path.join(args.build_dir, "worker", "psworker")
    eps = []
    for i in (0, 1):
        epf = os.path.join(tmp, "%s-ep%d" % (name, i))
        p = spawn([psd, "--listen", "tcp://10.78.0.%d:0" % (i + 1), "--endpoint-file", epf,
                   "--shard", str(i), "--shards", "2", "--workers", "2", "--consistency", "bsp"],
                  os.path.join(tmp, "%s-psd%d.log" % (name, i)), ns("s%d" % i))
        if not poll(lambda: (os.path.exists(epf) and open(epf).read().strip()) or
                    p.poll() is not None, "psd %d of %s" % (i, name)) or p.poll() is not None:
            return None
        eps.append(open(epf).read().strip())
    ws = []
    for r in (0, 1):
        ws.append(spawn([psw, "--servers", ",".join(eps), "--rank", str(r), "--workers", "2",
                         "--epochs", str(args.epochs), "--max-steps", str(args.max_steps),
                         "--device", "cpu", "--log-every", "1000000", "--summary-json",
                         os.path.join(tmp, "%s-w%d.json" % (name, r))] + extra,
                        os.path.join(tmp, "%s-w%d.log" % (name, r)), ns("w%d" % r)))
    rcs = [w.wait(timeout=1800) for w in ws]
    check(rcs == [0, 0], "%s: both workers finished (%s)" % (name, rcs))
    if rcs != [0, 0]:
        return None
    with open(os.path.join(tmp, "%s-w0.json" % name)) as f:
        return json.load(f)


def main(tmp, args):
    rows = []
    for model in args.models.split(","):
        for rate in args.rates.split(","):
            rows += one_rate(tmp, args, model, rate)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def one_rate(tmp, args, model, rate):
    rows = []
    limit(rate)
    dense = None
    for name, extra in CONFIGS:
        s = run(tmp, args, "%s-%s-%s" % (model, rate, name), extra + ["--model", model])
        if s is None:
            continue
        sps = 2 * s["samples_per_sec"]  # both workers, as train_bench counts
        dense = sps if name == "dense" else dense
        steps = max(s["steps"], 1)
        row = {"model": model, "rate": rate, "config": name, "samples_per_s": sps,
               "ratio": sps / dense if dense else None,
               "test_accuracy": s["test_accuracy"],
               "kb_pushed_per_step": s["bytes_pushed"] / steps / 1024,
               "kb_pulled_per_step": s["bytes_pulled"] / steps / 1024}
        rows.append(row)
        print("%4s %8s %10s %10.0f samples/s %6s  accuracy %.4f  pushed %7.1f kB/step  "
              "pulled %7.1f kB/step" % (model, rate, name, sps, "%.2fx" % row["ratio"]
                                        if row["ratio"] else "-", row["test_accuracy"],
                                        row["kb_pushed_per_step"], row["kb_pulled_per_step"]),
              flush=True)
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default="build-release")
    ap.add_argument("--rates", default="1gbit,100mbit")
    ap.add_argument("--models", default="mlp")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=1000000)
    ap.add_argument("--json")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("slowlink_bench: needs root (ip netns, tc)", file=sys.stderr)
        sys.exit(2)
    in_namespaces("slowlink", make_network, remove_network, lambda tmp: main(tmp, a))
