#!/usr/bin/env python3
"""A replicated shard split by the network: its primary cut off from its
backup and from one of two clients, while it still reaches etcd and the
other client. Each node is a network namespace on a bridge; the cut is
iptables DROP rules in the primary's namespace. Both clients push 1.0
into one table in a loop (asp, sgd with lr 1: each applied push takes 1
off the weight) and log each push the shard acknowledged, and by which
replica. Whichever side etcd lets win, the other never acknowledges a
write the winner does not hold: after the cut heals, the weight counts
at least every acknowledged push (at most those plus the pushes whose
fate the clients never learned), and only the winner acknowledged
pushes once the loser knew it had lost.

Needs root, ip, iptables, etcd and Debian's python3 with numpy; exits 77
(skipped) where namespaces cannot be made. Everything it creates is
named after its pid and removed at the end, also on failure."""
import base64
import json
import os
import shutil
import subprocess
import sys
import time

import pstest
from pstest import check, in_namespaces, poll

PSD = os.environ["PSD_BIN"]
PY = "/usr/bin/python3"
HERE = os.path.dirname(os.path.abspath(__file__))
TAG = "pp%d" % (os.getpid() % 100000)
HUB = TAG + "hub"
NODES = ["etcd", "a", "b", "c1", "c2"]
IP = {n: "10.78.0.%d" % (i + 1) for i, n in enumerate(NODES)}
ETCD = "http://%s:2379" % IP["etcd"]
EP = {n: "tcp://%s:5570" % IP[n] for n in ("a", "b")}


