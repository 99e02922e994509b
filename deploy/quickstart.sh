#!/usr/bin/env bash
# Quick start: installs what is needed, builds a release build, starts a
# local cluster (psd shards + psworkers on loopback, free ports, BSP), trains
# a 784-256-128-10 MLP on Fashion-MNIST and prints the test accuracy as its
# last line. With --python the workers are worker/python/examples/fashion_cnn.py
# instead: a PyTorch CNN through the psd Python package. Every process it starts is stopped on exit, on Ctrl-C, and when
# any of them fails (whose log is then shown).
set -euo pipefail
cd "$(dirname "$0")/.."

shards=2 workers=2 epochs=5 device=auto batch=64 lr="" consistency=bsp prune=""
build=build-release
extra=() python=0 install=1
usage() {
  cat <<USAGE
usage: deploy/quickstart.sh [--shards N] [--workers N] [--epochs N] [--device auto|cpu|cuda]
                            [--batch B] [--lr LR] [--consistency bsp|asp|ssp:K] [--build-dir DIR]
                            [--prune TABLE:TARGET[:START:END:EVERY]] [--python] [--no-install]
                            [-- WORKER-ARGS...]
Defaults: 2 shards, 2 workers, 5 epochs, batch 64 per worker, lr 0.02 x workers, bsp.
--python: the workers run worker/python/examples/fashion_cnn.py (a CNN in PyTorch,
lr 0.05 with momentum 0.9 unless --lr is given) on Debian's python3 and python3-torch.
--no-install: do not run deploy/install-deps.sh (a host that is not Debian, with
the libraries found otherwise, as tests/gpu/check.sh does).
USAGE
}
while [ $# -gt 0 ]; do
  case "$1" in
    --shards) shards=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --consistency) consistency=$2; shift 2 ;;
    --prune) prune=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --python) python=1; shift ;;
    --no-install) install=0; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "quickstart: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for v in shards workers epochs batch; do
  if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then echo "quickstart: --$v must be a positive whole number, not '${!v}'" >&2; exit 2; fi
done
# Linear scaling: the global batch is workers x batch.
if [ "$python" -eq 1 ]; then
  [ -n "$lr" ] || lr=0.05
else
  [ -n "$lr" ] || lr=$(awk -v w="$workers" 'BEGIN { printf "%.4g", 0.02 * w }')
fi

if [ "$install" -eq 0 ]; then :
elif [ "$python" -eq 1 ]; then deploy/install-deps.sh python; else deploy/install-deps.sh run; fi
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Dbuildtype=release -Dtests=false >/dev/null
fi
ninja -C "$build" >/dev/null

run=$(mktemp -d /tmp/psd-quickstart.XXXXXX)
pids=()
names=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  exit "$rc"
}
trap cleanup EXIT
trap 'echo; echo "quickstart: interrupted" >&2; exit 130' INT TERM

fail() { # name log
  echo "quickstart: $1 failed; its log ($2):" >&2
  tail -n 40 "$2" >&2 || true
  exit 1
}

servers=""
for ((i = 0; i < shards; i++)); do
  "$build/server/psd" --listen tcp://127.0.0.1:0 --endpoint-file "$run/ep$i" \
    --shard "$i" --shards "$shards" --consistency "$consistency" --workers "$workers" \
    ${prune:+--prune "$prune"} 2>"$run/psd$i.log" &
  pids+=($!); names+=("psd shard $i:$run/psd$i.log")
done
for ((i = 0; i < shards; i++)); do
  for ((t = 0; t < 2000; t++)); do   # poll for the endpoint, 20 s at most
    [ -s "$run/ep$i" ] && break
    kill -0 "${pids[$i]}" 2>/dev/null || fail "psd shard $i" "$run/psd$i.log"
    sleep 0.01
  done
  [ -s "$run/ep$i" ] || fail "psd shard $i (not listening after 20 s)" "$run/psd$i.log"
  servers+="${servers:+,}$(cat "$run/ep$i")"
done
echo "quickstart: $shards shard(s) at $servers; $workers worker(s), $consistency, $epochs epoch(s), lr $lr"

for ((r = 0; r < workers; r++)); do
  if [ "$python" -eq 1 ]; then
    # torchrun's variables; the package is used from the source tree
    cmd=(env PSD_SERVERS="$servers" RANK="$r" WORLD_SIZE="$workers" PYTHONPATH=worker/python
         PSD_LIBPSCLIENT="$build/worker/client/libpsclient.so.1"
         /usr/bin/python3 worker/python/examples/fashion_cnn.py --epochs "$epochs" --batch "$batch"
         --lr "$lr" --json "$run/summary$r.json" "${extra[@]}")
  else
    cmd=("$build/worker/psworker" --servers "$servers" --rank "$r" --workers "$workers"
         --epochs "$epochs" --batch "$batch" --lr "$lr" --device "$device"
         --summary-json "$run/summary$r.json" "${extra[@]}")
  fi
  if [ "$r" -eq 0 ]; then
    "${cmd[@]}" > >(tee -a "$run/worker0.log") 2> >(tee -a "$run/worker0.log" >&2) &
  else
    "${cmd[@]}" >"$run/worker$r.log" 2>&1 &
  fi
  pids+=($!); names+=("worker rank $r:$run/worker$r.log")
done

# Wait for the workers; any process that exits early with an error stops all.
remaining=$workers
while [ "$remaining" -gt 0 ]; do
  set +e
  wait -n -p done_pid "${pids[@]}"
  st=$?
  set -e
  for i in "${!pids[@]}"; do
    [ "${pids[$i]}" = "${done_pid:-}" ] || continue
    name=${names[$i]%%:*} log=${names[$i]#*:}
    if [ "$st" -ne 0 ] || [[ $name == psd* ]]; then fail "$name (exit $st)" "$log"; fi
    remaining=$((remaining - 1))
    unset 'pids[i]'
  done
done

acc=$(python3 -c 'import json,sys; print("%.4f" % json.load(open(sys.argv[1]))["test_accuracy"])' "$run/summary0.json")
echo "quickstart: logs and summaries in $run"
python3 - "$run" "$workers" <<'PY'
import json, sys
run, w = sys.argv[1], int(sys.argv[2])
s = [json.load(open(f"{run}/summary{r}.json")) for r in range(w)]
line = "quickstart: %d steps, %.0f samples/s in all" % (
    s[0]["steps"], sum(x["samples_per_sec"] for x in s))
if "bytes_pushed" in s[0]:
    line += ", %.1f MB pushed and %.1f MB pulled per worker" % (
        s[0]["bytes_pushed"] / 1e6, s[0]["bytes_pulled"] / 1e6)
print(line)
PY
echo "test accuracy: $acc"
