"""Replicas of a shard (psd --etcd, --replica-of) against a real etcd:
a primary killed mid-run loses no update and the run ends with the
model of an unbroken run, bit for bit; the same with a backup killed;
a killed replica restarted catches up while training goes on and can
serve the whole model; a primary cut off from its backup (stopped with
SIGSTOP, which its peers cannot tell from a partition) never
acknowledges a write once its backup has taken over; a primary that
loses etcd holds its replies and says why; a fourth backup is refused.
The network partition itself: tests/integration/test_partition.py."""
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request

import numpy as np
import pytest

import psd
from conftest import DATA, DEADLINE_S, child_env, export, finish, free_port, worker_bin

TRAIN = ["--device", "cpu", "--epochs", "1", "--batch", "256", "--lr", "0.05"]
BSP = ["--consistency", "bsp", "--workers", "2"]



class Etcd:
    """A one-member etcd on free ports whose leases may be 1 s long (its
    minimum lease is 1.5 election timeouts)."""

    def __init__(self, tmp):
        exe = shutil.which("etcd")
        if exe is None:
            pytest.skip("etcd is not installed (Debian's etcd-server)")
        client, peer = free_port(), free_port()
        self.url = "http://127.0.0.1:%d" % client
        self.log = open(os.path.join(tmp, "etcd.log"), "w")
        self.proc = subprocess.Popen(
            [exe, "--data-dir", os.path.join(tmp, "etcd"), "--listen-client-urls", self.url,
             "--advertise-client-urls", self.url, "--listen-peer-urls",
             "http://127.0.0.1:%d" % peer, "--heartbeat-interval", "50", "--election-timeout",
             "500"], stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1).read()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("etcd did not start")
                time.sleep(0.05)

    def get(self, key):
        req = urllib.request.Request(self.url + "/v3/kv/range", data=json.dumps(
            {"key": base64.b64encode(key.encode()).decode()}).encode())
        kvs = json.load(urllib.request.urlopen(req, timeout=5)).get("kvs", [])
        return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else None

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def etcd(tmp_path):
    e = Etcd(str(tmp_path))
    try:
        yield e
    finally:
        e.stop()


def start(cluster, shard, shards, args, listen="tcp://127.0.0.1:0"):
    """One psd replica, its endpoint read back; its process is reaped by
    the cluster fixture."""
    ep = os.path.join(cluster.tmp, "rep-ep%d" % len(cluster.procs))
    log = open(os.path.join(cluster.tmp, "rep%d.log" % len(cluster.procs)), "w")
    p = subprocess.Popen([os.environ["PSD_BIN"], "--listen", listen, "--endpoint-file", ep,
                          "--shard", str(shard), "--shards", str(shards)] + args,
                         stdout=subprocess.DEVNULL, stderr=log, env=child_env())
    cluster.procs.append(p)
    deadline = time.monotonic() + DEADLINE_S
    while not (os.path.exists(ep) and open(ep).read().strip()):
        assert p.poll() is None and time.monotonic() < deadline, cluster.logs()
        time.sleep(0.01)
    return p, open(ep).read().strip()


def kill(cluster, p, sig=signal.SIGKILL):
    p.send_signal(sig)
    p.wait(timeout=10)
    cluster.procs.remove(p)


def until(what, fn, cluster):
    deadline = time.monotonic() + DEADLINE_S
    while not fn():
        assert time.monotonic() < deadline, "%s: not within %d s\n%s" % (what, DEADLINE_S,
                                                                          cluster.logs())
        time.sleep(0.02)


def in_sync(etcd, shard, shards, n):
    v = etcd.get("/psd/shard-%d-of-%d/insync" % (shard, shards))
    return v is not None and len(v["members"]) == n


def leader(etcd, shard, shards):
    return etcd.get("/psd/shard-%d-of-%d/leader" % (shard, shards)) or {}


def replicated(cluster, etcd, shards, args):
    """shards primaries, a backup of each, all in sync; the --servers list
    and the processes [(primary, backup)]."""
    base = ["--etcd", etcd.url] + args
    groups, entries = [], []
    for i in range(shards):
        a, ea = start(cluster, i, shards, base)
        until("shard %d's primary" % i, lambda: leader(etcd, i, shards).get("endpoint") == ea,
              cluster)
        b, eb = start(cluster, i, shards, base + ["--replica-of", ea])
        until("shard %d in sync" % i, lambda: in_sync(etcd, i, shards, 2), cluster)
        groups.append(((a, ea), (b, eb)))
        entries.append(ea + "|" + eb)
    return ",".join(entries), groups


def train(cluster, servers, tmp, name, extra=()):
    """Two bsp psworkers (a shard of the data each), started."""
    procs = []
    for r in range(2):
        procs.append(subprocess.Popen(
            [worker_bin(), "--data", DATA, "--servers", servers, "--rank", str(r), "--workers",
             "2", "--timeout-ms", "60000"] + TRAIN + list(extra),
            stdout=subprocess.DEVNULL, stderr=open(str(tmp / ("%s%d.log" % (name, r))), "w"),
            env=child_env()))
    return procs




def worker_logs(tmp, name):
    return "".join(open(str(tmp / ("%s%d.log" % (name, r)))).read() for r in range(2))


