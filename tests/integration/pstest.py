"""What the Python integration tests share: named checks, polling under a
deadline, processes that are always reaped, and the end of a test (logs
shown on failure, one verdict line, the exit status)."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

failures = []
procs = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def poll(fn, what, timeout=30.0):
    """fn() until it returns something true, under a deadline; giving up
    is a failed check (a test that returns early still fails)."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() >= deadline:
            if not v:
                check(False, "gave up waiting for " + what)
            return v
        time.sleep(0.02)


def spawn(args, log, netns=None):
    """Starts args (in network namespace netns), stderr to log; reaped by
    reap()."""
    cmd = (["ip", "netns", "exec", netns] if netns else []) + list(args)
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    procs.append(p)
    return p


def reap():
    """SIGTERM to every process still running, SIGKILL to those that do not
    go within 10 s."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def sh(*args, ns=None, env=None):
    """A command (in network namespace ns); its stdout. A failure raises
    RuntimeError with the command and its stderr."""
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(cmd), r.stderr.strip()))
    return r.stdout


def bridge(hub, members, run=None):
    """Network namespace hub with a bridge, and each member a namespace
    joined to it by a veth: members is [(netns, veth name in hub, address
    with its /prefix)]; the member's end is eth0. run: sh, or a caller's
    own with the same arguments."""
    run = run or sh
    run("ip", "netns", "add", hub)
    run("ip", "link", "add", "br0", "type", "bridge", ns=hub)
    run("ip", "link", "set", "br0", "up", ns=hub)
    run("ip", "link", "set", "lo", "up", ns=hub)
    for n, here, addr in members:
        run("ip", "netns", "add", n)
        run("ip", "link", "add", here, "netns", hub, "type", "veth", "peer", "name", "eth0",
            "netns", n)
        run("ip", "link", "set", here, "master", "br0", ns=hub)
        run("ip", "link", "set", here, "up", ns=hub)
        run("ip", "addr", "add", addr, "dev", "eth0", ns=n)
        run("ip", "link", "set", "eth0", "up", ns=n)
        run("ip", "link", "set", "lo", "up", ns=n)


def in_namespaces(name, make, remove, main):
    """main(tmp) between make(), which makes network namespaces (a
    RuntimeError there skips the test: exit 77), and remove(), which runs
    whatever happens; then finish. Every process is reaped first."""
    tmp = tempfile.mkdtemp(prefix="pstest-%s." % name)
    try:
        try:
            make()
        except RuntimeError as e:
            print("cannot make the namespaces here (%s): skipped" % e)
            remove()
            sys.exit(77)
        main(tmp)
    finally:
        reap()
        remove()
    finish(tmp)


def finish(tmp):
    """Shows the logs in tmp when a check failed (else removes tmp), prints
    the verdict and exits 1 or 0."""
    if failures:
        for name in sorted(os.listdir(tmp)):
            if name.endswith(".log"):
                print("---- " + name)
                with open(os.path.join(tmp, name)) as f:
                    print(f.read()[-4000:])
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d check(s) failed" % len(failures) if failures else "all checks passed")
    sys.exit(1 if failures else 0)
