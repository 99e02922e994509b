"""Processes that a scheduler starts: psd --shard auto (PSD_SHARD, or the
host name's ordinal, as a StatefulSet's pods have), psworker --rank auto
and --workers auto (an Indexed Job's JOB_COMPLETION_INDEX and the
manifest's PSD_WORKERS), and --servers patterns, end to end. The parsing
and every error case are unit tests (tests/unit/test_opts.c)."""
import json
import os
import shutil
import socket
import subprocess
import time

import pytest

from conftest import DATA, child_env, worker_bin


def psd_bin():
    p = os.environ.get("PSD_BIN")
    if not p:
        pytest.skip("PSD_BIN is not set (run through meson test)")
    return p


def free_port():
    """A port free on 127.0.0.1 and 127.0.0.2 alike (both loopback)."""
    for _ in range(20):
        s1, s2 = socket.socket(), socket.socket()
        try:
            s1.bind(("127.0.0.1", 0))
            port = s1.getsockname()[1]
            s2.bind(("127.0.0.2", port))
            return port
        except OSError:
            continue
        finally:
            s1.close()
            s2.close()
    pytest.skip("no port free on both 127.0.0.1 and 127.0.0.2")


def wait_file(path, proc, what):
    deadline = time.monotonic() + 30
    while not (os.path.exists(path) and open(path).read().strip()):
        assert proc.poll() is None, "%s exited: %s" % (what, proc.stderr.read()[-2000:])
        assert time.monotonic() < deadline, "%s did not start" % what
        time.sleep(0.01)


def start(procs, args, env_extra, what, tmp):
    env = child_env()
    env.update(env_extra)
    ep = tmp / ("%s.ep" % what)
    p = subprocess.Popen(args + ["--endpoint-file", str(ep)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env=env)
    procs.append(p)
    wait_file(str(ep), p, what)
    return open(ep).read().strip()


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_auto_indices_and_a_pattern_train_end_to_end(tmp_path):
    port = free_port()
    procs = []
    try:
        common = [psd_bin(), "--shards", "2", "--shard", "auto", "--consistency", "bsp",
                  "--workers", "2"]
        eps = [start(procs, common + ["--listen", "tcp://127.0.0.%d:%d" % (i + 1, port)],
                     {"PSD_SHARD": str(i)}, "psd%d" % i, tmp_path) for i in range(2)]
        assert eps == ["tcp://127.0.0.%d:%d" % (i + 1, port) for i in range(2)]
        pattern = "tcp://127.0.0.[1-2]:%d" % port
        workers = []
        for r in range(2):
            env = child_env()
            env.update({"JOB_COMPLETION_INDEX": str(r), "PSD_WORKERS": "2"})
            env.pop("RANK", None)
            env.pop("WORLD_SIZE", None)
            workers.append(subprocess.Popen(
                [worker_bin(), "--data", DATA, "--device", "cpu", "--servers", pattern, "--rank",
                 "auto", "--workers", "auto", "--max-steps", "20", "--epochs", "1",
                 "--summary-json", str(tmp_path / ("w%d.json" % r))],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env))
        for w in workers:
            _, err = w.communicate(timeout=300)
            assert w.returncode == 0, err[-2000:]
        for r in range(2):
            s = json.load(open(tmp_path / ("w%d.json" % r)))
            assert (s["rank"], s["workers"], s["steps"]) == (r, 2, 20)
    finally:
        stop(procs)


def test_the_shard_comes_from_the_host_name(tmp_path):
    """In a UTS namespace named as a StatefulSet's third pod."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--uts", "true"]).returncode != 0:
        pytest.skip("cannot make a UTS namespace here (unshare --uts needs root)")
    procs = []
    try:
        start(procs, [unshare, "--uts", "sh", "-c", 'hostname psd-2 && exec "$@"', "sh",
                      psd_bin(), "--shards", "3", "--shard", "auto", "--listen",
                      "tcp://127.0.0.1:0"], {}, "psd", tmp_path)
    finally:
        stop(procs)
    log = procs[0].stderr.read()
    assert "shard 2 of 3" in log, log
