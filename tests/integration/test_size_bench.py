"""tests/bench/size_bench.py still runs: --quick on this build (dense
push-pull 4 KiB to 1 MiB beside raw, sparse tables of 10k and 100k rows,
checkpoints of 1 and 4 MiB beside dd), ending with status 0, every row in
its --json with numbers above zero, and its plots where matplotlib is
installed. Never a check on speed. Flags it cannot use are refused by
name.

    test_size_bench.py SIZE_BENCH_PY BUILD_DIR"""
import json
import math
import os
import subprocess
import sys
import tempfile

from pstest import check, finish

SCRIPT, BUILD = sys.argv[1], sys.argv[2]
def positive(row, *keys):
    return all(isinstance(row.get(k), (int, float)) and math.isfinite(row[k]) and row[k] > 0
               for k in keys)


def main():
    tmp = tempfile.mkdtemp(prefix="psd-size-test.")
    try:
        out, plots = os.path.join(tmp, "size.json"), os.path.join(tmp, "plots")
        p = subprocess.run([sys.executable, SCRIPT, "--quick", "--build-dir", BUILD, "--json", out,
                            "--plots", plots, "--dir", os.path.join(tmp, "work")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=900)
        print(p.stdout)
        check(p.returncode == 0, "size_bench.py --quick exits 0 (got %d)" % p.returncode)
        r = json.load(open(out)) if os.path.exists(out) else {}
        dense = r.get("dense", [])
        check([x.get("bytes") for x in dense] == [4096, 16384, 65536, 262144, 1 << 20],
              "dense rows from 4 KiB to 1 MiB (%s)" % [x.get("bytes") for x in dense])
        check(all(positive(x, "psd_rps", "raw_rps", "ratio", "psd_gbps", "raw_gbps")
                  for x in dense), "every dense row has both sides' rates above 0")
        rows = r.get("rows", [])
        check([x.get("rows") for x in rows] == [10000, 100000],
              "sparse rows at 10k and 100k (%s)" % [x.get("rows") for x in rows])
        check(all(x.get("dim") == 16 and positive(x, "fill_keys_per_s", "pull_keys_per_s",
                                                  "push_keys_per_s", "rss_bytes_per_row")
                  for x in rows), "every sparse row has fill, pull and push keys/s and bytes "
                                  "a row above 0 (%s)" % rows)
        ck = r.get("checkpoint", [])
        check([x.get("bytes") for x in ck] == [1 << 20, 4 << 20],
              "checkpoints of 1 and 4 MiB (%s)" % [x.get("bytes") for x in ck])
        check(all(positive(x, "write_ms", "write_gbps", "restore_ms", "restore_gbps",
                           "dd_write_gbps", "dd_read_gbps") and x["file_bytes"] >= x["bytes"]
                  for x in ck), "every checkpoint row has write, restore and dd rates above 0, "
                                "and a file at least as large as the table (%s)" % ck)
        try:
            import matplotlib  # noqa: F401
            have_mpl = True
        except ImportError:
            have_mpl = False
        names = sorted(os.listdir(plots)) if os.path.isdir(plots) else []
        if have_mpl:
            check(names == ["size_checkpoint.png", "size_dense.png", "size_rows.png"] and
                  all(open(os.path.join(plots, n), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
                      for n in names), "three PNG plots (%s)" % names)
        else:
            check(names == [] and "no plots: matplotlib is not installed" in p.stdout,
                  "without matplotlib: no plots, and it says why")
        for args, flag in ((["--only", "dense,nothing"], "--only"),
                           (["--max-bytes", "12"], "--max-bytes")):
            q = subprocess.run([sys.executable, SCRIPT, "--build-dir", BUILD] + args,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=60)
            check(q.returncode == 2 and flag in q.stdout,
                  "%s is refused by name (%d: %s)" % (" ".join(args), q.returncode,
                                                     q.stdout.strip()[-200:]))
        wire = os.path.join(BUILD, "tests", "bench_wire")
        for args, flag in ((["--window", "9"], "--window"), (["--size", "5000"], "--size"),
                           (["--rows", "100"], "--rows")):
            q = subprocess.run([wire] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=60)
            check(q.returncode != 0 and flag in q.stdout,
                  "bench_wire %s is refused by name (%d: %s)" % (" ".join(args), q.returncode,
                                                                q.stdout.strip()[-200:]))
    except Exception as e:  # a crash is a failed check, not a pass
        check(False, "the test ran to its end (%s: %s)" % (type(e).__name__, e))
    finish(tmp)


if __name__ == "__main__":
    main()