def clock(servers):
    r = subprocess.run([os.environ["PSCTL_BIN"], "--servers", servers, "--json", "status"],
                       capture_output=True, text=True, env=child_env(), timeout=30)
    if r.returncode != 0:
        return 0
    clocks = [t["clock"] for sh in json.loads(r.stdout)["shards"] for t in sh.get("tables", [])]
    return min(clocks) if clocks else 0


@pytest.fixture
def unbroken(cluster, tmp_path):
    """The model two bsp workers train on 2 shards without replicas."""
    servers = cluster.start(shards=2, args=BSP)
    finish(train(cluster, servers, tmp_path, "u"), tmp_path, "u")
    return export(servers, tmp_path / "unbroken.safetensors")


def same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def test_primary_killed_mid_run_loses_nothing_and_a_restart_catches_up(cluster, etcd, tmp_path,
                                                                      unbroken):
    if not os.environ.get("PSCTL_BIN"):
        pytest.skip("PSCTL_BIN is not set")
    servers, groups = replicated(cluster, etcd, 2, BSP)
    workers = train(cluster, servers, tmp_path, "k", ["--test-delay-ms", "40"])
    until("training under way", lambda: clock(servers) >= 20, cluster)
    (a, ea), (b, eb) = groups[0]
    kill(cluster, a)
    until("the backup takes over", lambda: leader(etcd, 0, 2).get("endpoint") == eb, cluster)
    # the killed replica comes back on its port, as a backup of the new primary
    a2, _ = start(cluster, 0, 2, ["--etcd", etcd.url, "--replica-of", eb] + BSP, listen=ea)
    until("the restarted replica in sync", lambda: in_sync(etcd, 0, 2, 2), cluster)
    assert all(w.poll() is None for w in workers), "it caught up after the run, not during it"
    finish(workers, tmp_path, "k")
    assert "W0240 a shard's primary changed" in worker_logs(tmp_path, "k")
    same(export(servers, tmp_path / "after-kill.safetensors"), unbroken)
    # the restarted replica holds everything: alone, it serves the same model
    kill(cluster, b)
    until("the restarted replica takes over",
          lambda: leader(etcd, 0, 2).get("endpoint") == ea, cluster)
    same(export(servers, tmp_path / "restarted.safetensors"), unbroken)
    log = cluster.logs()
    assert "S0714 state from %s loaded" % eb in log
    assert "S0715 shard 0: this replica is the primary now, epoch 2" in log


def test_backup_killed_mid_run(cluster, etcd, tmp_path, unbroken):
    servers, groups = replicated(cluster, etcd, 2, BSP)
    workers = train(cluster, servers, tmp_path, "b", ["--test-delay-ms", "5"])
    until("training under way", lambda: clock(servers) >= 20, cluster)
    (_, ea), (b, eb) = groups[1]
    kill(cluster, b)
    until("the primary drops its backup", lambda: in_sync(etcd, 1, 2, 1), cluster)
    finish(workers, tmp_path, "b")
    same(export(servers, tmp_path / "after-backup.safetensors"), unbroken)
    assert "S0704 backup %s" % eb in cluster.logs()


def test_a_stopped_primary_never_acknowledges_once_replaced(cluster, etcd):
    args = ["--replica-timeout-ms", "200"]
    servers, groups = replicated(cluster, etcd, 1, args)
    (a, ea), (b, eb) = groups[0]
    old = psd.Client(ea, timeout_ms=3000)  # talks to the old primary only
    old.create_table("w", 4)
    old.push("w", np.ones(4, np.float32)).wait()
    a.send_signal(signal.SIGSTOP)  # to its backup and etcd, as if cut off
    try:
        until("the backup takes over", lambda: leader(etcd, 0, 1).get("endpoint") == eb,
              cluster)
        # another worker: worker 0 stays the old client's, bound to its connection
        with psd.Client(servers, rank=1, workers=2, timeout_ms=5000) as new:
            new.create_table("w", 4)
            new.push("w", np.full(4, 2, np.float32)).wait()
            h = old.push("w", np.full(4, 100, np.float32))  # queued for the old primary
            a.send_signal(signal.SIGCONT)
            with pytest.raises(psd.Error) as e:
                h.wait()
            assert "PS_ENOTPRIMARY" in str(e.value)
            got = new.pull("w", np.zeros(4, np.float32)).wait()
        # sgd, lr 0.01, from zeros: the pushes of 1 and 2 only, never the 100
        assert np.allclose(got, -0.03, rtol=0, atol=1e-6), got
    finally:
        a.send_signal(signal.SIGCONT)
        old.close()
    until("the old primary steps down", lambda: "S0716 shard 0: no longer primary" in
          cluster.logs(), cluster)


