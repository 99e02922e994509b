#!/usr/bin/env bash
# PyTorch training through psd against PyTorch's own, side by side in one
# run: worker/python/examples/fashion_cnn.py (the CNN, batch 64 per
# worker) with a local optimizer in one process, through
# psd.torch.DistributedOptimizer on 1 shard + 1 worker and on 2 shards +
# 2 workers (bsp), and on torch DDP with gloo on 2 workers. Prints each
# row's samples/s (all workers together) and the two ratios: psd 2+2
# against DDP, and psd 1+1 against the local optimizer. Reports numbers;
# never passes or fails on them.
#
# Noise: every row runs --repeat times, interleaved so that drifts in the
# machine's speed hit every row alike, and the median is reported with
# every run's number beside it. Each worker runs --threads torch threads
# (default 1) and worker r is pinned to CPU r (taskset), for psd and DDP
# alike, as train_bench.sh pins its workers; psd's shards are not pinned.
#   tests/bench/torch_bench.sh [--build-dir DIR] [--no-build] [--steps N] [--repeat N]
#                              [--threads N] [--json PATH]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build-release steps=300 repeat=3 threads=1 json="" do_build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --steps) steps=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "torch_bench: unknown option '$1'" >&2; exit 2 ;;
  esac
done
for v in steps repeat threads; do
  if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then
    echo "torch_bench: --$v must be a positive whole number, not '${!v}'" >&2
    exit 2
  fi
done
py=/usr/bin/python3
if ! $py -c 'import torch, numpy' 2>/dev/null; then
  echo "torch_bench: Debian's python3-torch and python3-numpy are needed (deploy/install-deps.sh python)" >&2
  exit 2
fi
# sps, median, start_shards, stop_shards, bench_setup
# shellcheck source=tests/bench/lib.sh
. tests/bench/lib.sh
bench_setup psd-torch-bench
export PYTHONPATH=worker/python PSD_LIBPSCLIENT="$build/worker/client/libpsclient.so.1"
ncpu=$(nproc)

example=(worker/python/examples/fashion_cnn.py --steps "$steps" --threads "$threads")
workers() { # mode (psd|ddp|local) count: runs them pinned, prints their samples/s
  local mode=$1 w=$2 files=() wp=() failed=0 port=""
  [ "$mode" = ddp ] && port=$($py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  for ((r = 0; r < w; r++)); do
    rm -f "$run/$mode.$r.json"
    local flag=()
    [ "$mode" = ddp ] && flag=(--ddp)
    [ "$mode" = local ] && flag=(--local)
    PSD_SERVERS=${servers:-} RANK=$r WORLD_SIZE=$w MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      taskset -c $((r % ncpu)) $py "${example[@]}" "${flag[@]}" --json "$run/$mode.$r.json" \
      >"$run/$mode.$r.log" 2>&1 &
    wp+=($!); files+=("$run/$mode.$r.json")
  done
  for p in "${wp[@]}"; do wait "$p" || failed=1; done
  if [ "$failed" = 1 ]; then
    echo "torch_bench: a $mode worker failed; the end of its log:" >&2
    tail -n 5 "$run/$mode".*.log >&2
    return 1
  fi
  sps "${files[@]}"
}

row_local() { servers="" workers local 1; }
row_psd() { start_shards "$1" "$1" bsp; workers psd "$1"; stop_shards; }
row_ddp() { servers="" workers ddp 2; }

configs=(
  "local optimizer, 1 process|local|row_local"
  "psd, 1 shard + 1 worker|psd_1|row_psd 1"
  "psd, 2 shards + 2 workers, bsp|psd_2|row_psd 2"
  "DDP (gloo), 2 workers|ddp_2|row_ddp"
)
declare -A runs=() med=()
for ((i = 0; i < repeat; i++)); do
  for c in "${configs[@]}"; do
    IFS='|' read -r name key how <<<"$c"
    runs[$key]+="$($how) "
  done
done
for c in "${configs[@]}"; do
  IFS='|' read -r name key how <<<"$c"
  # shellcheck disable=SC2086
  med[$key]=$(median ${runs[$key]})
done

printf '\nPyTorch CNN on Fashion-MNIST (fashion_cnn.py), batch 64 per worker, %s steps, %s torch thread(s) per worker, %s cores, median of %s\n' \
  "$steps" "$threads" "$ncpu" "$repeat"
printf '%-34s %12s  %s\n' configuration samples/s runs
jrows=""
for c in "${configs[@]}"; do
  IFS='|' read -r name key how <<<"$c"
  printf '%-34s %12s  %s\n' "$name" "${med[$key]}" "${runs[$key]}"
  jrows+="${jrows:+, }\"$key\": ${med[$key]}"
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
spread() { # the runs' range around their median, in percent
  # shellcheck disable=SC2086
  printf '%s\n' $1 | sort -g | awk -v m="$2" 'NR==1{lo=$1} {hi=$1} END {printf "%.0f%%..+%.0f%%", 100*(lo-m)/m, 100*(hi-m)/m}'
}
r2=$(ratio "${med[psd_2]}" "${med[ddp_2]}")
r1=$(ratio "${med[psd_1]}" "${med[local]}")
echo "psd 2+2 / DDP 2 workers: ${r2}x   (run-to-run spread: psd $(spread "${runs[psd_2]}" "${med[psd_2]}"), DDP $(spread "${runs[ddp_2]}" "${med[ddp_2]}"))"
echo "psd 1+1 / local optimizer: ${r1}x   (DistributedOptimizer's cost: $(awk -v r="$r1" 'BEGIN { printf "%.1f", 100 * (1 - r) }')%; local $(spread "${runs[local]}" "${med[local]}"), psd $(spread "${runs[psd_1]}" "${med[psd_1]}"))"
if [ -n "$json" ]; then
  printf '{%s, "psd2_over_ddp2": %s, "psd1_over_local": %s, "steps": %s, "threads": %s}\n' \
    "$jrows" "$r2" "$r1" "$steps" "$threads" >"$json"
fi