def plain_env():
    """For everything but the clients: without the sanitizer runtimes the
    test's Python was started with (an instrumented psd has its own)."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if "PSD_CHILD_ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] = env["PSD_CHILD_ASAN_OPTIONS"]
    return env


def python():
    """Debian's python3 for a client, with the sanitizer runtimes this test
    was started with (an instrumented libpsclient needs them first)."""
    keep = ["%s=%s" % (k, os.environ[k]) for k in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")
            if k in os.environ]
    return ["env"] + keep + [PY]


def spawn(args, log, netns):
    """args in netns, reaped by pstest.reap()."""
    p = subprocess.Popen(["ip", "netns", "exec", netns] + list(args), stdout=subprocess.DEVNULL,
                         stderr=open(log, "w"), env=plain_env())
    pstest.procs.append(p)
    return p


def sh(*args, ns=None):
    return pstest.sh(*args, ns=ns, env=plain_env())


def ns(node):
    return TAG + node


def make_network():
    pstest.bridge(HUB, [(ns(node), "v%s%s" % (TAG, node), IP[node] + "/24") for node in NODES],
                  sh)


def remove_network():
    for n in [ns(x) for x in NODES] + [HUB]:
        subprocess.run(["ip", "netns", "del", n], capture_output=True)


def etcd_get(key):
    r = subprocess.run(["ip", "netns", "exec", ns("etcd"), "curl", "-s", "-m", "2", "-X", "POST",
                        ETCD + "/v3/kv/range", "-d",
                        json.dumps({"key": base64.b64encode(key.encode()).decode()})],
                       capture_output=True, text=True, env=plain_env())
    try:
        kvs = json.loads(r.stdout).get("kvs", [])
    except ValueError:
        return None
    return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else None


def cut(on):
    """The primary's namespace drops what comes from, or goes to, the
    backup and client 2."""
    for peer in ("b", "c2"):
        for chain, flag in (("INPUT", "-s"), ("OUTPUT", "-d")):
            sh("iptables", "-A" if on else "-D", chain, flag, IP[peer], "-j", "DROP", ns=ns("a"))


def lines(path):
    return open(path).read().split("\n")[:-1] if os.path.exists(path) else []


def main(tmp):
    log = lambda name: os.path.join(tmp, name + ".log")  # noqa: E731
    spawn(["etcd", "--data-dir", os.path.join(tmp, "etcd"), "--listen-client-urls", ETCD,
           "--advertise-client-urls", ETCD, "--listen-peer-urls", "http://127.0.0.1:2380",
           "--heartbeat-interval", "50", "--election-timeout", "500"], log("etcd"), ns("etcd"))
    if not poll(lambda: etcd_get("/x") is None and "ready to serve client requests" in
                open(log("etcd")).read(), "etcd"):
        return
    base = ["--consistency", "asp", "--workers", "2", "--etcd", ETCD,
            "--replica-timeout-ms", "300"]
    spawn([PSD, "--listen", EP["a"]] + base, log("a"), ns("a"))
    if not poll(lambda: (etcd_get("/psd/shard-0-of-1/leader") or {}).get("endpoint") == EP["a"],
                "a primary"):
        return
    spawn([PSD, "--listen", EP["b"], "--replica-of", EP["a"]] + base, log("b"), ns("b"))
    if not poll(lambda: len((etcd_get("/psd/shard-0-of-1/insync") or {"members": []})
                            ["members"]) == 2, "the backup in sync"):
        return
    servers = EP["a"] + "|" + EP["b"]
    stop = os.path.join(tmp, "STOP")
    out = {c: os.path.join(tmp, c + ".out") for c in ("c1", "c2")}
    for r, c in enumerate(("c1", "c2")):
        spawn(python() + [os.path.join(HERE, "partition_client.py"), servers, str(r), out[c], stop],
              log(c), ns(c))
    if not poll(lambda: all(len(lines(out[c])) > 50 for c in out), "both clients pushing"):
        return
    cut(True)
    t_cut = time.time()
    print("     cut: %s from %s and %s" % (EP["a"], EP["b"], IP["c2"]))
    winner = None

    def decided():
        nonlocal winner
        lead = etcd_get("/psd/shard-0-of-1/leader") or {}
        sync = etcd_get("/psd/shard-0-of-1/insync") or {"members": []}
        if len(sync["members"]) == 1:
            winner = sync["members"][0].split("@", 1)[1]
            return lead.get("endpoint") == winner
        return False

    if not poll(decided, "etcd to settle on one primary"):
        cut(False)
        return
    print("     etcd's primary in the cut: " + winner)
    time.sleep(2)  # both sides keep pushing while cut off
    t_heal = time.time()
    cut(False)
    time.sleep(2)
    open(stop, "w").close()
    poll(lambda: all(p.poll() is not None for p in clients()), "the clients to stop", 30)
    acks = {c: [x.split() for x in lines(out[c]) if x.startswith("ok ")] for c in out}
    errs = sum(1 for c in out for x in lines(out[c]) if x.startswith("err "))
    total = sum(len(v) for v in acks.values())
    during = {x[1] for c in out for x in acks[c] if t_cut + 1.0 < float(x[2]) < t_heal}
    print("     acknowledged: c1 %d, c2 %d (%d refused or timed out); in the cut by %s"
          % (len(acks["c1"]), len(acks["c2"]), errs, ", ".join(sorted(during)) or "none"))
    check(during <= {winner}, "in the cut only etcd's primary acknowledged writes (%s)"
          % ", ".join(sorted(during)))
    check(len(during) == 1, "the shard went on taking writes in the cut")
    w = read_weight(servers, tmp)
    if w is None:
        return
    applied = int(round(-w))
    print("     the weight after the cut: %g (%d pushes applied)" % (w, applied))
    check(total <= applied <= total + errs,
          "every acknowledged push is in the model: %d acknowledged, %d applied, %d unknown"
          % (total, applied, errs))
    loser = EP["a"] if winner == EP["b"] else EP["b"]
    check("S0716" in open(log("a")).read() or winner == EP["a"],
          "a deposed primary said it stepped down")
    print("     %s lost; %s kept the shard" % (loser, winner))


def clients():
    return [p for p in pstest.procs if "partition_client.py" in " ".join(p.args)]


def read_weight(servers, tmp):
    r = subprocess.run(["ip", "netns", "exec", ns("c1")] + python() + ["-c",
                        "import sys; sys.path.insert(0, %r); import numpy as np, psd; "
                        "c = psd.Client(%r, timeout_ms=20000); c.create_table('w', 1, lr=1.0); "
                        "print(c.pull('w', np.zeros(1, np.float32)).wait()[0])"
                        % (os.path.join(HERE, "..", "..", "worker", "python"), servers)],
                       capture_output=True, text=True, env=plain_env(), timeout=60)
    check(r.returncode == 0, "the model can be read after the cut: " + r.stderr[-500:])
    return float(r.stdout.strip()) if r.returncode == 0 else None


if __name__ == "__main__":
    need = ("ip", "iptables", "etcd", "curl")
    if os.geteuid() != 0 or any(shutil.which(x) is None for x in need) or \
            not os.path.exists(PY):
        print("needs root, %s and %s: skipped" % (", ".join(need), PY))
        sys.exit(77)
    if subprocess.run([PY, "-c", "import numpy"], capture_output=True,
                      env=plain_env()).returncode != 0:
        print("needs numpy in %s: skipped" % PY)
        sys.exit(77)
    in_namespaces("partition", make_network, remove_network, main)