def test_a_primary_without_etcd_stops_answering_and_says_so(cluster, etcd):
    """etcd stopped: once its lease may have run out the primary holds
    every reply (it cannot know it is still primary) and logs why; etcd
    back, the write held is acknowledged, once, by whichever replica etcd
    then names."""
    servers, groups = replicated(cluster, etcd, 1, [])
    (a, ea), _ = groups[0]
    with psd.Client(servers, timeout_ms=20000) as c:
        c.create_table("w", 4)
        c.push("w", np.ones(4, np.float32)).wait()
        etcd.proc.send_signal(signal.SIGSTOP)
        try:
            until("the primary to say its lease may be gone",
                  lambda: re.search(r"S0717 lease not renewed: .* \(replies stop in -",
                                    cluster.logs()), cluster)
            h = c.push("w", np.full(4, 2, np.float32))
            with pytest.raises(psd.TimeoutError):
                h.wait(300)
        finally:
            etcd.proc.send_signal(signal.SIGCONT)
        h.wait()
        got = c.pull("w", np.zeros(4, np.float32)).wait()
    assert np.allclose(got, -0.03, rtol=0, atol=1e-6), got


def replica_metrics(cluster, log_name, want):
    """/metrics of the replica that logs to log_name (its port read from
    that log), polled until want(values) holds; values by metric name."""
    log = os.path.join(cluster.tmp, log_name)
    until("a metrics port in " + log_name,
          lambda: re.search(r"metrics on \S+ \(port (\d+)\)", open(log).read()), cluster)
    port = re.search(r"metrics on \S+ \(port (\d+)\)", open(log).read()).group(1)
    got = {}

    def read():
        text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=5).read()
        got.clear()
        for m in re.finditer(r"^(psd_replica_etcd_\w+) (\S+)$", text.decode(), re.M):
            got[m.group(1)] = float(m.group(2))
        return len(got) == 3 and want(got)
    until("the metrics wanted", read, cluster)
    return dict(got)


def test_a_primary_serves_on_while_etcd_is_stopped(cluster, etcd):
    """etcd stopped (SIGSTOP): the primary's lease renewals go on its
    loop and fail there, without holding it; pulls are answered all the
    while its lease is sure to hold; etcd back, it renews and goes on."""
    servers, groups = replicated(cluster, etcd, 1, ["--lease-ttl", "3", "--metrics-listen",
                                                    "127.0.0.1:0"])
    with psd.Client(servers, timeout_ms=20000) as c:
        c.create_table("w", 4)
        c.push("w", np.ones(4, np.float32)).wait()
        before = replica_metrics(cluster, "rep0.log",
                                 lambda m: m["psd_replica_etcd_calls_total"] > 0)
        etcd.proc.send_signal(signal.SIGSTOP)
        try:
            pulls, longest = 0, 0.0
            deadline = time.monotonic() + DEADLINE_S
            while "S0717 lease not renewed" not in cluster.logs():
                assert time.monotonic() < deadline, cluster.logs()
                t0 = time.perf_counter()
                c.pull("w", np.zeros(4, np.float32)).wait(5000)
                longest = max(longest, time.perf_counter() - t0)
                pulls += 1
            during = replica_metrics(
                cluster, "rep0.log",
                lambda m: m["psd_replica_etcd_failures_total"] >
                before["psd_replica_etcd_failures_total"])
        finally:
            etcd.proc.send_signal(signal.SIGCONT)
        print("etcd stopped: %d pulls answered, the longest in %.1f ms" % (pulls, longest * 1e3))
        assert pulls > 0
        # renewals were made, and failed, and none held the loop
        assert during["psd_replica_etcd_blocking_calls_total"] == \
            before["psd_replica_etcd_blocking_calls_total"], (before, during)
        calls = during["psd_replica_etcd_calls_total"]
        replica_metrics(cluster, "rep0.log",
                        lambda m: m["psd_replica_etcd_calls_total"] > calls + 1 and
                        m["psd_replica_etcd_failures_total"] ==
                        during["psd_replica_etcd_failures_total"])
        c.push("w", np.ones(4, np.float32)).wait()
        got = c.pull("w", np.zeros(4, np.float32)).wait()
    assert np.allclose(got, -0.02, rtol=0, atol=1e-6), got
    assert "S0716" not in cluster.logs()


def http(port, path):
    """GET path on 127.0.0.1:port: (status, body)."""
    try:
        r = urllib.request.urlopen("http://127.0.0.1:%s%s" % (port, path), timeout=5)
        return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metrics_port(cluster, log_name):
    log = os.path.join(cluster.tmp, log_name)
    until("a metrics port in " + log_name,
          lambda: re.search(r"metrics on \S+ \(port (\d+)\)", open(log).read()), cluster)
    return re.search(r"metrics on \S+ \(port (\d+)\)", open(log).read()).group(1)


