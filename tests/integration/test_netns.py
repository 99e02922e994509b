#!/usr/bin/env python3
"""Several hosts: 2 psd shards and 2 psworkers, each in its own network
namespace with its own address on a bridge, with latency and loss on the
links. They train in BSP; the rank 0 accuracy must match a loopback run of
the same configuration and seed within half a point.

Latency and loss: `tc netem` (2 ms, 0.1%) on both ends of every link where
the kernel has sch_netem. Where it does not (the development VMs' kernel
is built without it), the same per-packet delay and loss come from
`netdelay` (tests/tools, libnetfilter_queue): an iptables NFQUEUE rule
hands each node's outgoing packets to it, and it holds each 2 ms and lets
it go in order, dropping 0.1% at random, as netem does. The test prints
which one it used, and how many packets netdelay held and dropped.

Needs root (ip netns, tc, iptables); exits 77 (skipped) where namespaces
cannot be made. Everything it creates is named after its pid and removed
at the end, also on failure."""
import json
import os
import shutil
import subprocess
import sys
import time

from pstest import bridge, check, in_namespaces, poll, sh, spawn

PSD = os.environ["PSD_BIN"]
PSW = os.environ["PSWORKER_BIN"]
TAG = "ps%d" % (os.getpid() % 100000)
HUB = TAG + "hub"
NODES = ["s0", "s1", "w0", "w1"]
NETEM = os.environ.get("PSD_NETEM", "delay 2ms loss 0.1%").split()
DELAY_MS = float(os.environ.get("PSD_DELAY_MS", "2"))  # the same, where there is no netem
NETDELAY = os.environ.get("NETDELAY_BIN")
LOSS = 0.001
TRAIN = ["--layers", "784,64,10", "--epochs", "1", "--batch", "32", "--lr", "0.05",
         "--device", "cpu", "--seed", "7"]


def ns(node):
    return TAG + node


def make_network():
    """A hub namespace with a bridge; each node a namespace with a veth
    into it, address 10.77.0.N/24, netem on both ends of its link."""
    links = [(ns(node), "v%s%s" % (TAG, node), "10.77.0.%d/24" % (i + 1))
             for i, node in enumerate(NODES)]
    bridge(HUB, links)
    for n, here, _ in links:
        add_netem(n, "eth0")
        add_netem(HUB, here)


def add_netem(netns, dev):
    """netem on dev's egress: 1 when the kernel has it."""
    r = subprocess.run(["ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", dev, "root",
                        "netem"] + NETEM, capture_output=True, text=True)
    return r.returncode == 0


def has_netem():
    return "netem" in sh("tc", "qdisc", "show", "dev", "eth0", ns=ns("w0"))


def start_netdelay(tmp):
    """Where there is no netem: each node's outgoing packets go through an
    NFQUEUE rule to a netdelay in its namespace (--queue-bypass: they pass
    if it is not there). Returns the netdelay processes and logs."""
    held = []
    for i, node in enumerate(NODES):
        n = ns(node)
        log = os.path.join(tmp, node + "-netdelay.log")
        p = spawn([NETDELAY, "--queue", "0", "--delay-ms", str(DELAY_MS), "--loss", str(LOSS),
                   "--seed", str(i + 1)], log, n)
        if not poll(lambda: p.poll() is not None or "ready" in open(log).read(), "netdelay"):
            raise RuntimeError("netdelay did not start in %s" % n)
        if p.poll() is not None:
            raise RuntimeError("netdelay: " + open(log).read().strip())
        sh("iptables", "-A", "OUTPUT", "-o", "eth0", "-j", "NFQUEUE", "--queue-num", "0",
           "--queue-bypass", ns=n)
        held.append((p, log))
    return held


def stop_netdelay(held):
    """Stops them; returns (packets, dropped) over all nodes."""
    packets = dropped = 0
    for p, log in held:
        p.terminate()
        p.wait(timeout=10)
        for line in open(log):
            if line.startswith("packets "):
                f = line.split()
                packets += int(f[1])
                dropped += int(f[3])
    return packets, dropped


