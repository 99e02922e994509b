#!/usr/bin/env python3
"""The API of libpsclient cannot grow by accident: the dynamic symbols the
shared library defines (nm -D --defined-only) must be exactly the list
checked in beside psclient.h, and every one must be declared in it.

usage: test_symbols.py LIBPSCLIENT_SO SYMBOLS_FILE PSCLIENT_H"""
import re
import subprocess
import sys

lib, listed_path, header = sys.argv[1:4]
out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                     check=True).stdout
# the version node (PSCLIENT_1) is an absolute symbol, not a function
exported = sorted(l.split()[-1].split("@")[0] for l in out.splitlines()
                  if l.split() and l.split()[1] != "A")
listed = sorted(l.strip() for l in open(listed_path) if l.strip() and not l.startswith("#"))
declared = set(re.findall(r"^PSC_API\b[^(]*?\b(psc_\w+)\(", open(header).read(), re.M))
fail = 0
for s in sorted(set(exported) - set(listed)):
    print("FAIL exported but not in %s: %s" % (listed_path, s))
    fail = 1
for s in sorted(set(listed) - set(exported)):
    print("FAIL listed but not exported: %s" % s)
    fail = 1
for s in sorted(set(exported) - declared):
    print("FAIL exported but not declared PSC_API in psclient.h: %s" % s)
    fail = 1
print("%d symbols exported, %d listed, %d declared" % (len(exported), len(listed), len(declared)))
sys.exit(fail)
