#!/usr/bin/env python3
"""How psd's costs grow with size, in one command:

- dense push-pull (1 shard, window 1) from a 4 KiB table to the largest
  power of two whose run fits in half of this machine's memory (about 6
  copies of the table are alive at once: the client's two buffers,
  psd's table, and the raw echo's), beside a raw ZeroMQ echo of the
  same bytes (bench_wire --only push-pull --size S --window 1);
- sparse rows of dim 16: pulls and pushes of random keys from a table of
  10k rows up to the largest whose psd fits in half the memory (judged
  by the bytes a row took at the size before), and the rate at which
  rows are created (bench_wire --only rows);
- checkpoints: psctl checkpoint's write and the restore at start, as psd
  times them (its S0600 and S0610 lines), from 1 MiB to a third of half the memory (or of the free disk),
  beside dd's own rates on the same disk: a write with conv=fsync and a
  read with the page cache dropped first (where this user may).

Prints a table for each, writes --json, and PNG plots (--plots DIR)
where matplotlib (Debian's python3-matplotlib) is installed. Reports
numbers; never passes or fails on them.

  tests/bench/size_bench.py [--build-dir DIR] [--max-bytes N] [--quick]
                            [--only dense,rows,checkpoint] [--json PATH]
                            [--plots DIR] [--dir DIR] [--repeat N]
--max-bytes caps the memory the runs may use (default: half of MemTotal);
--dir is where checkpoints and dd's file go (default: a new folder in /tmp);
--repeat: trials of each checkpoint size, their median reported (3);
--quick runs a few small sizes of each, once (the bench test does)."""
import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "worker", "python"))

MiB = 1 << 20
GiB = 1 << 30


def human(b):
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if b >= size:
            v = b / size
            return ("%d %s" % (v, unit)) if v == int(v) else ("%.1f %s" % (v, unit))
    return "%d B" % b


def mem_total():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def child_env():
    """Children without a sanitizer runtime preloaded into this Python
    (the test build's); psd and bench_wire link their own."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if "PSD_CHILD_ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] = env["PSD_CHILD_ASAN_OPTIONS"]
    return env


def run_bench_wire(wire, psd, args, timeout):
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        p = subprocess.run([wire, "--psd", psd, "--json", path] + args, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout, env=child_env())
        if p.returncode != 0:
            raise RuntimeError("bench_wire %s failed:\n%s" % (" ".join(args), p.stdout[-2000:]))
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def dense(wire, psd, budget, quick):
    """push-pull GB/s against size, psd beside raw."""
    top = max(4096, budget // 6)
    sizes, s = [], 4096
    while s <= top and (not quick or s <= MiB):
        sizes.append(s)
        s *= 4
    big = 1 << (top.bit_length() - 1)
    if not quick and big > sizes[-1]:
        sizes.append(big)
    print("\ndense push-pull, 1 shard, window 1 (bench_wire; raw = ZeroMQ echo of the same bytes)")
    print("%10s %12s %10s %12s %10s %7s" % ("table", "psd req/s", "psd GB/s", "raw req/s",
                                          "raw GB/s", "ratio"))
    rows = []
    for s in sizes:
        secs = "0.05" if quick else ("2" if s < 64 * MiB else "6")
        r = run_bench_wire(wire, psd, ["--only", "push-pull", "--size", str(s), "--window", "1",
                                       "--shards", "1", "--seconds", secs, "--rounds",
                                       "1" if quick else "3"], 1800)[0]
        # a push-pull moves the table's bytes each way
        row = {"bytes": s, "psd_rps": r["psd_rps"], "raw_rps": r["raw_rps"], "ratio": r["ratio"],
               "psd_gbps": 2 * s * r["psd_rps"] / 1e9, "raw_gbps": 2 * s * r["raw_rps"] / 1e9}
        rows.append(row)
        print("%10s %12.1f %10.3f %12.1f %10.3f %6.0f%%" % (
            human(s), row["psd_rps"], row["psd_gbps"], row["raw_rps"], row["raw_gbps"],
            100 * row["ratio"]), flush=True)
    return rows


def sparse(wire, psd, budget, quick):
    """keys/s of pulls, pushes and fills against the table's rows."""
    counts = [10000, 100000] if quick else [10 ** e * m for e in range(4, 10) for m in (1, 3)]
    print("\nsparse rows, dim 16, 1 shard, local ipc (bench_wire --only rows)")
    print("%12s %14s %14s %14s %10s" % ("rows", "fill keys/s", "pull keys/s", "push keys/s",
                                        "psd B/row"))
    rows, per_row = [], 0.0
    for n in counts:
        if per_row and n * per_row * 1.3 > budget:
            print("%12d   (not run: about %s would not fit in %s)" % (
                n, human(int(n * per_row)), human(budget)))
            break
        r = run_bench_wire(wire, psd, ["--only", "rows", "--rows", str(n), "--dim", "16",
                                       "--seconds", "0.1" if quick else "2"], 3600)[0]
        per_row = r["rss_bytes_per_row"] or per_row
        rows.append(r)
        print("%12d %14.0f %14.0f %14.0f %10.1f" % (
            n, r["fill_keys_per_s"], r["pull_keys_per_s"], r["push_keys_per_s"],
            r["rss_bytes_per_row"]), flush=True)
    return rows


