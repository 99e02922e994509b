#!/usr/bin/env python3
"""The naming rule, read from the objects' symbols (README.md,
"Contributing"):

- every global symbol a file defines carries its folder's prefix:
  ps_ in common/, psd_ in server/, psc_ in worker/client/, psk_ in
  kernels/, psw_ elsewhere in worker/;
- prefix_name (one underscore) is an interface: it is declared in the
  defining file's own header (x.h beside x.c) or its folder's public
  header (psclient.h, psk.h, psd.h);
- prefix__name (two) is shared by the files of one module and nobody
  else: it is declared in a private header, *_impl.h.

Anything else is static. main, and what the CUDA launchers export, are
not checked.

usage: names.py BUILD_DIR SOURCE_ROOT
       names.py --self-test    break the rule in planted files, expect failures"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layers  # noqa: E402

PREFIXES = [("worker/client/", "psc"), ("common/", "ps"), ("server/", "psd"),
            ("kernels/", "psk"), ("worker/", "psw")]
PUBLIC = {"psc": ["worker/client/psclient.h"], "psk": ["kernels/psk.h"],
          "psd": ["server/core/psd.h"], "ps": [], "psw": []}
SKIP = {"main"}


def prefix_of(src):
    for folder, p in PREFIXES:
        if src.startswith(folder):
            return p
    return None


def declared_in(root, header, name):
    path = os.path.join(root, header)
    if not os.path.exists(path):
        return False
    return re.search(r"\b%s\s*\(|\b%s\b\s*;|\b%s\s*\[" % ((re.escape(name),) * 3),
                     open(path).read()) is not None


def impl_headers(root, src):
    d = os.path.join(root, os.path.dirname(src))
    return [os.path.join(os.path.dirname(src), f) for f in sorted(os.listdir(d))
            if f.endswith("_impl.h")]


def check(objs, root, say=print):
    bad = 0
    checked = 0
    for src, paths in sorted(objs.items()):
        if src.endswith(".cu"):
            continue
        p = prefix_of(src)
        defined = set()
        for o in paths:
            defined |= layers.symbols(o)[0]
        own = os.path.splitext(src)[0] + ".h"
        for name in sorted(defined - SKIP):
            checked += 1
            if not name.startswith(p + "_"):
                say("%s defines %s: a global name here starts with %s_ (or is static)" % (src, name, p))
                bad = 1
            elif name.startswith(p + "__"):
                if not any(declared_in(root, h, name) for h in impl_headers(root, src)):
                    say("%s defines %s: a %s__ name is declared in a private *_impl.h beside it"
                        % (src, name, p))
                    bad = 1
            elif not any(declared_in(root, h, name) for h in [own] + PUBLIC[p]):
                say("%s defines %s: a %s_ name is declared in %s%s (a name its module's files "
                    "share is %s__, in a *_impl.h)"
                    % (src, name, p, own, "".join(" or " + h for h in PUBLIC[p]), p))
                bad = 1
    say("%d files, %d global names checked" % (len(objs), checked))
    return bad


def self_test():
    files = {
        "worker/client/a.c": "int psc_a(void) { return 1; } int psc__shared(void) { return 2; }\n",
        "worker/client/a.h": "int psc_a(void);\n",
        "worker/client/client_impl.h": "int psc__shared(void);\n",
        "worker/client/b.c": "int pc_old(void) { return 3; }\n",
        "worker/client/c.c": "int psc_c(void) { return 4; }\n",
        "server/core/d.c": "int psd__d(void) { return 5; }\n",
        "server/core/e.c": "int psd_e(void) { return 6; }\n",
        "server/core/psd.h": "int psd_e(void);\n",
    }
    with tempfile.TemporaryDirectory() as d:
        layers.plant(d, files)
        said = []
        check(layers.objects(d, d), d, say=said.append)
        text = "\n".join(said)
        want_bad = ["pc_old", "psc_c", "psd__d"]
        want_ok = ["psc_a", "psc__shared", "psd_e"]
        wrong = [n for n in want_bad if " %s:" % n not in text] + \
                [n for n in want_ok if " %s:" % n in text]
        for n in wrong:
            print("self-test: %s judged wrongly" % n)
        print("self-test: %d planted names, %d judged wrongly" % (len(want_bad) + len(want_ok),
                                                                   len(wrong)))
        return 1 if wrong else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    build, root = sys.argv[1], sys.argv[2]
    objs = layers.objects(build, root)
    if not objs:
        print("names: no objects in %s (build first)" % build)
        return 1
    return check(objs, root)


if __name__ == "__main__":
    sys.exit(main())
