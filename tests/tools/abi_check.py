#!/usr/bin/env python3
"""libpsclient's ABI against the baseline checked in beside it
(worker/client/libpsclient.abi.xml), with libabigail (Debian's
abigail-tools): abidw reads the built library's exported functions and
the types they reach in psclient.h from its debug info, abidiff compares
them with the baseline (libpsclient.abi.supp beside it leaves out the
opaque struct psc_client, whose members are the library's own). Any
change fails: an incompatible one (a struct
member removed, moved or retyped, a function gone) must come with a new
soname; a compatible one (a function added, a field added at the end of
a struct that carries struct_size) with a new baseline in the same
commit.

    abi_check.py LIB HEADERS_DIR BASELINE           check (the 'abi' test)
    abi_check.py LIB HEADERS_DIR BASELINE --write   write the baseline (refused
        when a struct grew a member inside its old size: its tail padding)
    abi_check.py LIB HEADERS_DIR BASELINE --self-test
        changes planted in copies of the baseline must fail the same
        check: a member of struct psc_table_spec deleted (a change), and
        psc_table_create removed (incompatible)

Exits 77 (skipped) where abigail-tools is not installed or the library
has no debug info (a build without -g): the test build has it."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
# abidiff's exit status bits
ABIDIFF_ERROR, ABIDIFF_USAGE, ABIDIFF_CHANGE, ABIDIFF_INCOMPATIBLE = 1, 2, 4, 8


def dump(lib, headers):
    """abidw's XML of lib, without the list of libraries it links (a
    sanitizer's runtime is no part of the ABI)."""
    r = subprocess.run(["abidw", "--headers-dir", headers, "--no-corpus-path", lib],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print("abi_check: abidw %s failed:\n%s" % (lib, r.stderr), file=sys.stderr)
        sys.exit(1)
    return re.sub(r"  <elf-needed>.*?</elf-needed>\n", "", r.stdout, flags=re.S)


def compare(old, new, headers):
    """abidiff's status and report of old against new (XML files)."""
    supp = os.path.join(headers, "libpsclient.abi.supp")  # the opaque struct psc_client
    r = subprocess.run(["abidiff", "--suppressions", supp, "--headers-dir1", headers,
                        "--headers-dir2", headers, old, new],
                       capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def verdict(rc, report, baseline):
    """0 when nothing changed, else 1 with what and what to do."""
    if rc == 0:
        print("abi_check: libpsclient's ABI is the baseline's (%s)" % baseline)
        return 0
    print(report)
    if rc & (ABIDIFF_ERROR | ABIDIFF_USAGE):
        print("abi_check: abidiff failed (status %d)" % rc, file=sys.stderr)
    elif rc & ABIDIFF_INCOMPATIBLE:
        print("abi_check: an INCOMPATIBLE change to libpsclient's ABI against %s: programs "
              "built with the old header break. If it is meant, bump the soname "
              "(worker/client/meson.build) and rewrite the baseline (--write)." % baseline,
              file=sys.stderr)
    else:
        print("abi_check: libpsclient's ABI changed against %s (a struct's members or a "
              "function's types, or a function added). Under the same soname a struct may only "
              "grow at its end (its struct_size tells the library which fields a caller has; "
              "psclient.h, \"ABI\"), and functions may only be added: for those, rewrite the "
              "baseline (--write) in the same commit; anything else needs a new soname."
              % baseline, file=sys.stderr)
    return 1


def in_old_padding(report):
    """Members a grown struct added inside its old size (its tail
    padding): a caller built against the old header passes that padding,
    which nothing zeroes, as the new field. [(member, offset, old size)],
    in bits."""
    bad, old = [], None
    for line in report.splitlines():
        m = re.search(r"type size changed from (\d+) to (\d+)", line)
        if m:
            old = int(m.group(1))
            continue
        m = re.search(r"'([^']+)', at offset (\d+) \(in bits\)", line)
        if m and old is not None and int(m.group(2)) < old:
            bad.append((m.group(1), int(m.group(2)), old))
    return bad


def member_deleted(xml):
    """The ABI with the last member of struct psc_table_spec deleted."""
    i = xml.index("<class-decl name='psc_table_spec'")
    j = xml.index("</class-decl>", i)
    block = xml[i:j]
    k = block.rindex("<data-member")
    m = block.index("</data-member>", k) + len("</data-member>")
    return xml[:i] + block[:k] + block[m:] + xml[j:]


def function_removed(xml):
    """The ABI without psc_table_create (its symbol and its declaration)."""
    xml = re.sub(r"    <elf-symbol name='psc_table_create' [^\n]*\n", "", xml)
    return re.sub(r"    <function-decl name='psc_table_create' .*?</function-decl>\n", "", xml,
                  flags=re.S)


# planted changes: (what, the mutation, what abidiff must say, the status bit it must set)
PLANTED = [("a member deleted from psc_table_spec", member_deleted, "data member deletion",
            ABIDIFF_CHANGE),
           ("psc_table_create removed", function_removed, "1 Removed",
            ABIDIFF_INCOMPATIBLE)]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    if len(args) != 3 or any(f not in ("--write", "--self-test") for f in flags):
        print(__doc__, file=sys.stderr)
        return 2
    lib, headers, baseline = args
    if shutil.which("abidw") is None or shutil.which("abidiff") is None:
        print("SKIP: abidw and abidiff are not installed (abigail-tools)")
        return SKIP
    xml = dump(lib, headers)
    if "<class-decl name='psc_table_spec'" not in xml:
        print("SKIP: %s has no debug info for its types (a build without -g)" % lib)
        return SKIP
    tmp = tempfile.mkdtemp(prefix="psd-abi.")
    try:
        new = os.path.join(tmp, "now.xml")
        with open(new, "w") as f:
            f.write(xml)
        if "--write" in flags:
            rc, report = (compare(baseline, new, headers) if os.path.exists(baseline)
                          else (0, ""))
            bad = in_old_padding(report)
            for member, at, size in bad:
                print("abi_check: %s, added at bit %d, lies inside the old struct's %d bits "
                      "(its tail padding, which an old caller need not zero): put 8-byte "
                      "members first, or pad" % (member, at, size), file=sys.stderr)
            if bad:
                return 1
            with open(baseline, "w") as f:
                f.write(xml)
            print("abi_check: wrote %s" % baseline)
            return 0
        if "--self-test" in flags:
            failed = 0
            for what, mutate, said, bit in PLANTED:
                bad = os.path.join(tmp, "planted.xml")
                with open(bad, "w") as f:
                    f.write(mutate(open(baseline).read()))
                rc, report = compare(baseline, bad, headers)
                ok = (not rc & (ABIDIFF_ERROR | ABIDIFF_USAGE) and rc & bit and said in report
                      and verdict(rc, report, baseline) == 1)
                print("abi_check: %s: %s (abidiff status %d)"
                      % ("ok" if ok else "FAILED", what, rc))
                failed += not ok
            return 1 if failed else 0
        rc, report = compare(baseline, new, headers)
        return verdict(rc, report, baseline)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
