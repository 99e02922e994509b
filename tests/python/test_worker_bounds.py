"""The bounds on how many workers a shard serves (server/README.md, "How
many workers"), each at the bound and one past it: --workers 4,096 starts
and 4,097 is refused at start, naming the flag; in bsp, worker id 4,095
(the last of --workers 4096) pushes and id 4,096 is refused with
PS_EINVAL naming the range, while psd goes on serving."""
import os
import subprocess

import numpy as np
import pytest

import psd
from conftest import child_env


def psd_bin():
    b = os.environ.get("PSD_BIN")
    if not b:
        pytest.skip("PSD_BIN is not set (run through meson test)")
    return b


def test_workers_past_the_bound_refused_at_start():
    r = subprocess.run([psd_bin(), "--listen", "tcp://127.0.0.1:0", "--workers", "4097"],
                       capture_output=True, text=True, env=child_env(), timeout=30)
    assert r.returncode != 0
    assert "--workers: '4097' is not a whole number in [1, 4096]" in r.stderr, r.stderr


def test_worker_ids_at_and_past_the_bound(cluster):
    servers = cluster.start(shards=1, args=["--consistency", "bsp", "--workers", "4096"])
    # observers create and read; the last worker id pushes one round of a
    # table only it pushes (pushers), so no other worker is waited for
    with psd.Client(servers, rank=4095, workers=4096, timeout_ms=10000) as last:
        last.create_table("w", 8, lr=1.0, pushers=[4095])
        last.push("w", np.ones(8, np.float32)).wait()
        w = np.empty(8, np.float32)
        last.pull("w", w).wait()
        np.testing.assert_array_equal(w, -np.ones(8, np.float32))
    # one past: the client checks rank < workers itself, so the id goes on
    # the wire from a client told there are more workers than psd has
    with psd.Client(servers, rank=4096, workers=4097, timeout_ms=10000) as past:
        past.create_table("v", 8, lr=1.0)
        with pytest.raises(psd.InvalidArgumentError) as e:
            past.push("v", np.ones(8, np.float32)).wait()
        assert "worker id 4096 is not in [0, 4096) (psd --workers 4096)" in str(e.value)
    assert all(p.poll() is None for p in cluster.procs), cluster.logs()
