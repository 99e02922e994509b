"""tests/gpu/check.sh in its no-GPU mode, so that the GPU check cannot rot
where there is no GPU: on the test build as it is (--no-build), with a
package made here standing in for the Debian packages it unpacks, every
step either passes on the CPU or is skipped for want of a GPU, and the
report says so row by row. Then a package that is not one: the prefix
step fails, by name, and so does the check.

    test_gpu_check.py CHECK_SH BUILD_DIR"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

from pstest import check, finish

CHECK, BUILD = sys.argv[1], sys.argv[2]
SKIP = 77

PC = """prefix=/usr
libdir=${prefix}/lib/x86_64-linux-gnu
includedir=/usr/include/fake

Name: fake
Description: a stand-in for a Debian -dev package
Version: 1.0
Requires.private: not-here-at-all
Libs: -L${libdir} -lfake
Libs.private: -lnothing
Cflags: -I/usr/include/fake
"""


def fake_deb(where):
    """A real .deb holding one pkg-config file, as fetch-debs.sh's have."""
    root = os.path.join(where, "fake")
    pc_dir = os.path.join(root, "usr/lib/x86_64-linux-gnu/pkgconfig")
    os.makedirs(pc_dir)
    os.makedirs(os.path.join(root, "DEBIAN"))
    with open(os.path.join(pc_dir, "fake.pc"), "w") as f:
        f.write(PC)
    with open(os.path.join(root, "DEBIAN/control"), "w") as f:
        f.write("Package: psd-fake\nVersion: 1.0\nArchitecture: amd64\n"
                "Maintainer: psd tests <tests@localhost>\nDescription: a test package\n")
    debs = os.path.join(where, "debs")
    os.makedirs(debs)
    subprocess.run(["dpkg-deb", "--build", root, os.path.join(debs, "psd-fake_1.0_amd64.deb")],
                   check=True, stdout=subprocess.DEVNULL)
    return debs


def run(debs, out, *extra):
    env = dict(os.environ)
    env.pop("OUT", None)
    return subprocess.run(["bash", CHECK, "--no-gpu", "--quick", "--no-build", "--build-dir", BUILD,
                           "--debs", debs, "--prefix", out + ".prefix", "--out", out]
                          + list(extra),
                          capture_output=True, text=True, env=env, timeout=540)


def rows(report):
    """{step: (result, detail)} from the report's table."""
    out = {}
    for line in report.splitlines():
        m = re.match(r"^\| ([a-z0-9-]+) \| (passed|failed|skipped) \| (\d+) \| (.*) \|$", line)
        if m:
            out[m.group(1)] = (m.group(2), m.group(4))
    return out


def main():
    if shutil.which("dpkg-deb") is None:
        print("SKIP: dpkg-deb is not installed (the test makes a package with it)")
        sys.exit(SKIP)
    tmp = tempfile.mkdtemp(prefix="psd-gpucheck-test-")
    try:
        debs = fake_deb(tmp)
        out = os.path.join(tmp, "out")
        r = run(debs, out)
        print(r.stderr[-4000:])
        report = open(os.path.join(out, "report.md")).read()
        check(r.returncode == 0, "check.sh --no-gpu --quick exits 0 (got %d)" % r.returncode)
        got = rows(report)
        want = {"env": "passed", "prefix": "passed", "build": "passed", "parity": "skipped",
                "quickstart": "skipped", "mlp": "skipped", "cnn-f32": "skipped",
                "cnn-bf16": "skipped", "cnn-f16": "skipped", "gemm": "passed",
                "torch": "skipped", "train-bench": "passed"}
        check(list(got) == list(want), "the report has every step, in order: %s" % list(got))
        for name, result in want.items():
            res, detail = got.get(name, ("missing", ""))
            check(res == result, "%s %s (%s)" % (name, result, detail or res))
        check("1 packages unpacked" in got.get("prefix", ("", ""))[1],
              "the prefix step unpacked the package")
        check("needs a GPU" in got.get("mlp", ("", ""))[1], "a skipped step says why")
        check(re.search(r"cpu: peak \d+ GFLOP/s; a step's products", got.get("gemm", ("", ""))[1])
              is not None, "the gemm row gives the peak and a step's products")
        check("## gemm" in report and "peak: 256 x 256 x 256" in report,
              "the report holds gemm_bench's table")
        check("2 shards + 4 workers" in report, "the report holds train_bench's wide row")
        check(report.rstrip().endswith("check: 5 passed, 0 failed, 7 skipped"),
              "the report ends with the counts: %r" % report.rstrip().splitlines()[-1])
        check(os.path.getsize(os.path.join(out, "steps.log")) > 0, "the steps' log is written")
        pc = open(os.path.join(out + ".prefix", "usr/lib/x86_64-linux-gnu/pkgconfig/fake.pc")).read()
        prefix = out + ".prefix/usr"
        check("prefix=%s\n" % prefix in pc and "Cflags: -I%s/include/fake" % prefix in pc
              and "includedir=%s/include/fake" % prefix in pc,
              "the pkg-config file points into the prefix:\n" + pc)
        check("Requires.private" not in pc and "Libs.private" not in pc,
              "the pkg-config file names no private requirements")

        # a file that is not a package: the prefix step fails and says so
        bad = os.path.join(tmp, "bad")
        os.makedirs(bad)
        with open(os.path.join(bad, "broken_1.0_amd64.deb"), "wb") as f:
            f.write(b"not an ar archive\n" * 10)
        out2 = os.path.join(tmp, "out2")
        r = run(bad, out2, "--budget", "20")
        check(r.returncode != 0, "a broken package fails the check (got %d)" % r.returncode)
        got = rows(open(os.path.join(out2, "report.md")).read())
        res, detail = got.get("prefix", ("missing", ""))
        check(res == "failed" and "cannot unpack broken_1.0_amd64.deb" in detail,
              "the prefix step names the package it could not unpack (%s: %s)" % (res, detail))

        r = subprocess.run(["bash", CHECK, "--budget", "soon"], capture_output=True, text=True)
        check(r.returncode == 2 and "--budget" in r.stderr, "a bad flag is refused by name")
    except Exception as e:  # a crash is a failed check, not a pass
        check(False, "the test ran to its end (%s: %s)" % (type(e).__name__, e))
    finish(tmp)


if __name__ == "__main__":
    main()
