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
--while backup-joins: a primary holding the --gib GiB table
(--lease-ttl 30, --replica-timeout-ms 60000, so that a transfer written
on the loop does not cost it its lease; --replica-transfer-mib 4096 where
psd has it, for the records this client's pushes make meanwhile), and 2 s in, a backup that joins
it (the whole shard's state transfer): the pulls' latencies before it
started, and from its start until it is in sync (pushes and pulls
alike: a push may be the request that waits).
Both need Debian's etcd-server.
Reports; never fails on a number.

    /usr/bin/python3 tests/bench/pause_bench.py --psd OLD --psd NEW
        [--gib 2] [--seconds 10] [--while checkpoint|etcd-stopped|backup-joins]
        [--json PATH]"""
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


class Replicated:
    """etcd and psd replicas in work, stopped at the end (stop())."""

    def __init__(self, tmp, what):
        exe = shutil.which("etcd")
        if exe is None:
            raise SystemExit("%s needs etcd (Debian's etcd-server)" % what)
        self.work = tempfile.mkdtemp(dir=tmp)
        self.url = "http://127.0.0.1:%d" % free_port()
        self.procs = [subprocess.Popen(
            [exe, "--data-dir", os.path.join(self.work, "etcd"), "--listen-client-urls",
             self.url, "--advertise-client-urls", self.url, "--listen-peer-urls",
             "http://127.0.0.1:%d" % free_port()], stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.work, "etcd.log"), "w"))]

        def healthy():
            try:
                return urllib.request.urlopen(self.url + "/health", timeout=1).read() is not None
            except OSError:
                return False
        wait_for("etcd", healthy, self.procs)

    def log(self, i):
        return open(os.path.join(self.work, "psd%d.log" % i)).read()

    def start(self, psd_bin, i, args, primary=None):
        """Replica i (0: the primary, which this waits for); its endpoint."""
        epf = os.path.join(self.work, "ep%d" % i)
        argv = [psd_bin, "--listen", "tcp://127.0.0.1:0", "--endpoint-file", epf, "--etcd",
                self.url] + args + (["--replica-of", primary] if primary else [])
        self.procs.append(subprocess.Popen(
            argv, stderr=open(os.path.join(self.work, "psd%d.log" % i), "w")))
        wait_for("psd %d" % i, lambda: os.path.exists(epf) and open(epf).read().strip(),
                 self.procs)
        if primary is None:
            wait_for("the primary", lambda: "S0715" in self.log(i), self.procs)
        return open(epf).read().strip()

    def stop(self):
        for p in reversed(self.procs):
            p.send_signal(signal.SIGCONT)
            p.terminate()
            p.wait()


def run_etcd_stopped(psd_bin, seconds, tmp):
    """A primary and a backup; etcd stopped 1.5 s of every 3."""
    import numpy as np
    import psd
    rs = Replicated(tmp, "--while etcd-stopped")
    try:
        eps = [rs.start(psd_bin, 0, ["--lease-ttl", "3"])]
        eps.append(rs.start(psd_bin, 1, ["--lease-ttl", "3"], primary=eps[0]))
        wait_for("the backup in sync", lambda: "S0703 in sync: this primary and 1" in rs.log(0),
                 rs.procs)
        stopped, running = [], []
        with psd.Client("|".join(eps), timeout_ms=20000) as c:
            c.create_table("w", 1024, "sgd", lr=0.01)
            g, out = np.ones(1024, np.float32), np.empty(1024, np.float32)
            start = time.monotonic()
            is_stopped = False
            while time.monotonic() - start < seconds:
                want = (time.monotonic() - start) % 3.0 >= 1.5
                if want != is_stopped:
                    rs.procs[0].send_signal(signal.SIGSTOP if want else signal.SIGCONT)
                    is_stopped = want
                c.push("w", g).wait()
                t0 = time.perf_counter()
                c.pull("w", out).wait()
                (stopped if is_stopped else running).append(time.perf_counter() - t0)
            if is_stopped:
                rs.procs[0].send_signal(signal.SIGCONT)
        text = rs.log(0)
        return {"stopped": summary(stopped), "running": summary(running),
                "renewals_failed": text.count("S0717"), "stepped_down": text.count("S0716")}
    finally:
        rs.stop()


def run_backup_joins(psd_bin, gib, seconds, tmp):
    """A primary holding gib GiB; after 2 s a backup joins it (a state
    transfer of the whole shard), while the client pulls."""
    import numpy as np
    import psd
    rs = Replicated(tmp, "--while backup-joins")
    # a lease and a silence limit that outlast a transfer written on the loop
    args = ["--lease-ttl", "30", "--replica-timeout-ms", "60000",
            "--max-table-bytes", str((gib + 1) << 30)]
    # this client pushes as fast as it can: what the primary keeps for the
    # backup while the state is written may pass the default bound
    helptext = subprocess.run([psd_bin, "--help"], capture_output=True, text=True).stdout
    if "--replica-transfer-mib" in helptext:
        args += ["--replica-transfer-mib", "4096"]
    try:
        ep = rs.start(psd_bin, 0, args)
        before, joining = [], []
        joined_s = None
        longest = (0.0, 0.0)  # the longest pull while joining, and when (s after the start)
        with psd.Client(ep, timeout_ms=120000) as c:
            c.create_table("big", gib << 28, "sgd", lr=0.01, init="uniform", init_scale=0.1)
            g, out = np.ones(1024, np.float32), np.empty(1024, np.float32)
            start = time.monotonic()
            backup = None
            while time.monotonic() - start < seconds:
                if backup is None and time.monotonic() - start >= 2:
                    backup = rs.start(psd_bin, 1, args, primary=ep)
                    t_join = time.monotonic()
                in_sync = backup is not None and "S0703 in sync: this primary and 1" in rs.log(0)
                if in_sync and joined_s is None:
                    joined_s = time.monotonic() - t_join
                for req in (lambda: c.push("big", g), lambda: c.pull("big", out)):
                    t0 = time.perf_counter()
                    req().wait()
                    took = time.perf_counter() - t0
                    if backup is not None and not in_sync:
                        joining.append(took)
                        if took >= longest[0]:
                            longest = (took, time.monotonic() - t_join)
                    else:
                        before.append(took)
        text = rs.log(0)
        m = re.search(r"S0706 .*", text)
        return {"before": summary(before), "joining": summary(joining),
                "joined_s": joined_s, "longest_at_s": longest[1],
                "transfer": m.group(0) if m else "none"}
    finally:
        rs.stop()


def print_latencies(binary, what, x):
    print("%-40s %-13s %6d requests  p50 %.2f ms  p99.9 %.1f ms  max %.1f ms  %d over 50 ms"
          % (binary, what, x["pulls"], x.get("p50_ms", 0), x.get("p999_ms", 0),
             x.get("max_ms", 0), x.get("over_50ms", 0)), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--psd", action="append", required=True, help="a psd binary (repeat)")
    ap.add_argument("--gib", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--while", dest="during",
                    choices=["checkpoint", "etcd-stopped", "backup-joins"],
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
                    print_latencies(b, "etcd " + k, r[k])
                print("%-40s %d renewals failed (S0717), %d step-downs (S0716)"
                      % (b, r["renewals_failed"], r["stepped_down"]), flush=True)
                continue
            if a.during == "backup-joins":
                r = run_backup_joins(b, a.gib, a.seconds, tmp)
                r["psd"] = b
                out.append(r)
                for k in ("before", "joining"):
                    print_latencies(b, k, r[k])
                print("%-40s in sync %s s after the backup started (the longest request %.1f s "
                      "after it); %s" % (b, "%.1f" % r["joined_s"] if r["joined_s"] else "not",
                                         r["longest_at_s"], r["transfer"][:220]), flush=True)
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
