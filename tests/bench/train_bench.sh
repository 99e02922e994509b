#!/usr/bin/env bash
# Training throughput, side by side in one run: psworker --standalone,
# 1 shard + 1 worker, and 2 shards + 2 workers (BSP), printed as a table
# with each configuration's samples/s and its ratio to standalone. Reports
# numbers; never passes or fails on them.
#
# Noise: on small VMs OpenBLAS with several threads is bimodal run to run
# (41k-112k samples/s seen on one 2-core machine), so every configuration
# runs --repeat times, interleaved, and the median is reported. Standalone
# runs with OpenBLAS's default threads and with 1; the ratio is taken
# against the faster of the two. Distributed workers use --blas-threads
# (default 1: the other core belongs to psd and ZeroMQ's I/O threads).
#   tests/bench/train_bench.sh [--build-dir DIR] [--steps N] [--batch B] [--device D]
#                              [--repeat N] [--blas-threads N] [--json PATH]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build-release steps=600 batch=64 device=cpu consistency=bsp json="" repeat=3 blas=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --consistency) consistency=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --blas-threads) blas=$2; shift 2 ;;
    *) echo "train_bench: unknown option '$1'" >&2; exit 2 ;;
  esac
done
if [ ! -f "$build/build.ninja" ]; then meson setup "$build" -Dbuildtype=release >/dev/null; fi
ninja -C "$build" >/dev/null
psd="$build/server/psd" psw="$build/worker/psworker"
run=$(mktemp -d /tmp/psd-bench.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

common=(--batch "$batch" --max-steps "$steps" --epochs 1000 --device "$device" --log-every 1000000)

sps() { python3 -c 'import json,sys; print("%.1f" % sum(json.load(open(f))["samples_per_sec"] for f in sys.argv[1:]))' "$@"; }
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

start_shards() { # n workers -> sets servers
  servers=""
  local n=$1 w=$2
  for ((i = 0; i < n; i++)); do
    rm -f "$run/ep$i"
    "$psd" --listen tcp://127.0.0.1:0 --endpoint-file "$run/ep$i" --shard "$i" --shards "$n" \
      --consistency "$consistency" --workers "$w" 2>"$run/psd$i.log" &
    pids+=($!)
  done
  for ((i = 0; i < n; i++)); do
    for ((t = 0; t < 2000; t++)); do [ -s "$run/ep$i" ] && break; sleep 0.01; done
    [ -s "$run/ep$i" ] || { echo "psd $i did not start" >&2; cat "$run/psd$i.log" >&2; exit 1; }
    servers+="${servers:+,}$(cat "$run/ep$i")"
  done
}

stop_shards() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }

dist() { # shards workers name
  start_shards "$1" "$2"
  local files=() wp=()
  for ((r = 0; r < $2; r++)); do
    OPENBLAS_NUM_THREADS=$blas "$psw" --servers "$servers" --rank "$r" --workers "$2" "${common[@]}" \
      --summary-json "$run/$3.$r.json" 2>"$run/$3.$r.log" &
    wp+=($!); files+=("$run/$3.$r.json")
  done
  for p in "${wp[@]}"; do wait "$p"; done
  stop_shards
  sps "${files[@]}"
}

alone() { # blas-threads (empty: OpenBLAS default)
  if [ -n "$1" ]; then export OPENBLAS_NUM_THREADS=$1; else unset OPENBLAS_NUM_THREADS; fi
  "$psw" --standalone "${common[@]}" --summary-json "$run/alone.json" 2>"$run/alone.log"
  unset OPENBLAS_NUM_THREADS
  sps "$run/alone.json"
}
a0=() a1=() d1=() d2=()
for ((i = 0; i < repeat; i++)); do
  a0+=("$(alone "")"); a1+=("$(alone 1)"); d1+=("$(dist 1 1 one)"); d2+=("$(dist 2 2 two)")
done
s0=$(median "${a0[@]}") s01=$(median "${a1[@]}") s1=$(median "${d1[@]}") s2=$(median "${d2[@]}")
best=$(awk -v a="$s0" -v b="$s01" 'BEGIN{print (a > b) ? a : b}')

printf '\ntraining throughput: MLP 784-256-128-10, batch %s per worker, %s steps, %s, device %s, %s cores, median of %s\n' \
  "$batch" "$steps" "$consistency" "$device" "$(nproc)" "$repeat"
printf '%-38s %12s %12s  %s\n' configuration samples/s "vs best alone" "runs"
for row in "standalone (default BLAS threads):$s0:${a0[*]}" "standalone (1 BLAS thread):$s01:${a1[*]}" \
           "1 shard + 1 worker ($blas BLAS thr):$s1:${d1[*]}" "2 shards + 2 workers ($blas BLAS thr):$s2:${d2[*]}"; do
  IFS=: read -r name v runs <<<"$row"
  printf '%-38s %12s %11.1f%%  %s\n' "$name" "$v" "$(awk -v a="$v" -v b="$best" 'BEGIN{print 100*a/b}')" "$runs"
done
if [ -n "$json" ]; then
  printf '{"standalone": %s, "standalone_1thread": %s, "one_plus_one": %s, "two_plus_two": %s, "batch": %s, "steps": %s}\n' \
    "$s0" "$s01" "$s1" "$s2" "$batch" "$steps" >"$json"
fi
