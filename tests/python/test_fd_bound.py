"""psd at its file-descriptor limit: each connection takes a descriptor,
and past the limit ZeroMQ cannot accept one (it retries at once). psd
says so when its connections come near the limit (S0114), goes on
serving the workers it has, and accepts again once connections close.
psd raises its soft limit to the hard one at start (S0016 says how many);
here both are 64."""
import os
import re
import resource
import socket
import subprocess
import tempfile
import time

import numpy as np
import pytest

import psd
from conftest import child_env

DEADLINE_S = 30
LIMIT = 64


def wait_for(cond, what):
    end = time.monotonic() + DEADLINE_S
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("no %s within %d s" % (what, DEADLINE_S))
        time.sleep(0.02)


def test_connections_at_the_descriptor_limit():
    binary = os.environ.get("PSD_BIN")
    if not binary:
        pytest.skip("PSD_BIN is not set (run through meson test)")
    tmp = tempfile.mkdtemp(prefix="psd-fd-")
    ep_file, log_file = os.path.join(tmp, "ep"), os.path.join(tmp, "psd.log")

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))

    p = subprocess.Popen([binary, "--listen", "tcp://127.0.0.1:0", "--endpoint-file", ep_file,
                          "--no-local-ipc"], stdout=subprocess.DEVNULL,
                         stderr=open(log_file, "w"), env=child_env(), preexec_fn=limit)
    flood = []
    try:
        wait_for(lambda: os.path.exists(ep_file) and open(ep_file).read().strip(), "endpoint")
        ep = open(ep_file).read().strip()
        log = lambda: open(log_file).read()  # noqa: E731
        assert re.search(r"S0016 file descriptors: %d " % LIMIT, log()), log()
        with psd.Client(ep, rank=0, workers=2, timeout_ms=5000) as c:
            c.create_table("w", 16, lr=1.0)
            c.push("w", np.ones(16, np.float32)).wait()
            host, port = ep[len("tcp://"):].rsplit(":", 1)
            for _ in range(LIMIT + 16):  # past the limit
                flood.append(socket.create_connection((host, int(port)), timeout=5))
            wait_for(lambda: "S0114" in log(), "S0114 line")
            assert "at the file-descriptor limit (%d, ulimit -n, less" % LIMIT in log()
            # the worker it has is still served
            w = np.empty(16, np.float32)
            c.pull("w", w).wait()
            np.testing.assert_array_equal(w, -np.ones(16, np.float32))
            for s in flood:
                s.close()
            flood = []
            # and once they closed, a new worker gets in
            with psd.Client(ep, rank=1, workers=2, timeout_ms=10000) as d:
                d.create_table("w", 16, lr=1.0)
                d.pull("w", w).wait()
                np.testing.assert_array_equal(w, -np.ones(16, np.float32))
        assert p.poll() is None, log()
    finally:
        for s in flood:
            s.close()
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
