"""Real psd shards for the Python package's tests: started on loopback
with free ports, their endpoints read from --endpoint-file under a
deadline, and always stopped."""
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "worker", "python"))

DEADLINE_S = 30


def child_env():
    """The environment for psd: without the sanitizer runtime this Python
    was started with (LD_PRELOAD), with the test suite's ASan options."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if "PSD_CHILD_ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] = env["PSD_CHILD_ASAN_OPTIONS"]
    return env


class Cluster:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="psd-py-")
        self.procs = []
        self.endpoints = []

    def start(self, shards=1, args=()):
        psd = os.environ.get("PSD_BIN")
        if not psd:
            pytest.skip("PSD_BIN is not set (run through meson test)")
        files = []
        for i in range(shards):
            ep = os.path.join(self.tmp, "ep%d-%d" % (len(self.procs), i))
            log = open(os.path.join(self.tmp, "psd%d.log" % len(self.procs)), "w")
            self.procs.append(subprocess.Popen(
                [psd, "--listen", "tcp://127.0.0.1:0", "--endpoint-file", ep, "--shard", str(i),
                 "--shards", str(shards)] + list(args), stdout=subprocess.DEVNULL, stderr=log,
                env=child_env()))
            files.append(ep)
        deadline = time.monotonic() + DEADLINE_S
        eps = []
        for f, p in zip(files, self.procs[-shards:]):
            while not (os.path.exists(f) and open(f).read().strip()):
                if p.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("psd did not start: " + self.logs())
                time.sleep(0.01)
            eps.append(open(f).read().strip())
        self.endpoints = eps
        return ",".join(eps)

    def logs(self):
        out = []
        for name in sorted(os.listdir(self.tmp)):
            if name.endswith(".log"):
                text = open(os.path.join(self.tmp, name)).read()
                out.append("---- %s\n%s" % (name, text[-3000:]))
        return "\n".join(out)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=10))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        return codes


# Fashion-MNIST, where Debian's dataset package puts it
DATA = "/usr/share/datasets/fashion-mnist"


def worker_bin():
    """psworker, with the data it trains on; skips the test without them."""
    w = os.environ.get("PSWORKER_BIN")
    if not w:
        pytest.skip("PSWORKER_BIN is not set (run through meson test)")
    if not os.path.exists(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")):
        pytest.skip("Fashion-MNIST is not installed (dataset-fashion-mnist)")
    return w


def run_psworkers(cmd, tmp, args_of, n, name="w"):
    """n psworkers at once: cmd (the binary and the flags they share) plus
    args_of(rank), each with --summary-json tmp/NAME<rank>.json. Waits
    for all (10 minutes at most, then kills), asserts each exited 0, and
    returns their summaries and stderr."""
    procs = []
    for r in range(n):
        summary = tmp / ("%s%d.json" % (name, r))
        procs.append((subprocess.Popen(cmd + args_of(r) + ["--summary-json", str(summary)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       text=True, env=child_env()), summary))
    out = []
    for p, summary in procs:
        try:
            _, err = p.communicate(timeout=600)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 0, err[-3000:]
        out.append((json.load(open(summary)), err))
    return out


def finish(procs, tmp, name, timeout=600):
    """Waits for processes whose stderr went to tmp/NAME<i>.log (timeout s
    each, then kills them), and asserts each exited 0, showing its log's
    end when not."""
    for r, p in enumerate(procs):
        try:
            p.wait(timeout=timeout)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 0, open(str(tmp / ("%s%d.log" % (name, r)))).read()[-3000:]


def free_port():
    """A loopback TCP port free now (for a process that must come back on
    the same one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_threads(fn, n, timeout=120):
    """fn(0), ..., fn(n-1) at once, one thread each (workers sharing
    this process, each with its own client); returns their results, or
    raises the first exception one raised, here in the test's thread."""
    out, errors = [None] * n, []

    def run(r):
        try:
            out[r] = fn(r)
        except Exception as e:  # raised again below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a worker thread is still running"
    return out


def export(servers, out):
    """psctl export of every table to out, loaded back (skips the test
    when psctl is not built)."""
    psctl = os.environ.get("PSCTL_BIN")
    if not psctl:
        pytest.skip("PSCTL_BIN is not set")
    import psd
    r = subprocess.run([psctl, "--servers", servers, "export", str(out)], capture_output=True,
                       text=True, env=child_env())
    assert r.returncode == 0, r.stderr
    return psd.load_safetensors(out)


@pytest.fixture
def cluster():
    c = Cluster()
    try:
        yield c
    finally:
        codes = c.stop()
        bad = [x for x in codes if x not in (0,)]
        if bad:
            print(c.logs())
        assert not bad, "psd exited with %s" % bad
