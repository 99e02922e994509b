#!/usr/bin/env python3
"""libpsclient as another program sees it: `meson install` into a DESTDIR,
then a program outside the tree (outside.c) is built with nothing but
`pkg-config --cflags --libs libpsclient` and run against a real psd.
Also checks what the installed library needs (readelf -d): ZeroMQ,
protobuf-c and libc, none of the daemons' runtime libraries.

usage: test_install.py BUILD_DIR"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from pstest import check, finish, poll, reap, spawn  # noqa: E402

# what only the daemons may link
DAEMON_LIBS = ("libmicrohttpd", "libsystemd", "libinih", "libjansson", "libuv")


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        print("$ " + " ".join(cmd) + "\n" + r.stdout + r.stderr)
    return r


def main():
    build = os.path.abspath(sys.argv[1])
    here = os.path.dirname(os.path.abspath(__file__))
    tmp = tempfile.mkdtemp(prefix="psd-install-")
    dest = os.path.join(tmp, "root")
    try:
        r = run(["meson", "install", "-C", build, "--no-rebuild", "--quiet", "--destdir", dest])
        check(r.returncode == 0, "meson install --destdir")
        pcs = [os.path.join(d, f) for d, _, fs in os.walk(dest) for f in fs if f == "libpsclient.pc"]
        check(len(pcs) == 1, "one libpsclient.pc installed")
        libs = [os.path.join(d, f) for d, _, fs in os.walk(dest) for f in fs
                if re.fullmatch(r"libpsclient\.so\.\d+", f)]
        check(len(libs) == 1, "libpsclient.so.<soname version> installed")
        if not pcs or not libs:
            return
        lib = libs[0]
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]",
                            run(["readelf", "-d", lib]).stdout)
        soname = re.findall(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]",
                            run(["readelf", "-d", lib]).stdout)
        print("NEEDED: " + ", ".join(needed) + "; SONAME: " + ", ".join(soname))
        check(soname == [os.path.basename(lib)], "the SONAME carries the ABI version")
        check(not [n for n in needed if n.startswith(DAEMON_LIBS)],
              "needs none of " + ", ".join(DAEMON_LIBS))
        check(any(n.startswith("libzmq") for n in needed) and
              any(n.startswith("libprotobuf-c") for n in needed), "needs libzmq and libprotobuf-c")
        for h in ("psclient.h", "ps_errcodes.h"):
            check(any(h in fs for _, _, fs in os.walk(dest)), h + " installed")

        env = dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(pcs[0]),
                   PKG_CONFIG_SYSROOT_DIR=dest)
        flags = run(["pkg-config", "--cflags", "--libs", "libpsclient"], env=env)
        check(flags.returncode == 0 and "-lpsclient" in flags.stdout, "pkg-config knows libpsclient")
        print("pkg-config: " + flags.stdout.strip())
        # a sanitized build's library needs the sanitizer runtime linked first
        san = ["-fsanitize=address,undefined"] if any("asan" in n for n in needed) else []
        exe = os.path.join(tmp, "outside")
        r = run(["cc", "-std=c11", "-Wall", "-Werror", "-o", exe, os.path.join(here, "outside.c")] +
                san + flags.stdout.split())
        check(r.returncode == 0, "an outside program builds with pkg-config's flags alone")
        if r.returncode != 0:
            return

        ep = os.path.join(tmp, "endpoint")
        spawn([os.environ["PSD_BIN"], "--listen", "tcp://127.0.0.1:0", "--endpoint-file", ep],
              os.path.join(tmp, "psd.log"))
        endpoint = poll(lambda: os.path.exists(ep) and open(ep).read().strip(), "psd's endpoint")
        if not endpoint:
            return
        env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(lib))
        r = run([exe, endpoint], env=env, timeout=60)
        print(r.stdout.strip())
        check(r.returncode == 0, "the outside program trained one step through the installed library")
        ldd = run(["ldd", exe], env=env).stdout
        check(os.path.dirname(lib) in ldd,
              "it ran on the installed library, not the build tree's or the system's")
    finally:
        reap()
        finish(tmp)


if __name__ == "__main__":
    main()