def test_a_replica_name_is_one_process_and_the_same_replica_after_a_restart(cluster, etcd):
    """--replica-name: a stable id (the in-sync set lists the same id
    after a restart), held in etcd while the process runs; a second
    process claiming it waits for the holder's lease, and is refused by
    name when the holder runs on; a killed holder's name is free once its
    lease runs out. /readyz: the primary and a backup holding its state
    are ready, a replica still waiting for its name is not."""
    m = ["--metrics-listen", "127.0.0.1:0"]
    base = ["--etcd", etcd.url]
    a, ea = start(cluster, 0, 1, base + ["--replica-name", "psd-0"] + m)
    until("the primary", lambda: leader(etcd, 0, 1).get("endpoint") == ea, cluster)
    b, eb = start(cluster, 0, 1, base + ["--replica-name", "psd-1", "--replica-of", ea] + m)
    until("in sync", lambda: in_sync(etcd, 0, 1, 2), cluster)
    members = etcd.get("/psd/shard-0-of-1/insync")["members"]
    assert etcd.get("/psd/shard-0-of-1/member-psd-1")["endpoint"] == eb
    pa, pb = metrics_port(cluster, "rep0.log"), metrics_port(cluster, "rep1.log")
    until("both ready", lambda: http(pa, "/readyz")[0] == 200 and http(pb, "/readyz")[0] == 200,
          cluster)
    assert "primary of shard 0" in http(pa, "/readyz")[1]
    assert "backup of shard 0" in http(pb, "/readyz")[1]
    # a second process under psd-1's name, while psd-1 runs: not ready while
    # it waits for the name, then refused
    log = os.path.join(cluster.tmp, "dup.log")
    dup = subprocess.Popen([os.environ["PSD_BIN"], "--listen", "tcp://127.0.0.1:0", "--shard",
                            "0", "--shards", "1", "--etcd", etcd.url, "--replica-name",
                            "psd-1"] + m, stdout=subprocess.DEVNULL, stderr=open(log, "w"),
                           env=child_env())
    cluster.procs.append(dup)
    until("the second process waits for the name", lambda: "S0727" in open(log).read(), cluster)
    status = http(metrics_port(cluster, "dup.log"), "/readyz")
    assert status[0] == 503 and "not ready: starting" in status[1], status
    assert dup.wait(timeout=DEADLINE_S) == 2, open(log).read()
    cluster.procs.remove(dup)
    text = open(log).read()
    assert "S0726 --replica-name psd-1 is held by the process at " + eb in text, text
    assert in_sync(etcd, 0, 1, 2)  # the running one goes on
    # psd-1 killed and started again: the same replica, once its lease ran out
    kill(cluster, b)
    log2 = os.path.join(cluster.tmp, "again.log")
    b2 = subprocess.Popen([os.environ["PSD_BIN"], "--listen", eb, "--shard", "0", "--shards",
                           "1"] + base + ["--replica-name", "psd-1", "--replica-of", ea] + m,
                          stdout=subprocess.DEVNULL, stderr=open(log2, "w"), env=child_env())
    cluster.procs.append(b2)
    until("the restart waits for its name",
          lambda: "S0727 --replica-name psd-1 is held by " + eb in open(log2).read(), cluster)
    until("the restarted replica in sync", lambda: "S0714" in open(log2).read() and
          in_sync(etcd, 0, 1, 2), cluster)
    assert etcd.get("/psd/shard-0-of-1/insync")["members"] == members  # the same id
    until("the restarted replica ready",
          lambda: http(metrics_port(cluster, "again.log"), "/readyz")[0] == 200, cluster)


@pytest.mark.parametrize("etcd_flag, shard", [(False, None), (True, 1)])
def test_shard_auto_with_etcd_is_the_ordinal_mod_shards(tmp_path, etcd_flag, shard):
    """Pod ordinal 3 of a 2-shard cluster: a plain psd refuses it; with
    --etcd it is shard 3 mod 2 = 1 (its second replica)."""
    env = dict(child_env(), PSD_SHARD="3")
    args = [os.environ["PSD_BIN"], "--listen", "tcp://127.0.0.1:0", "--shard", "auto",
            "--shards", "2", "--endpoint-file", str(tmp_path / "ep")]
    if etcd_flag:
        args += ["--etcd", "http://127.0.0.1:%d" % free_port()]  # nobody answers: no matter
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                         text=True)
    try:
        if shard is None:
            err = p.communicate(timeout=DEADLINE_S)[1]
            assert p.returncode == 2 and "--shard auto" in err, err
            return
        deadline = time.monotonic() + DEADLINE_S
        while not (tmp_path / "ep").exists():
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        if p.poll() is None:
            p.terminate()
    err = p.communicate(timeout=DEADLINE_S)[1]
    assert "shard %d of 2 listening" % shard in err, err


def keys(path):
    """psd --keygen's pair at path: {"public": ..., "secret": ...}."""
    r = subprocess.run([os.environ["PSD_BIN"], "--keygen", path], capture_output=True,
                       text=True, env=child_env(), timeout=30)
    assert r.returncode == 0, r.stderr
    return dict(line.split(": ", 1) for line in open(path).read().splitlines())


