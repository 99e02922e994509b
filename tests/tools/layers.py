#!/usr/bin/env python3
"""The layering check: files form a one-way stack, read from the symbols.

File a.c depends on file b.c when a.c's object file uses a symbol that
b.c's object file defines (nm). A circle of files that depend on each
other (a strongly connected component of more than one file) means two
jobs reach into each other; a shared header cannot hide one, since the
objects are read, not the #includes.

Every circle must be one of the listed exceptions (layers.exceptions
beside this script): at most 2 files each, none in server/, each with its
reason. A listed exception that is no longer a circle is reported too, so
the list stays true.

usage: layers.py BUILD_DIR SOURCE_ROOT      check the build's objects
       layers.py --self-test                 plant circles, expect failures
Exits 0 when every circle is listed, 1 otherwise."""
import json
import os
import subprocess
import sys
import tempfile

# The folders whose objects make the stack (generated code and tests are not
# layers of it). An exception may not name a file under CORE.
DIRS = ("common/", "kernels/", "server/", "worker/")
CORE = ("server/",)
PAIR_MAX = 2
DEFINED = set("TDBRCVGSWu")  # nm -P types a file defines (global)
UNDEFINED = set("Uw")


def objects(build, root):
    """{source path relative to root: [object paths]} from the build's
    compile_commands.json (one source may be built into several targets)."""
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    out = {}
    for e in entries:
        src = os.path.normpath(os.path.join(e["directory"], e["file"]))
        rel = os.path.relpath(src, root)
        if not rel.startswith(DIRS) or not rel.endswith(".c"):
            continue
        obj = os.path.join(e["directory"], e["output"])
        if os.path.exists(obj):
            out.setdefault(rel, []).append(obj)
    return out


def symbols(obj):
    """(defined, used) global symbol names of one object file."""
    text = subprocess.run(["nm", "-P", obj], check=True, capture_output=True, text=True).stdout
    defined, used = set(), set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind in DEFINED:
            defined.add(name)
        elif kind in UNDEFINED:
            used.add(name)
    return defined, used


def graph(objs):
    """{file: {file it depends on: [symbols]}}"""
    defined, used = {}, {}
    for src, paths in objs.items():
        for p in paths:
            d, u = symbols(p)
            defined.setdefault(src, set()).update(d)
            used.setdefault(src, set()).update(u)
    owner = {}
    for src, names in defined.items():
        for n in names:
            owner.setdefault(n, set()).add(src)
    deps = {}
    for src, names in used.items():
        d = deps.setdefault(src, {})
        for n in names:
            if n == "main":
                continue
            for o in owner.get(n, ()):
                if o != src:
                    d.setdefault(o, []).append(n)
    return deps


def circles(deps):
    """Strongly connected components of more than one file (Tarjan,
    iterative: no recursion limit to meet)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = 0
    for start in sorted(deps):
        if start in index:
            continue
        work = [(start, iter(sorted(deps.get(start, {}))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(deps.get(w, {})))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def read_exceptions(path):
    """[(files, reason, line)] from lines 'a.c b.c: why'; '#' starts a comment."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for no, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            files, _, why = line.partition(":")
            out.append((sorted(files.split()), why.strip(), no))
    return out


def check(deps, exceptions, say=print):
    """0 when every circle is listed and every listing is valid, else 1."""
    bad = 0
    listed = {}
    for files, why, no in exceptions:
        if len(files) > PAIR_MAX:
            say("exception on line %d lists %d files (at most %d): %s" % (no, len(files), PAIR_MAX, " ".join(files)))
            bad = 1
        elif any(f.startswith(CORE) for f in files):
            say("exception on line %d is in %s, where none is allowed: %s" % (no, "/".join(CORE), " ".join(files)))
            bad = 1
        elif not why:
            say("exception on line %d gives no reason: %s" % (no, " ".join(files)))
            bad = 1
        else:
            listed[tuple(files)] = no
    found = circles(deps)
    for comp in found:
        if tuple(comp) in listed:
            continue
        bad = 1
        say("circle: " + " <-> ".join(comp))
        for a in comp:
            for b in comp:
                if b in deps.get(a, {}):
                    names = sorted(set(deps[a][b]))
                    more = " and %d more" % (len(names) - 4) if len(names) > 4 else ""
                    say("  %s uses %s of %s%s" % (a, ", ".join(names[:4]), b, more))
    for files, no in listed.items():
        if list(files) not in found:
            say("exception on line %d is no longer a circle: %s (take it off the list)" % (no, " ".join(files)))
            bad = 1
    nedges = sum(len(d) for d in deps.values())
    say("%d files, %d dependencies, %d circles (%d listed)" % (len(deps), nedges, len(found), len(listed)))
    return bad


