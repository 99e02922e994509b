#!/usr/bin/env python3
"""Several hosts: 2 psd shards and 2 psworkers, each in its own network
namespace with its own address on a bridge, with latency and loss on the
links. They train in BSP; the rank 0 accuracy must match a loopback run of
the same configuration and seed within half a point.

Latency and loss: `tc netem` (2 ms, 0.1%) on both ends of every link where
the kernel has sch_netem. Where it does not (the development VMs' kernel
is built without it), the same 2 ms each way comes from a delay relay in
the hub namespace that the workers reach the shards through (every chunk
it forwards is held 2 ms, in order, as netem holds packets), and the loss
from iptables' statistic match dropping 0.1% of each node's outgoing
packets. The test prints which one it used.

Needs root (ip netns, tc, iptables); exits 77 (skipped) where namespaces
cannot be made. Everything it creates is named after its pid and removed
at the end, also on failure."""
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from pstest import check, finish, poll, reap, spawn

PSD = os.environ["PSD_BIN"]
PSW = os.environ["PSWORKER_BIN"]
TAG = "ps%d" % (os.getpid() % 100000)
HUB = TAG + "hub"
NODES = ["s0", "s1", "w0", "w1"]
NETEM = os.environ.get("PSD_NETEM", "delay 2ms loss 0.1%").split()
DELAY_MS = float(os.environ.get("PSD_DELAY_MS", "2"))  # the same, where there is no netem
LOSS = 0.001
HUB_IP = "10.77.0.100"
TRAIN = ["--layers", "784,64,10", "--epochs", "1", "--batch", "32", "--lr", "0.05",
         "--device", "cpu", "--seed", "7"]
def sh(*args, ns=None):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(cmd), r.stderr.strip()))
    return r.stdout


def ns(node):
    return TAG + node


def make_network():
    """A hub namespace with a bridge; each node a namespace with a veth
    into it, address 10.77.0.N/24, netem on both ends of its link."""
    sh("ip", "netns", "add", HUB)
    sh("ip", "link", "add", "br0", "type", "bridge", ns=HUB)
    sh("ip", "link", "set", "br0", "up", ns=HUB)
    sh("ip", "link", "set", "lo", "up", ns=HUB)
    for i, node in enumerate(NODES):
        n = ns(node)
        sh("ip", "netns", "add", n)
        here, there = "v%s%s" % (TAG, node), "eth0"
        sh("ip", "link", "add", here, "netns", HUB, "type", "veth", "peer", "name", there,
           "netns", n)
        sh("ip", "link", "set", here, "master", "br0", ns=HUB)
        sh("ip", "link", "set", here, "up", ns=HUB)
        sh("ip", "addr", "add", "10.77.0.%d/24" % (i + 1), "dev", there, ns=n)
        sh("ip", "link", "set", there, "up", ns=n)
        sh("ip", "link", "set", "lo", "up", ns=n)
        if not add_netem(n, there) or not add_netem(HUB, here):
            sh("iptables", "-A", "OUTPUT", "-m", "statistic", "--mode", "random",
               "--probability", str(LOSS), "-j", "DROP", ns=n)
    sh("ip", "addr", "add", HUB_IP + "/24", "dev", "br0", ns=HUB)


def add_netem(netns, dev):
    """netem on dev's egress: 1 when the kernel has it."""
    r = subprocess.run(["ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", dev, "root",
                        "netem"] + NETEM, capture_output=True, text=True)
    return r.returncode == 0


def has_netem():
    return "netem" in sh("tc", "qdisc", "show", "dev", "eth0", ns=ns("w0"))


async def relay(reader, writer, delay):
    """Forwards what reader gets to writer, each chunk held `delay` s."""
    q = asyncio.Queue()

    async def pump():
        while True:
            at, data = await q.get()
            if data is None:
                writer.close()
                return
            wait = at + delay - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
    task = asyncio.ensure_future(pump())
    while True:
        data = await reader.read(1 << 16)
        q.put_nowait((time.monotonic(), data or None))
        if not data:
            break
    await task


async def delay_proxy(delay, out, targets):
    """Listens on HUB_IP, one port per target; writes the ports to out."""
    async def serve(target, r, w):
        host, port = target.rsplit(":", 1)
        tr, tw = await asyncio.open_connection(host, int(port))
        await asyncio.gather(relay(r, tw, delay), relay(tr, w, delay), return_exceptions=True)
    ports = []
    for t in targets:
        srv = await asyncio.start_server(lambda r, w, t=t: serve(t, r, w), HUB_IP, 0)
        ports.append(srv.sockets[0].getsockname()[1])
    with open(out + ".tmp", "w") as f:
        f.write(" ".join(map(str, ports)))
    os.rename(out + ".tmp", out)
    await asyncio.Event().wait()


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
    if addrs["via"] is not None:  # the delay relay, in the hub
        pf = os.path.join(tmp, name + "-proxy")
        p = spawn([sys.executable, os.path.abspath(__file__), "--delay-proxy", str(DELAY_MS), pf]
                  + [e[len("tcp://"):] for e in eps], os.path.join(tmp, name + "-proxy.log"),
                  addrs["via"])
        ports = wait_file(pf, p)
        if ports is None:
            check(False, "%s: the delay relay started" % name)
            return None
        eps = ["tcp://%s:%s" % (HUB_IP, port) for port in ports.split()]
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
    loop = {n: (None, "127.0.0.1") for n in NODES}
    loop["via"] = None
    base = run(tmp, "loopback", loop)
    hosts = {n: (ns(n), "10.77.0.%d" % (i + 1)) for i, n in enumerate(NODES)}
    netem = has_netem()
    hosts["via"] = None if netem else HUB
    how = ("tc netem " + " ".join(NETEM) if netem else
           "no sch_netem in this kernel: a %g ms delay relay each way and iptables dropping "
           "%g%% of packets" % (DELAY_MS, LOSS * 100))
    print("     links: " + how)
    multi = run(tmp, "netns", hosts)
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
        drops = sh("iptables", "-v", "-n", "-x", "-L", "OUTPUT", ns=ns("w0"))
        lost = sum(int(line.split()[0]) for line in drops.splitlines() if "statistic" in line)
        print("     packets dropped on w0's way out: %d" % lost)
        check("statistic" in drops, "the loss rule was on the worker's link")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--delay-proxy"]:
        asyncio.run(delay_proxy(float(sys.argv[2]) / 1e3, sys.argv[3], sys.argv[4:]))
        sys.exit(0)
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        print("needs root, ip and tc: skipped")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="pstest-netns.")
    try:
        try:
            make_network()
        except RuntimeError as e:
            print("cannot make the namespaces here (%s): skipped" % e)
            remove_network()
            sys.exit(77)
        main(tmp)
    finally:
        reap()
        remove_network()
    finish(tmp)