def test_replicas_under_curve(cluster, etcd, tmp_path):
    """The replicas of a shard hold its one key pair: a backup follows
    with it, and a worker's admitted key may not follow (it would read
    the whole shard)."""
    server, worker = keys(str(tmp_path / "server")), keys(str(tmp_path / "worker"))
    allow = tmp_path / "allow"
    allow.mkdir()
    shutil.copy(str(tmp_path / "worker.pub"), str(allow / "worker.pub"))
    admin = keys(str(tmp_path / "admin"))  # may ask for psctl recover
    with open(str(allow / "admin.pub"), "w") as f:
        f.write(open(str(tmp_path / "admin.pub")).read() + "admin: yes\n")
    curve = ["--curve-secret", str(tmp_path / "server"), "--curve-allow", str(allow)]
    servers, groups = replicated(cluster, etcd, 1, curve)
    (a, ea), (b, eb) = groups[0]
    kw = dict(curve_server_key=server["public"], curve_keypair=(worker["public"],
                                                                 worker["secret"]))
    with psd.Client(servers, timeout_ms=10000, **kw) as c:
        c.create_table("w", 4)
        c.push("w", np.ones(4, np.float32)).wait()
        kill(cluster, a)
        until("the backup takes over", lambda: leader(etcd, 0, 1).get("endpoint") == eb, cluster)
        c.push("w", np.ones(4, np.float32)).wait()
        got = c.pull("w", np.zeros(4, np.float32)).wait()
    assert np.allclose(got, -0.02, rtol=0, atol=1e-6), got
    assert "admitted CURVE client %s" % server["public"] in cluster.logs()
    # a worker's key asks to follow: refused, named
    zmq = pytest.importorskip("zmq")

    def ask(who, header):
        """One raw request under key pair who to eb: its reply."""
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.curve_serverkey, s.curve_publickey, s.curve_secretkey = (
            server["public"].encode(), who["public"].encode(), who["secret"].encode())
        s.connect(eb)
        s.send(header)
        assert s.poll(10000), "no answer"
        reply = s.recv()
        s.close()
        ctx.term()
        return reply

    ep = b"tcp://127.0.0.1:1"
    # ps.Header: version 1, op OP_FOLLOW (12), detail (22), instance (25)
    reply = ask(worker, b"\x08\x01\x10\x0c\xb2\x01" + bytes([len(ep)]) + ep + b"\xc8\x01\x07")
    assert b"only this shard's own CURVE key may follow" in reply, reply
    # psctl recover's request: only a key with "admin: yes" may ask (and
    # a primary has nothing to recover)
    for who, want in ((worker, b"only a key with"), (admin, b"nothing to recover")):
        reply = ask(who, b"\x08\x01\x10\x0f\x18\x07")  # version 1, OP_RECOVER (15), request 7
        assert want in reply, reply


@pytest.mark.parametrize("line,ok", [("admin: yes", True), ("admin: no", True),
                                     ("admin: maybe", False), ("admin:", False)])