def drop_caches():
    """Drops the page cache so that a read comes from the disk; False
    where this user may not."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def dd_rates(where, size):
    """dd's write (conv=fsync) and read (cache dropped) GB/s of size bytes."""
    path = os.path.join(where, "dd.bin")
    bs = 4 * MiB if size >= 4 * MiB else size
    t0 = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", "of=" + path, "bs=%d" % bs, "count=%d" % (size // bs),
                    "conv=fsync"], check=True, capture_output=True, env=child_env())
    w = size / (time.monotonic() - t0) / 1e9
    cold = drop_caches()
    t0 = time.monotonic()
    subprocess.run(["dd", "if=" + path, "of=/dev/null", "bs=%d" % bs], check=True,
                   capture_output=True, env=child_env())
    r = size / (time.monotonic() - t0) / 1e9
    os.unlink(path)
    return w, r, cold


class Shard:
    """One psd with a checkpoint folder, started and always stopped."""

    def __init__(self, psd, ckpt, log):
        self.ep = os.path.join(ckpt, "ep")
        if os.path.exists(self.ep):
            os.unlink(self.ep)
        self.log = log
        self.t0 = time.monotonic()
        self.p = subprocess.Popen([psd, "--listen", "tcp://127.0.0.1:0", "--endpoint-file",
                                   self.ep, "--checkpoint-dir", ckpt, "--checkpoint-every", "0",
                                   "--max-table-bytes", str(1 << 40), "--max-unread-bytes-total",
                                   str(1 << 40)],
                                  stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=child_env())
        deadline = self.t0 + 600
        while not (os.path.exists(self.ep) and open(self.ep).read().strip()):
            if self.p.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("psd did not start:\n" + open(log).read()[-2000:])
            time.sleep(0.002)
        self.start_s = time.monotonic() - self.t0
        self.endpoint = open(self.ep).read().strip()

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=600)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def checkpoint_once(psd, psctl, s, where):
    """One table of s bytes: filled, checkpointed (psctl), restored with the
    page cache dropped; then dd on the same folder. Returns the file's
    bytes, psd's write and restore ms, dd's write and read GB/s, and
    whether the cache could be dropped."""
    import numpy as np
    import psd as psdpkg
    ckpt = tempfile.mkdtemp(prefix="ckpt.", dir=where)
    try:
        shard = Shard(psd, ckpt, os.path.join(ckpt, "psd0.log"))
        n = s // 4
        try:
            with psdpkg.Client(shard.endpoint, timeout_ms=600000) as c:
                c.create_table("w", n, "sgd", 0.01)
                chunk = 16 * MiB // 4
                vals = np.full(min(n, chunk), 0.5, dtype=np.float32)
                for off in range(0, n, chunk):
                    c.set_weights("w", vals[:min(chunk, n - off)], offset=off).wait(600000)
            r = subprocess.run([psctl, "--servers", shard.endpoint, "--timeout-ms", "600000",
                                "checkpoint"], capture_output=True, text=True, env=child_env())
            if r.returncode != 0:
                raise RuntimeError("psctl checkpoint failed: " + r.stderr)
        finally:
            shard.stop()
        log = open(os.path.join(ckpt, "psd0.log")).read()
        ms = re.findall(r"S0600 checkpoint \S+ written \(asked for, \d+ tables, (\d+) ms\)", log)
        if not ms:
            raise RuntimeError("no S0600 line in psd's log:\n" + log[-2000:])
        fbytes = max(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt)
                     if f.endswith(".safetensors"))
        cold = drop_caches()
        Shard(psd, ckpt, os.path.join(ckpt, "psd1.log")).stop()
        log = open(os.path.join(ckpt, "psd1.log")).read()
        got = re.findall(r"S0610 restored \S+: \d+ tables \((\d+) ms\)", log)
        if not got:
            raise RuntimeError("psd did not restore the checkpoint:\n" + log[-2000:])
        ddw, ddr, _ = dd_rates(ckpt, s)
        return fbytes, int(ms[0]), int(got[0]), ddw, ddr, cold
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def checkpoints(psd, psctl, budget, quick, where, repeat):
    """psd's checkpoint write and restore against size, beside dd; the
    median of repeat trials of each (this VM's disk is bimodal)."""
    free = shutil.disk_usage(where).free
    top = min(budget // 3, free // 4)
    sizes, s = [], MiB
    while s <= top and (not quick or s <= 4 * MiB):
        sizes.append(s)
        s *= 4
    print("\ncheckpoints, 1 shard, sgd (no optimizer state): psctl checkpoint's write and the "
          "restore at start, as psd times them (S0600, S0610); dd on the same disk; median of "
          "%d" % repeat)
    print("%10s %11s %10s %11s %10s %12s %11s" % ("table", "write ms", "write GB/s", "restore ms",
                                                "read GB/s", "dd write GB/s", "dd read GB/s"))
    rows = []
    for s in sizes:
        t = [checkpoint_once(psd, psctl, s, where) for _ in range(repeat)]
        fbytes, cold = t[0][0], all(x[5] for x in t)
        w_ms, r_ms = median([x[1] for x in t]), median([x[2] for x in t])
        row = {"bytes": s, "file_bytes": fbytes, "write_ms": w_ms,
               "write_gbps": fbytes / max(w_ms, 0.5) / 1e6, "restore_ms": r_ms,
               "restore_gbps": fbytes / max(r_ms, 0.5) / 1e6,
               "dd_write_gbps": median([x[3] for x in t]), "dd_read_gbps": median([x[4] for x in t]),
               "cold_cache": cold, "write_ms_runs": [x[1] for x in t],
               "restore_ms_runs": [x[2] for x in t]}
        rows.append(row)
        print("%10s %11.0f %10.3f %11.0f %10.3f %12.3f %11.3f   write runs %s" % (
            human(s), w_ms, row["write_gbps"], r_ms, row["restore_gbps"], row["dd_write_gbps"],
            row["dd_read_gbps"], row["write_ms_runs"]), flush=True)
    if rows and not rows[0]["cold_cache"]:
        print("(the page cache could not be dropped: restores and dd reads may come from memory)")
    return rows


def plots(res, where):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\nno plots: matplotlib is not installed (python3-matplotlib)")
        return []
    os.makedirs(where, exist_ok=True)
    made = []

    def chart(name, rows, xkey, lines, title, xlabel, ylabel, ylog=False):
        """One PNG: lines are (key, label, style) over rows[xkey]."""
        if not rows:
            return
        fig, ax = plt.subplots(figsize=(6, 3.6))
        x = [r[xkey] for r in rows]
        for key, label, style in lines:
            ax.plot(x, [r[key] for r in rows], style, label=label)
        if xkey == "bytes":
            ax.set_xscale("log", base=2)
        else:
            ax.set_xscale("log")
        if ylog:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend()
        ax.grid(True, alpha=0.3)
        path = os.path.join(where, name)
        fig.savefig(path, dpi=90, bbox_inches="tight")
        plt.close(fig)
        made.append(path)

    chart("size_dense.png", res.get("dense"), "bytes",
          [("psd_gbps", "psd push-pull", "o-"), ("raw_gbps", "raw ZeroMQ echo", "s--")],
          "dense push-pull, window 1", "table bytes", "GB/s (both ways)")
    chart("size_rows.png", res.get("rows"), "rows",
          [("pull_keys_per_s", "pull", "o-"), ("push_keys_per_s", "push", "o-"),
           ("fill_keys_per_s", "fill (new rows)", "o-")],
          "sparse rows, random keys", "rows in the table (dim 16)", "keys/s", ylog=True)
    chart("size_checkpoint.png", res.get("checkpoint"), "bytes",
          [("write_gbps", "checkpoint write", "o-"), ("restore_gbps", "restore", "o-"),
           ("dd_write_gbps", "dd write (fsync)", "s--"), ("dd_read_gbps", "dd read", "s--")],
          "checkpoints against the disk", "table bytes", "GB/s")
    print("\nplots: " + ", ".join(made))
    return made


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build-release"))
    ap.add_argument("--max-bytes", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="dense,rows,checkpoint")
    ap.add_argument("--json")
    ap.add_argument("--plots")
    ap.add_argument("--dir")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    parts = a.only.split(",")
    bad = [p for p in parts if p not in ("dense", "rows", "checkpoint")]
    if bad:
        ap.error("--only: %s is not dense, rows or checkpoint" % ", ".join(bad))
    if not 1 <= a.repeat <= 99:
        ap.error("--repeat: 1 to 99 trials of each checkpoint size")
    if a.max_bytes < 0 or (a.max_bytes and a.max_bytes < MiB):
        ap.error("--max-bytes: at least 1 MiB (0: half of the memory)")
    b = os.path.abspath(a.build_dir)
    psd = os.environ.get("PSD_BIN") or os.path.join(b, "server", "psd")
    wire = os.path.join(b, "tests", "bench_wire")
    psctl = os.environ.get("PSCTL_BIN") or os.path.join(b, "worker", "client", "psctl")
    for path in (psd, wire, psctl):
        if not os.access(path, os.X_OK):
            ap.error("%s is not built (a build with tests: meson setup %s -Dbuildtype=release)"
                     % (path, a.build_dir))
    os.environ.setdefault("PSD_LIBPSCLIENT",
                          os.path.join(b, "worker", "client", "libpsclient.so.1"))
    budget = a.max_bytes or mem_total() // 2
    print("size_bench: %s of memory for the runs (half of %s unless --max-bytes), %d CPUs" % (
        human(budget), human(mem_total()), os.cpu_count()))
    where = a.dir or tempfile.mkdtemp(prefix="psd-size.")
    os.makedirs(where, exist_ok=True)
    res = {"budget_bytes": budget}
    if "dense" in parts:
        res["dense"] = dense(wire, psd, budget, a.quick)
    if "rows" in parts:
        res["rows"] = sparse(wire, psd, budget, a.quick)
    if "checkpoint" in parts:
        res["checkpoint"] = checkpoints(psd, psctl, budget, a.quick, where,
                                        1 if a.quick else a.repeat)
    if a.plots:
        res["plots"] = plots(res, a.plots)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    if not a.dir:
        shutil.rmtree(where, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
