"""A replica restarted from its own checkpoint rejoins without a state
transfer: its primary sends only the records made after that checkpoint,
from its backlog (psd --replica-backlog-mib). Trained against a real
etcd with 2 bsp workers: shard 0's backup, checkpointing every second,
is killed mid-run and started again with the same flags; it resumes, and
once its primary is killed too it serves the model of an unbroken run,
bit for bit. With a backlog too small for what was pushed meanwhile, the
primary says why (S0730) and sends the whole state instead."""
import os
import signal
import subprocess
import time

import pytest

from conftest import child_env, export, finish, free_port
from test_replicas import (BSP, clock, etcd, in_sync, kill, leader, same,  # noqa: F401
                           train, unbroken, until)


def launch(cluster, ep, shard, args, name):
    log = os.path.join(cluster.tmp, name)
    p = subprocess.Popen([os.environ["PSD_BIN"], "--listen", ep, "--shard", str(shard),
                          "--shards", "2"] + args, stdout=subprocess.DEVNULL,
                         stderr=open(log, "w"), env=child_env())
    p.log = log
    cluster.procs.append(p)
    return p


def text(p):
    return open(p.log).read()


@pytest.mark.parametrize("backlog_mib", [64, 1])
def test_a_restarted_backup_resumes_from_its_own_checkpoint(cluster, etcd, tmp_path, unbroken,
                                                            backlog_mib):
    if not os.environ.get("PSCTL_BIN"):
        pytest.skip("PSCTL_BIN is not set")
    eps = [["tcp://127.0.0.1:%d" % free_port() for _ in range(2)] for _ in range(2)]
    servers = ",".join("|".join(pair) for pair in eps)
    base = ["--etcd", etcd.url, "--replica-backlog-mib", str(backlog_mib)] + BSP
    procs = {}
    for i in range(2):
        procs[i, 0] = launch(cluster, eps[i][0], i, base + ["--replica-name", "p%d" % i],
                             "p%d.log" % i)
        until("shard %d's primary" % i, lambda: leader(etcd, i, 2).get("endpoint") == eps[i][0],
              cluster)
    # shard 0's backup keeps its own checkpoints; shard 1's is a plain one
    kept = ["--replica-name", "b0", "--checkpoint-dir", str(tmp_path / "b0"),
            "--checkpoint-every", "1", "--replica-of", eps[0][0]]
    procs[0, 1] = launch(cluster, eps[0][1], 0, base + kept, "b0.log")
    procs[1, 1] = launch(cluster, eps[1][1], 1, base + ["--replica-of", eps[1][0]], "b1.log")
    for i in range(2):
        until("shard %d in sync" % i, lambda: in_sync(etcd, i, 2, 2), cluster)
    workers = train(cluster, servers, tmp_path, "r", ["--test-delay-ms", "20"])
    until("training under way", lambda: clock(servers) >= 10, cluster)
    # a checkpoint of the backup's taken while it trains
    until("the backup checkpoints", lambda: "S0600" in text(procs[0, 1]), cluster)
    kill(cluster, procs[0, 1])
    until("the primary drops its backup", lambda: in_sync(etcd, 0, 2, 1), cluster)
    at = clock(servers)
    until("training goes on without it", lambda: clock(servers) >= at + 5, cluster)
    procs[0, 1] = launch(cluster, eps[0][1], 0, base + kept, "b0-again.log")
    until("the restarted backup in sync", lambda: in_sync(etcd, 0, 2, 2), cluster)
    primary, backup = text(procs[0, 0]), text(procs[0, 1])
    assert "S0610 restored" in backup, backup
    if backlog_mib == 64:
        assert "S0731 resuming from this replica's own state" in backup, backup
        assert "S0729 backup %s resumes from its own state" % eps[0][1] in primary, primary
        assert "S0730" not in primary and "S0714" not in backup, primary
        # the records pushed while it was down came from the backlog
        n = int(primary.split("S0729")[1].split(" records from the backlog")[0].split()[-1])
        assert n > 0, primary
    else:
        assert "S0730 backup %s holds a state of its own" % eps[0][1] in primary, primary
        assert "not" in primary.split("S0730")[1].split("\n")[0]  # which records it lacks
        assert "--replica-backlog-mib" in primary.split("S0730")[1].split("\n")[0]
        assert "S0714 state from" in backup and "S0731" not in backup, backup
    assert all(w.poll() is None for w in workers), "it rejoined after the run, not during it"
    # the primary killed: the restarted backup serves, and the run ends as
    # an unbroken one
    kill(cluster, procs[0, 0])
    until("the restarted backup takes over",
          lambda: leader(etcd, 0, 2).get("endpoint") == eps[0][1], cluster)
    finish(workers, tmp_path, "r")
    same(export(servers, tmp_path / "resumed.safetensors"), unbroken)
