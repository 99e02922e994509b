#!/usr/bin/env python3
"""The systemd units pass `systemd-analyze verify` with nothing to say, and
psd speaks the notify protocol they rely on: READY=1 once listening,
WATCHDOG=1 from its loop while WatchdogSec is set, STOPPING=1 on SIGTERM.

Exits 77 (skipped) where systemd-analyze is not installed."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from pstest import check, failures

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNITS = os.path.join(ROOT, "deploy", "systemd")


def verify_units(tmp):
    """Copies the units with ExecStart pointing at the built binaries (verify
    checks that the command exists) and verifies one instance of each."""
    subst = {"/usr/local/bin/psd ": os.environ["PSD_BIN"] + " ",
             "/usr/local/bin/psworker ": os.environ["PSWORKER_BIN"] + " "}
    for name in ("psd@.service", "psworker@.service"):
        with open(os.path.join(UNITS, name)) as f:
            text = f.read()
        for a, b in subst.items():
            text = text.replace(a, b)
        with open(os.path.join(tmp, name), "w") as f:
            f.write(text)
    r = subprocess.run(["systemd-analyze", "verify", "--man=no",
                        "./psd@0.service", "./psworker@1.service"],
                       cwd=tmp, capture_output=True, text=True, timeout=120)
    out = (r.stdout + r.stderr).strip()
    if out:
        print(out)
    check(r.returncode == 0 and out == "", "systemd-analyze verify: exit 0, no warnings")


def recv_until(sock, want, deadline):
    got = []
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            msg = sock.recv(4096).decode()
        except socket.timeout:
            break
        got.append(msg)
        if want(got):
            break
    return got


def notify_protocol(tmp):
    path = os.path.join(tmp, "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="400000")
    log = open(os.path.join(tmp, "psd.log"), "w")
    p = subprocess.Popen([os.environ["PSD_BIN"], "--listen", "tcp://127.0.0.1:0"],
                         env=env, stdout=log, stderr=log)
    try:
        got = recv_until(sock, lambda g: any("READY=1" in m for m in g), time.monotonic() + 20)
        ready = [m for m in got if "READY=1" in m]
        check(len(ready) == 1 and "listening on tcp://127.0.0.1:" in ready[0],
              "READY=1 with the endpoint in STATUS")
        got = recv_until(sock, lambda g: sum(m == "WATCHDOG=1" for m in g) >= 3,
                         time.monotonic() + 5)
        check(sum(m == "WATCHDOG=1" for m in got) >= 3, "WATCHDOG=1 from the loop")
        p.send_signal(signal.SIGTERM)
        got = recv_until(sock, lambda g: "STOPPING=1" in g, time.monotonic() + 10)
        check("STOPPING=1" in got, "STOPPING=1 on SIGTERM")
        check(p.wait(timeout=20) == 0, "psd exits 0")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        log.close()
        sock.close()


def main():
    if shutil.which("systemd-analyze") is None:
        print("systemd-analyze not installed: skipped")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        verify_units(tmp)
        notify_protocol(tmp)
    print("failures: %d" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