def plant(d, files):
    """Writes files (path relative to d: text) under d, compiles each .c
    with $CC into an object beside it, and writes the compile_commands.json
    a build would: a tree the checks read as they read a build."""
    cc = os.environ.get("CC", "cc")
    cmds = []
    for rel, text in files.items():
        path = os.path.join(d, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        if rel.endswith(".c"):
            subprocess.run([cc, "-c", path, "-o", path + ".o"], check=True)
            cmds.append({"directory": d, "file": rel, "output": rel + ".o"})
    with open(os.path.join(d, "compile_commands.json"), "w") as f:
        json.dump(cmds, f)


def self_test():
    """Plants circles in objects compiled here and checks they are caught:
    the check must be able to fail."""
    sources = {
        "server/a.c": "int b(void); int a(void) { return b(); }\n",
        "server/b.c": "int a(void); int b(void) { return 1; } int c(void) { return a(); }\n",
        "worker/x.c": "int y(void); int x(void) { return y(); }\n",
        "worker/y.c": "int x(void); int y(void) { return 2; } int z(void) { return x(); }\n",
        "worker/p.c": "int q(void); int p(void) { return q(); }\n",
        "worker/q.c": "int r(void); int q(void) { return r(); }\n",
        "worker/r.c": "int p(void); int r(void) { return p(); }\n",
        "kernels/one.c": "int two(void); int one(void) { return two(); }\n",
        "kernels/two.c": "int two(void) { return 3; }\n",
    }
    with tempfile.TemporaryDirectory() as d:
        plant(d, sources)
        deps = graph(objects(d, d))
        quiet = []
        cases = [
            # (exceptions, expected result, what it shows)
            ([], 1, "unlisted circles fail"),
            ([(["worker/x.c", "worker/y.c"], "test", 1)], 1, "one listed pair leaves the others"),
            ([(["server/a.c", "server/b.c"], "test", 1), (["worker/x.c", "worker/y.c"], "t", 2),
              (["worker/p.c", "worker/q.c", "worker/r.c"], "t", 3)], 1,
             "three files and server/ may not be excepted"),
            ([(["worker/x.c", "worker/y.c"], "", 1)], 1, "an exception needs a reason"),
            ([(["kernels/one.c", "kernels/two.c"], "t", 1)], 1, "a stale exception fails"),
        ]
        failures = 0
        want = [["server/a.c", "server/b.c"], ["worker/p.c", "worker/q.c", "worker/r.c"],
                ["worker/x.c", "worker/y.c"]]
        if circles(deps) != want:
            print("self-test: circles found %s, planted %s" % (circles(deps), want))
            failures += 1
        for exc, expect, what in cases:
            got = check(deps, exc, say=quiet.append)
            if got != expect:
                print("self-test: %s: check returned %d, not %d" % (what, got, expect))
                failures += 1
        # no circle at all passes
        acyclic = {k: v for k, v in deps.items() if k.startswith("kernels/")}
        if check(acyclic, [], say=quiet.append) != 0:
            print("self-test: a stack without circles failed")
            failures += 1
        print("self-test: %d planted cases, %d wrong" % (len(cases) + 2, failures))
        return 1 if failures else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    build, root = sys.argv[1], sys.argv[2]
    objs = objects(build, root)
    if not objs:
        print("layers: no objects of %s in %s (build first)" % (" ".join(DIRS), build))
        return 1
    here = os.path.dirname(os.path.abspath(__file__))
    return check(graph(objs), read_exceptions(os.path.join(here, "layers.exceptions")))


if __name__ == "__main__":
    sys.exit(main())
