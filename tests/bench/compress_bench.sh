#!/usr/bin/env bash
# What each saving costs, side by side in one run: the quick start's cluster
# (2 shards + 2 workers, BSP, MLP 784-256-128-10, 5 epochs, same seed) dense,
# with --wire-dtype f16 (and --no-shm: a shard sharing memory with a
# worker takes f32 through it, so without it no f16 would go anywhere),
# with --topk 0.01, with --prune fc1.weight:0.9, and
# with --accum-steps 4. Prints test accuracy, bytes pushed and pulled per
# worker, and each against the dense run. Reports; never fails on numbers.
#   tests/bench/compress_bench.sh [--epochs N] [--json PATH]
set -euo pipefail
cd "$(dirname "$0")/../.."
epochs=5 json=""
while [ $# -gt 0 ]; do
  case "$1" in
    --epochs) epochs=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "compress_bench: unknown option '$1'" >&2; exit 2 ;;
  esac
done
out=$(mktemp -d /tmp/psd-compress.XXXXXX)
run() { # name, quickstart args...
  local name=$1; shift
  deploy/quickstart.sh --epochs "$epochs" "$@" >"$out/$name.log" 2>&1 ||
    { echo "compress_bench: $name failed:" >&2; tail -20 "$out/$name.log" >&2; exit 1; }
  local dir
  dir=$(sed -n 's/^quickstart: logs and summaries in //p' "$out/$name.log")
  cp "$dir/summary0.json" "$out/$name.json"
}
run dense
run f16 -- --wire-dtype f16 --no-shm
run topk -- --topk 0.01
run prune --prune fc1.weight:0.9
run accum -- --accum-steps 4
python3 - "$out" "$json" <<'PY'
import json, sys
out, js = sys.argv[1], sys.argv[2]
rows = ["dense", "f16", "topk", "prune", "accum"]
label = {"dense": "dense f32", "f16": "--wire-dtype f16 --no-shm", "topk": "--topk 0.01",
         "prune": "--prune fc1.weight:0.9", "accum": "--accum-steps 4"}
s = {r: json.load(open(f"{out}/{r}.json")) for r in rows}
d = s["dense"]
print("\nsavings on the quick start's cluster (2+2, bsp, 5 epochs), rank 0's numbers")
print("%-24s %9s %9s %11s %9s %11s %9s" % ("run", "accuracy", "vs dense", "MB pushed",
      "x fewer", "MB pulled", "x fewer"))
res = {}
for r in rows:
    x = s[r]
    res[r] = {"accuracy": x["test_accuracy"], "pushed": x["bytes_pushed"], "pulled": x["bytes_pulled"]}
    print("%-24s %9.4f %+9.2f %11.1f %9.1f %11.1f %9.1f" % (label[r], x["test_accuracy"],
          100 * (x["test_accuracy"] - d["test_accuracy"]), x["bytes_pushed"] / 1e6,
          d["bytes_pushed"] / x["bytes_pushed"], x["bytes_pulled"] / 1e6,
          d["bytes_pulled"] / x["bytes_pulled"]))
print("(vs dense: accuracy difference in points)")
if js:
    json.dump(res, open(js, "w"))
PY
