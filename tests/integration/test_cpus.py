#!/usr/bin/env python3
"""CPU pinning: `psd --cpus` puts every psd thread (ZeroMQ's, the metrics
server's) on the CPUs named; `psworker --cpus A --io-cpus B` puts its
training thread on A and ZeroMQ's I/O thread on B, read back from
/proc/PID/task/*/status while they train; a CPU the process may not use,
or a malformed list, is refused at start with the flag named."""
import os
import re
import subprocess
import sys
import tempfile

from pstest import check, finish, poll, reap, spawn

PSD = os.environ["PSD_BIN"]
PSW = os.environ["PSWORKER_BIN"]


def threads(pid):
    """{tid: (name, Cpus_allowed_list)} of the process's threads now."""
    out = {}
    base = "/proc/%d/task" % pid
    for tid in os.listdir(base):
        try:
            with open("%s/%s/comm" % (base, tid)) as f:
                name = f.read().strip()
            with open("%s/%s/status" % (base, tid)) as f:
                allowed = re.search(r"^Cpus_allowed_list:\s*(\S+)", f.read(), re.M).group(1)
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
        out[int(tid)] = (name, allowed)
    return out


def main():
    tmp = tempfile.mkdtemp(prefix="psd-cpus.")
    allowed = sorted(os.sched_getaffinity(0))
    a, b = str(allowed[0]), str(allowed[-1])  # the same CPU on a 1-CPU machine
    try:
        ep = os.path.join(tmp, "ep")
        psd = spawn([PSD, "--listen", "tcp://127.0.0.1:0", "--endpoint-file", ep, "--cpus", b,
                     "--metrics-listen", "127.0.0.1:0"], os.path.join(tmp, "psd.log"))
        endpoint = poll(lambda: os.path.exists(ep) and open(ep).read().strip(), "psd's endpoint")
        if not endpoint:
            return
        t = threads(psd.pid)
        check(len(t) >= 3 and all(c == b for _, c in t.values()),
              "psd --cpus %s: all %d threads on CPU %s: %s" % (b, len(t), b, sorted(t.values())))
        with open(os.path.join(tmp, "psd.log")) as f:
            check("S0014 every thread runs on CPUs %s" % b in f.read(), "psd logs its CPUs")

        w = spawn([PSW, "--servers", endpoint, "--layers", "784,16,10", "--epochs", "1",
                   "--max-steps", "100000", "--test-delay-ms", "2", "--device", "cpu",
                   "--cpus", a, "--io-cpus", b], os.path.join(tmp, "w.log"))
        io = poll(lambda: [c for n, c in threads(w.pid).values() if n.startswith("ZMQbg/IO")],
                  "the worker's ZeroMQ I/O thread")
        t = threads(w.pid)
        rest = [c for n, c in t.values() if not n.startswith("ZMQbg/")]
        check(io == [b], "psworker --io-cpus %s: the I/O thread on CPU %s (%s)" % (b, b, io))
        check(rest and all(c == a for c in rest),
              "psworker --cpus %s: training and BLAS threads on CPU %s (%s)" % (a, a, rest))
        check(w.poll() is None, "the pinned worker is still training")
        with open(os.path.join(tmp, "w.log")) as f:
            check("W0007 threads on CPUs %s, ZeroMQ's I/O thread on %s" % (a, b) in f.read(),
                  "psworker logs its CPUs")

        # refused at start, naming the flag and the item
        outside = next((c for c in range(1024) if c not in allowed), None)
        bad = [([PSD, "--cpus", "0-"], "--cpus: '0-'"),
               ([PSD, "--cpus", "%s,,%s" % (a, b)], "--cpus: ''"),
               ([PSD, "--cpus", "3-1"], "'3-1'"),
               ([PSD, "--cpus", "1024"], "'1024'"),
               ([PSW, "--standalone", "--io-cpus", "x"], "--io-cpus: 'x'")]
        if outside is not None:
            bad.append(([PSW, "--standalone", "--cpus", str(outside)],
                        "--cpus: CPU %d is not one this process may run on" % outside))
        for args, want in bad:
            r = subprocess.run(args, capture_output=True, text=True, timeout=30)
            check(r.returncode == 2 and want in r.stderr,
                  "%s %s: exit 2 naming %r (exit %d: %s)" % (os.path.basename(args[0]),
                                                             " ".join(args[1:]), want,
                                                             r.returncode, r.stderr.strip()))
    finally:
        reap()
        finish(tmp)


if __name__ == "__main__":
    sys.exit(main())
