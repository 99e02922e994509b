#!/usr/bin/env python3
"""The table of log ids in deploy/README.md, generated from the one list
in common/protocol/ps_logids.h.

usage: logids.py --write|--check LOGIDS_H README_MD
--write replaces the table between the markers; --check exits 1 (and says
which ids differ) when the README's table is not what the list gives."""
import re
import sys

BEGIN, END = "<!-- log ids: generated from ps_logids.h -->", "<!-- end of log ids -->"


def table(header):
    text = re.sub(r"\\\n", " ", open(header).read())  # the macro's line continuations
    text = re.sub(r'"\s+"', "", text)  # adjacent literals are one string
    rows = re.findall(r'X\((\w+),\s*(\w+),\s*"((?:\\.|[^"\\])*)"\s*\)', text)
    out = ["| id | level | what it says |", "| --- | --- | --- |"]
    for ident, level, what in rows:
        out.append("| `%s` | %s | %s |" % (ident, level.lower(), what.replace('\\"', '"').replace("|", "\\|")))
    return "\n".join(out), len(rows)


def main():
    mode, header, readme = sys.argv[1:4]
    text = open(readme).read()
    if BEGIN not in text or END not in text:
        print("%s has no %s ... %s markers" % (readme, BEGIN, END))
        return 1
    head, rest = text.split(BEGIN, 1)
    old, tail = rest.split(END, 1)
    new, n = table(header)
    if mode == "--write":
        open(readme, "w").write(head + BEGIN + "\n" + new + "\n" + END + tail)
        print("%d log ids written to %s" % (n, readme))
        return 0
    if old.strip() != new.strip():
        have = set(re.findall(r"^\| `(\w+)`.*$", old, re.M))
        want = set(re.findall(r"^\| `(\w+)`.*$", new, re.M))
        print("%s's table of log ids is not what %s gives: run meson compile logids-doc" % (readme, header))
        print("missing: %s; not in the list: %s" % (sorted(want - have) or "none", sorted(have - want) or "none"))
        return 1
    print("%d log ids, README table up to date" % n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