def test_admin_lines_are_checked(tmp_path, line, ok):
    """An allow file's "admin:" line is yes or no; anything else keeps psd
    from starting, naming the file."""
    keys(str(tmp_path / "server"))
    keys(str(tmp_path / "admin"))
    allow = tmp_path / "allow"
    allow.mkdir()
    with open(str(allow / "admin.pub"), "w") as f:
        f.write(open(str(tmp_path / "admin.pub")).read() + line + "\n")
    p = subprocess.Popen([os.environ["PSD_BIN"], "--listen", "tcp://127.0.0.1:0",
                          "--curve-secret", str(tmp_path / "server"), "--curve-allow",
                          str(allow)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env=child_env())
    try:
        if ok:  # starts and serves (S0010, after its signal handlers): stopped again
            line = p.stderr.readline()
            while line and "S0010" not in line:
                line = p.stderr.readline()
            assert line and p.poll() is None
            p.send_signal(signal.SIGTERM)
        err = p.communicate(timeout=30)[1]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    if ok:
        assert p.returncode == 0, err
    else:
        assert p.returncode != 0 and "'admin:' takes yes or no" in err, err


def test_at_most_three_backups_follow(cluster, etcd):
    """PSD_BACKUPS_MAX (PS_REPLICAS_MAX - 1): a fourth backup is refused
    and named, and the three keep the shard in sync."""
    base = ["--etcd", etcd.url]
    a, ea = start(cluster, 0, 1, base)
    until("the primary", lambda: leader(etcd, 0, 1).get("endpoint") == ea, cluster)
    for n in range(3):
        start(cluster, 0, 1, base + ["--replica-of", ea])
        until("backup %d in sync" % (n + 1), lambda: in_sync(etcd, 0, 1, n + 2), cluster)
    _, e4 = start(cluster, 0, 1, base + ["--replica-of", ea])
    until("the fourth refused", lambda: "S0707 %s asked to follow, but 3 backups" % e4 in
          cluster.logs(), cluster)
    assert in_sync(etcd, 0, 1, 4)
    r = subprocess.run([os.environ["PSCTL_BIN"], "--servers", ea, "--json", "status"],
                       capture_output=True, text=True, env=child_env(), timeout=30)
    sh = json.loads(r.stdout)["shards"][0]
    assert sh["role"] == "primary" and len(sh["backups"]) == 3, sh
    assert all(b["in_sync"] for b in sh["backups"]) and e4 not in str(sh["backups"])


@pytest.mark.parametrize("argv, text", [
    (["--replica-of", "tcp://127.0.0.1:1"], "--replica-of needs --etcd"),
    (["--etcd", "ftp://x"], "is not http://HOST:PORT"),
    (["--etcd", "http://127.0.0.1:1", "--listen", "tcp://0.0.0.0:0"], "--advertise"),
    (["--etcd", "http://127.0.0.1:1", "--replica-of", "tcp://h"], "--replica-of"),
])
def test_flag_errors_are_named(argv, text):
    psd_bin = os.environ.get("PSD_BIN")
    if not psd_bin:
        pytest.skip("PSD_BIN is not set")
    r = subprocess.run([psd_bin] + argv, capture_output=True, text=True, env=child_env(),
                       timeout=30)
    assert r.returncode == 2 and text in r.stderr, r.stderr


@pytest.mark.parametrize("servers, text", [
    ("tcp://a:1|tcp://b:2|tcp://c:3|tcp://d:4|tcp://e:5", "more than 4 replicas"),
    ("tcp://a:1||tcp://b:2", "empty endpoint"),
    ("tcp://a:1|tcp://b", "tcp://HOST:PORT"),
])
def test_replica_lists_are_checked(servers, text):
    with pytest.raises(ValueError) as e:
        psd.Client(servers)
    assert text in str(e.value)


def test_a_primary_killed_while_rows_are_evicted(cluster, etcd, tmp_path):
    """Sparse rows under a budget, evicting and admitting on every push: a
    primary killed mid-run, the backup takes over, and the table ends
    bit for bit as a run without replicas ends (one worker: its pushes'
    order is the same in both)."""
    gen, psctl = os.environ.get("GEN_CLICKS_BIN"), os.environ.get("PSCTL_BIN")
    if not gen or not psctl or not os.environ.get("PSWORKER_BIN"):
        pytest.skip("GEN_CLICKS_BIN, PSWORKER_BIN and PSCTL_BIN are needed")
    data = tmp_path / "clicks"
    subprocess.run([gen, "--out", str(data), "--train", "100000", "--test", "5000",
                    "--features", "20000", "--active", "8", "--alpha", "1.3", "--seed", "5"],
                   check=True, capture_output=True, env=child_env())
    args = ["--consistency", "asp", "--workers", "1"]

    def run(servers, name, delay):
        return subprocess.Popen(
            [os.environ["PSWORKER_BIN"], "--model", "sparse-lr", "--data", str(data),
             "--servers", servers, "--workers", "1", "--optimizer", "adagrad", "--lr", "0.2",
             "--batch", "128", "--epochs", "1", "--device", "cpu", "--rows-max", "1500",
             "--evict-at-budget", "--admit-after", "2", "--evict-after", "300",
             "--timeout-ms", "60000", "--test-delay-ms", str(delay)],
            stdout=subprocess.DEVNULL, stderr=open(str(tmp_path / (name + ".log")), "w"),
            env=child_env())

    def evicted(servers):
        r = subprocess.run([psctl, "--servers", servers, "--json", "status"],
                           capture_output=True, text=True, env=child_env(), timeout=30)
        if r.returncode != 0:
            return 0
        return sum(t["evicted_budget"] + t["evicted_age"]
                   for sh in json.loads(r.stdout)["shards"] for t in sh.get("tables", []))

    servers = cluster.start(shards=2, args=args)
    finish([run(servers, "u0", 0)], tmp_path, "u")
    unbroken = export(servers, tmp_path / "unbroken.safetensors")
    assert evicted(servers) > 1000
    servers, groups = replicated(cluster, etcd, 2, args)
    w = run(servers, "k0", 3)
    until("rows evicted", lambda: evicted(servers) > 300, cluster)
    (a, ea), (b, eb) = groups[0]
    kill(cluster, a)
    until("the backup takes over", lambda: leader(etcd, 0, 2).get("endpoint") == eb, cluster)
    assert w.poll() is None, "the run ended before the kill"
    finish([w], tmp_path, "k")
    same(export(servers, tmp_path / "after-kill.safetensors"), unbroken)


def test_rows_evicted_by_time_go_on_the_backup_too(cluster, etcd, tmp_path):
    """evict_after_s: the primary alone reads the clock, and sends its age
    floor to the backup as a record. Rows pushed once, then hot rows
    pushed until the primary evicted the old ones for age; the primary
    is killed, and the backup that takes over holds the same table, bit
    for bit: the old rows gone there too (a backup deciding nothing by
    itself would still hold them)."""
    servers, groups = replicated(cluster, etcd, 1, ["--consistency", "asp", "--workers", "1"])
    (a, ea), (b, eb) = groups[0]
    old = np.arange(100, dtype=np.uint64)
    hot = np.arange(1000, 1010, dtype=np.uint64)

    def status():
        r = subprocess.run([os.environ["PSCTL_BIN"], "--servers", servers, "--json", "status"],
                           capture_output=True, text=True, env=child_env(), timeout=30)
        assert r.returncode == 0, r.stderr
        return [t for sh in json.loads(r.stdout)["shards"] for t in sh["tables"]
                if t["name"] == "t"][0]

    with psd.Client(servers) as c:
        c.create_sparse_table("t", 4, "sgd", lr=0.5, rows_max=1000, evict_after_s=1)
        c.push_rows("t", old, np.ones((old.size, 4), np.float32)).wait()
        deadline = time.monotonic() + DEADLINE_S
        while status()["evicted_age"] < old.size:  # the hot rows stay
            assert time.monotonic() < deadline, "no rows evicted for age: " + cluster.logs()
            c.push_rows("t", hot, np.ones((hot.size, 4), np.float32)).wait()
            time.sleep(0.05)
    st = status()
    assert st["rows"] == hot.size and st["evicted_age"] == old.size, st
    before = export(servers, tmp_path / "primary.safetensors")
    assert sorted(before["t.keys"].tolist()) == hot.tolist()
    kill(cluster, a)
    until("the backup takes over", lambda: leader(etcd, 0, 1).get("endpoint") == eb, cluster)
    same(export(servers, tmp_path / "backup.safetensors"), before)
    assert status()["evicted_age"] == old.size


def test_a_backup_without_its_primary_state_writes_no_checkpoint(cluster, etcd, tmp_path):
    """A backup that asked its primary for the state and has not loaded it
    (the primary stopped with SIGSTOP before it joined) holds nothing its
    directory should keep: stopped, it writes no checkpoint there (one
    would be the newest, in front of any better one), and says so."""
    a, ea = start(cluster, 0, 1, ["--etcd", etcd.url])
    until("a primary", lambda: leader(etcd, 0, 1).get("endpoint") == ea, cluster)
    with psd.Client(ea) as c:
        c.create_table("t", 16, "sgd", lr=0.5)
        c.push("t", np.ones(16, np.float32)).wait()
    a.send_signal(signal.SIGSTOP)
    try:
        log = os.path.join(cluster.tmp, "rep%d.log" % len(cluster.procs))
        ck = tmp_path / "backup-ck"
        b, _ = start(cluster, 0, 1, ["--etcd", etcd.url, "--replica-of", ea, "--checkpoint-dir",
                                     str(ck)])
        until("the backup follows", lambda: "S0711" in open(log).read(), cluster)
        kill(cluster, b, signal.SIGTERM)
        assert b.returncode == 0
        text = open(log).read()
        assert "S0608" in text, text[-2000:]
        assert [f for f in os.listdir(ck) if f.endswith(".safetensors")] == [], os.listdir(ck)
    finally:
        a.send_signal(signal.SIGCONT)


def test_a_replicated_cluster_stopped_mid_round_restarts_on_its_own(cluster, etcd, tmp_path,
                                                                     unbroken):
    """2 shards x 2 replicas with checkpoint directories, 2 bsp workers:
    SIGTERM every psd mid-round, start each again with the same flags.
    Each primary serves until its round ends, checkpoints and records the
    clean stop in etcd; each backup follows it to its last record and
    checkpoints the same state; after the restart a replica whose
    checkpoint holds that state takes over (no etcd command is run), the
    other resumes from its own checkpoint without a state transfer, and
    the run ends with the unbroken run's model, bit for bit."""
    if not os.environ.get("PSCTL_BIN"):
        pytest.skip("PSCTL_BIN is not set")
    ports = [[free_port(), free_port()] for _ in range(2)]
    eps = [["tcp://127.0.0.1:%d" % p for p in pair] for pair in ports]
    servers = ",".join("|".join(pair) for pair in eps)
    logs = []

    def launch(i, j):
        args = ["--etcd", etcd.url, "--checkpoint-dir", str(tmp_path / ("ck%d%d" % (i, j))),
                "--checkpoint-every", "0"] + BSP + (["--replica-of", eps[i][0]] if j else [])
        log = os.path.join(cluster.tmp, "stop%d%d-%d.log" % (i, j, len(logs)))
        p = subprocess.Popen([os.environ["PSD_BIN"], "--listen", eps[i][j], "--shard", str(i),
                              "--shards", "2"] + args, stdout=subprocess.DEVNULL,
                             stderr=open(log, "w"), env=child_env())
        p.log = log
        logs.append(log)
        cluster.procs.append(p)
        return p

    procs = []
    for i in range(2):
        procs.append(launch(i, 0))
        until("shard %d's primary" % i, lambda: leader(etcd, i, 2).get("endpoint") == eps[i][0],
              cluster)
        procs.append(launch(i, 1))
        until("shard %d in sync" % i, lambda: in_sync(etcd, i, 2, 2), cluster)
    workers = train(cluster, servers, tmp_path, "s", ["--test-delay-ms", "30", "--retry-ms", "300"])
    until("training under way", lambda: clock(servers) >= 20, cluster)
    # mid-round: worker 1 stopped, so worker 0's pulls wait for its pushes
    workers[1].send_signal(signal.SIGSTOP)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:  # each primary stops between rounds or waits for the end
        until("a replica stops or waits", lambda: p.poll() is not None or any(
            i in open(p.log).read() for i in ("S0605", "S0722")), cluster)
    # stopped past the clients' silence limit (1 s): both workers probe the
    # primaries before the round ends
    time.sleep(1.5)
    workers[1].send_signal(signal.SIGCONT)  # its pushes end the round
    for p in procs:
        assert p.wait(timeout=60) == 0, open(p.log).read()[-3000:]
        cluster.procs.remove(p)
    text = [open(p.log).read() for p in procs]
    for i in range(2):
        primary, backup = text[2 * i], text[2 * i + 1]
        assert "S0720 shard %d stopped cleanly" % i in primary, primary[-3000:]
        assert "S0600" in primary and "shutdown" in primary, primary[-3000:]
        assert "S0722" in backup and "S0600" in backup, backup[-3000:]
        for t in (primary, backup):
            assert "S0603" not in t and "S0607" not in t, t[-3000:]
        stopped = etcd.get("/psd/shard-%d-of-2/insync" % i)["stopped"]
        assert stopped["seq"] > 0, stopped
    assert all(w.poll() is None for w in workers), "the run ended before the stop"
    procs = [launch(i, j) for i in range(2) for j in range(2)]  # the same flags
    until("a primary of each shard again", lambda: all(
        leader(etcd, i, 2).get("endpoint") in eps[i] for i in range(2)), cluster)
    finish(workers, tmp_path, "s")
    same(export(servers, tmp_path / "restarted.safetensors"), unbroken)
    text = "".join(open(p.log).read() for p in procs)
    for i in range(2):
        assert "S0723 shard %d stopped cleanly" % i in text, text[-4000:]
        assert "stopped" not in etcd.get("/psd/shard-%d-of-2/insync" % i)  # consumed
    # the other replica of each shard holds the state the new epoch began
    # from: it resumes, no state transfer
    assert text.count("S0731 resuming from this replica's own state") == 2, text[-4000:]
    assert "S0706" not in text and "S0714" not in text, text[-4000:]


def test_every_member_killed_psctl_recover_names_what_each_lacks(cluster, etcd, tmp_path):
    """1 shard x 2 replicas, each with a checkpoint directory. The backup
    stops (its checkpoint: the first push), the primary checkpoints the
    second push and acknowledges a third, and is killed with kill -9.
    Started again, neither replica may take over (S0718): etcd's in-sync
    set names the dead process. psctl recover asks both, names each
    candidate's checkpoint, has the newer take over (S0725) and says what
    is lost; the shard serves the second push's weights."""
    psctl = os.environ.get("PSCTL_BIN")
    if not psctl:
        pytest.skip("PSCTL_BIN is not set")
    eps = ["tcp://127.0.0.1:%d" % free_port() for _ in range(2)]
    servers = "|".join(eps)
    logs = []

    def launch(j, extra=()):
        log = os.path.join(cluster.tmp, "rec%d-%d.log" % (j, len(logs)))
        p = subprocess.Popen([os.environ["PSD_BIN"], "--listen", eps[j], "--shard", "0",
                              "--shards", "1", "--etcd", etcd.url, "--checkpoint-dir",
                              str(tmp_path / ("ck%d" % j)), "--checkpoint-every", "0",
                              "--stop-timeout-ms", "0"] + list(extra),
                             stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=child_env())
        p.log = log
        logs.append(log)
        cluster.procs.append(p)
        return p

    a = launch(0)
    until("a primary", lambda: leader(etcd, 0, 1).get("endpoint") == eps[0], cluster)
    b = launch(1, ["--replica-of", eps[0]])
    until("in sync", lambda: in_sync(etcd, 0, 1, 2), cluster)
    one = np.ones(16, np.float32)
    with psd.Client(servers) as c:
        c.create_table("t", 16, "sgd", lr=0.5)
        c.push("t", one).wait()
        kill(cluster, b, signal.SIGTERM)  # its checkpoint holds the first push
        assert "S0600" in open(b.log).read()
        until("the backup dropped", lambda: in_sync(etcd, 0, 1, 1), cluster)
        c.push("t", one).wait()
        r = subprocess.run([psctl, "--servers", eps[0], "checkpoint"], capture_output=True,
                           text=True, env=child_env(), timeout=30)
        assert r.returncode == 0, r.stderr
        c.push("t", one).wait()  # acknowledged, in no checkpoint
    kill(cluster, a)
    a, b = launch(0), launch(1)
    for p in (a, b):
        until("S0718", lambda: "S0718" in open(p.log).read(), cluster)
    r = subprocess.run([psctl, "--servers", servers, "--timeout-ms", "5000", "recover"],
                       capture_output=True, text=True, env=child_env(), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "candidates:" in out and eps[0] in out and eps[1] in out, out
    ckpt = {ep: re.search(re.escape(ep) + r"  checkpoint at epoch (\d+) record (\d+)", out)
            for ep in eps}
    assert all(ckpt.values()), out
    # the backup's holds the first push only, the primary's the second too
    assert int(ckpt[eps[1]].group(2)) < int(ckpt[eps[0]].group(2)), out
    assert re.search(re.escape(eps[0]) + r".*chosen", out), out
    assert "lost: what the in-sync set" in out, out
    until("the recovered primary", lambda: leader(etcd, 0, 1).get("endpoint") == eps[0], cluster)
    assert "S0725" in open(a.log).read()
    with psd.Client(servers) as c:
        c.create_table("t", 16, "sgd", lr=0.5)  # the same spec: opens it
        got = c.pull("t", np.zeros(16, np.float32)).wait()
        np.testing.assert_array_equal(got, np.full(16, -1.0, np.float32))
    # asked again, there is nothing to recover
    r = subprocess.run([psctl, "--servers", servers, "recover"], capture_output=True, text=True,
                       env=child_env(), timeout=60)
    assert r.returncode == 0 and "nothing to recover" in r.stdout, r.stdout + r.stderr