def remove_network():
    for n in [ns(x) for x in NODES] + [HUB]:
        subprocess.run(["ip", "netns", "del", n], capture_output=True)


def wait_file(path, p):
    """The file's text once it exists; None if p exits first or past the
    deadline."""
    if not poll(lambda: os.path.exists(path) or p.poll() is not None, path):
        return None
    return open(path).read().strip() if os.path.exists(path) else None


def run(tmp, name, addrs):
    """2 shards + 2 workers, BSP; addrs: per node, (netns or None, IP).
    Returns (rank 0 summary, seconds) or None."""
    eps = []
    for i in (0, 1):
        netns, ip = addrs["s%d" % i]
        epf = os.path.join(tmp, "%s-ep%d" % (name, i))
        p = spawn([PSD, "--listen", "tcp://%s:0" % ip, "--endpoint-file", epf, "--shard", str(i),
                   "--shards", "2", "--workers", "2", "--consistency", "bsp"],
                  os.path.join(tmp, "%s-psd%d.log" % (name, i)), netns)
        ep = wait_file(epf, p)
        if ep is None:
            check(False, "%s: psd %d listening" % (name, i))
            return None
        eps.append(ep)
    t0 = time.monotonic()
    ws = []
    for r in (0, 1):
        netns, _ = addrs["w%d" % r]
        ws.append(spawn([PSW, "--servers", ",".join(eps), "--rank", str(r), "--workers", "2",
                         "--summary-json", os.path.join(tmp, "%s-w%d.json" % (name, r))] + TRAIN,
                        os.path.join(tmp, "%s-w%d.log" % (name, r)), netns))
    rcs = [w.wait(timeout=600) for w in ws]
    took = time.monotonic() - t0
    check(rcs == [0, 0], "%s: both workers finished (%s)" % (name, rcs))
    if rcs != [0, 0]:
        return None
    with open(os.path.join(tmp, "%s-w0.json" % name)) as f:
        return json.load(f), took


def main(tmp):
    netem = has_netem()
    if not netem and NETDELAY is None:
        print("no sch_netem in this kernel and no netdelay (libnetfilter_queue): skipped")
        sys.exit(77)
    loop = {n: (None, "127.0.0.1") for n in NODES}
    base = run(tmp, "loopback", loop)
    hosts = {n: (ns(n), "10.77.0.%d" % (i + 1)) for i, n in enumerate(NODES)}
    how = ("tc netem " + " ".join(NETEM) if netem else
           "no sch_netem in this kernel: netdelay holding every packet %g ms on its way out "
           "of each node and dropping %g%%" % (DELAY_MS, LOSS * 100))
    print("     links: " + how)
    try:
        held = [] if netem else start_netdelay(tmp)
    except RuntimeError as e:  # e.g. a kernel without nfnetlink_queue either
        print("cannot delay packets here (%s): skipped" % e)
        sys.exit(77)
    multi = run(tmp, "netns", hosts)
    packets, dropped = stop_netdelay(held)
    if base is None or multi is None:
        return
    a, b = base[0]["test_accuracy"], multi[0]["test_accuracy"]
    print("     loopback: accuracy %.4f in %.1f s; namespaces: accuracy %.4f in %.1f s"
          % (a, base[1], b, multi[1]))
    check(abs(a - b) <= 0.005, "same accuracy as on loopback within 0.5 points (%.4f vs %.4f)"
          % (a, b))
    check(b > 0.75, "it learned (accuracy %.4f)" % b)
    if netem:
        check("netem" in sh("tc", "-s", "qdisc", "show", "dev", "eth0", ns=ns("w0")),
              "netem was on the worker's link")
    else:
        print("     netdelay: %d packets held, %d dropped" % (packets, dropped))
        check(packets > 1000, "the packets went through netdelay (%d)" % packets)
        check(dropped > 0, "some were lost (%d)" % dropped)


if __name__ == "__main__":
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        print("needs root, ip and tc: skipped")
        sys.exit(77)
    in_namespaces("netns", make_network, remove_network, main)
