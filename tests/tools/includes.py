#!/usr/bin/env python3
"""No include cycles between files: file a.c depends on b.c when it
includes (directly or through other headers) b.h, the header b.c
implements. A cycle a.c -> b.c -> ... -> a.c means two jobs reach into
each other; this prints each one and exits 1.

usage: includes.py SOURCE_ROOT"""
import os
import re
import sys

DIRS = ["server", "server/state", "server/core", "server/net", "server/repl", "worker", "worker/client", "common/protocol", "common/runtime", "kernels"]


def main():
    root = sys.argv[1]
    headers, sources = {}, []
    for d in DIRS:
        for f in sorted(os.listdir(os.path.join(root, d))):
            p = os.path.join(d, f)
            if f.endswith(".h"):
                headers.setdefault(f, p)
            elif f.endswith(".c"):
                sources.append(p)
    incs = {}

    def direct(p):
        if p not in incs:
            text = open(os.path.join(root, p)).read()
            incs[p] = [headers[h] for h in re.findall(r'^#include "([^"]+)"', text, re.M) if h in headers]
        return incs[p]

    def closure(p):
        seen, todo = set(), list(direct(p))
        while todo:
            h = todo.pop()
            if h not in seen:
                seen.add(h)
                todo.extend(direct(h))
        return seen

    owner = {h: h[:-2] + ".c" for h in headers.values() if os.path.exists(os.path.join(root, h[:-2] + ".c"))}
    deps = {c: sorted({owner[h] for h in closure(c) if h in owner} - {c}) for c in sources}
    # strongly connected components (Tarjan)
    index, low, stack, on, sccs, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in deps.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for c in sources:
        if c not in index:
            visit(c)
    for comp in sccs:
        print("include cycle: " + " <-> ".join(comp))
        for c in comp:
            print("  %s includes the headers of %s" % (c, ", ".join(d for d in deps[c] if d in comp)))
    print("%d files, %d include cycles" % (len(sources), len(sccs)))
    return 1 if sccs else 0


if __name__ == "__main__":
    sys.exit(main())
