#!/usr/bin/env python3
"""psctl is a program on the client library and psd's snapshot library
(server/state): it talks to psd, never to etcd, and serves no HTTP. The
libraries it needs itself (readelf -d, NEEDED) hold none of libcurl,
libsodium, libuv, libmicrohttpd or libsystemd; ldd, which lists what
those need in turn, holds none of them either, but libsodium where
ZeroMQ itself needs it (its CURVE). psd, which does link them, is read
the same way: the check sees them where they are.

usage: test_psctl_links.py PSCTL PSD"""
import re
import subprocess
import sys

KEPT_OUT = ("libcurl", "libsodium", "libuv", "libmicrohttpd", "libsystemd")


def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def ldd(path):
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    return [l.split()[0] for l in out.splitlines() if l.strip()]


def path_of(lib, path):
    for l in subprocess.run(["ldd", path], capture_output=True, text=True).stdout.splitlines():
        parts = l.split()
        if parts and parts[0].startswith(lib) and len(parts) >= 3:
            return parts[2]
    return None


def main():
    psctl, psd = sys.argv[1:3]
    fail = 0
    own = needed(psctl)
    for lib in own:
        if lib.startswith(KEPT_OUT):
            print("FAIL psctl needs %s itself" % lib)
            fail = 1
    zmq = path_of("libzmq", psctl)
    zmq_needs = needed(zmq) if zmq else []
    for lib in ldd(psctl):
        if not lib.startswith(KEPT_OUT):
            continue
        if lib.startswith("libsodium") and any(n.startswith("libsodium") for n in zmq_needs):
            print("ok   %s comes through %s (ZeroMQ's CURVE), not psctl" % (lib, zmq))
            continue
        print("FAIL ldd psctl lists %s" % lib)
        fail = 1
    psd_own = needed(psd)
    for lib in ("libcurl", "libuv"):
        if not any(n.startswith(lib) for n in psd_own):
            print("FAIL the check does not see %s in psd, which links it" % lib)
            fail = 1
    print("psctl needs: %s" % " ".join(own))
    print("psd needs:   %s" % " ".join(psd_own))
    return fail


if __name__ == "__main__":
    sys.exit(main())
