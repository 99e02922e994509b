#!/usr/bin/env bash
# Training throughput, side by side in one run: psworker --standalone,
# --model cnn standalone (1 thread and default threads) against the same
# CNN in PyTorch (fashion_cnn.py --local, 1 thread and all cores), the CNN
# and the MLP with --precision bf16 and f16 beside f32,
# 1 shard + 1 worker and 2 shards + 2 workers (BSP, or --consistency),
# 2+2 in ASP, 2+2 with --topk 0.01 and with --wire-dtype f16, and (where
# Debian's python3-torch is installed) the same MLP in PyTorch, printed as
# a table with each configuration's samples/s and its ratio to standalone. Reports
# numbers; never passes or fails on them.
#
# Noise: on small VMs OpenBLAS with several threads is bimodal run to run
# (41k-112k samples/s seen on one 2-core machine), so every configuration
# runs --repeat times, interleaved, and the median is reported. Standalone
# runs with OpenBLAS's default threads, with 1, and with psworker's helper
# thread (the default, --compute-threads); the ratio is taken against the
# fastest. Distributed workers use --blas-threads (default 1) and, by
# default, the helper thread: it takes pieces of each product when psd
# leaves the other core free.
# Shards listen on tcp://127.0.0.1; workers switch to each shard's
# same-host Unix socket as they do by default, and one row stays on tcp.
# One 1+1 row pins the worker's training thread away from psd and the
# I/O threads (--cpus, --io-cpus): on a 2-core machine they otherwise take
# turns on both cores.
#   tests/bench/train_bench.sh [--build-dir DIR] [--no-build] [--steps N] [--cnn-steps N] [--batch B]
#                              [--device D] [--repeat N] [--blas-threads N] [--no-torch]
#                              [--workers N,N...] [--wide-only] [--data DIR] [--json PATH]
# --no-build uses DIR as it is (the tests run it so, on their own build);
# --no-torch leaves out the PyTorch rows; --workers 4,8 adds a row of
# 2 shards + N workers for each N (a host with more cores); --wide-only
# keeps only the standalone rows, 2+2 and those; --data is psworker's
# (where Fashion-MNIST is).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build-release steps=600 batch=64 device=cpu consistency=bsp json="" repeat=3 blas=1
cnn_steps=150
do_build=1 with_torch=1 wide=() wide_only=0 data=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --steps) steps=$2; shift 2 ;;
    --cnn-steps) cnn_steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --consistency) consistency=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --blas-threads) blas=$2; shift 2 ;;
    --no-torch) with_torch=0; shift ;;
    --workers)
      IFS=, read -r -a wide <<<"$2"
      for n in "${wide[@]}"; do
        if ! [[ $n =~ ^[1-9][0-9]*$ ]] || [ "$n" -gt 256 ]; then
          echo "train_bench: --workers takes worker counts in [1, 256] separated by commas, not '$2'" >&2
          exit 2
        fi
      done
      shift 2 ;;
    --wide-only) wide_only=1; shift ;;
    --data) data=(--data "$2"); shift 2 ;;
    *) echo "train_bench: unknown option '$1'" >&2; exit 2 ;;
  esac
done
for v in steps cnn_steps batch repeat blas; do
  if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then
    name=${v/blas/blas-threads}
    echo "train_bench: --${name/_/-} must be a positive whole number, not '${!v}'" >&2
    exit 2
  fi
done
# shellcheck source=tests/bench/lib.sh
. tests/bench/lib.sh
bench_setup psd-bench

common=(--batch "$batch" --max-steps "$steps" --epochs 1000 --device "$device" --log-every 1000000 "${data[@]}")

dist() { # shards workers consistency [options...]: psd:OPT goes to psd, the rest to psworker
  local n=$1 w=$2 mode=$3 o
  shift 3
  psd_opts=() wopts=()
  for o in "$@"; do
    if [[ $o == psd:* ]]; then psd_opts+=("${o#psd:}"); else wopts+=("$o"); fi
  done
  start_shards "$n" "$w" "$mode"
  local files=() wp=() failed=0
  for ((r = 0; r < w; r++)); do
    rm -f "$run/dist.$r.json" # a failed run must not read the last one's
    OPENBLAS_NUM_THREADS=$blas "$psw" --servers "$servers" --rank "$r" --workers "$w" "${common[@]}" \
      "${wopts[@]}" --summary-json "$run/dist.$r.json" 2>"$run/dist.$r.log" &
    wp+=($!); files+=("$run/dist.$r.json")
  done
  for p in "${wp[@]}"; do wait "$p" || failed=1; done
  stop_shards
  if [ "$failed" = 1 ]; then
    echo "train_bench: a worker failed in 'dist $n $w $mode $*'; the end of its log:" >&2
    tail -n 5 "$run"/dist.*.log >&2
    return 1 # the caller's assignment fails, and set -e ends the script
  fi
  sps "${files[@]}"
}

alone() { # blas-threads ("-": OpenBLAS default) [psworker options...]
  if [ "${1:--}" != - ]; then export OPENBLAS_NUM_THREADS=$1; else unset OPENBLAS_NUM_THREADS; fi
  shift
  rm -f "$run/alone.json"
  if ! "$psw" --standalone "${common[@]}" "$@" --summary-json "$run/alone.json" 2>"$run/alone.log"; then
    echo "train_bench: psworker --standalone $* failed; the end of its log:" >&2
    tail -n 5 "$run/alone.log" >&2
    return 1
  fi
  unset OPENBLAS_NUM_THREADS
  sps "$run/alone.json"
}

# name | key | how: "alone THREADS" or "dist SHARDS WORKERS MODE [options]"
configs=(
  "standalone (OpenBLAS threads)|standalone|alone - --compute-threads 1"
  "standalone (1 BLAS thread)|standalone_1thread|alone 1 --compute-threads 1"
  "standalone (helper thread: default)|standalone_helper|alone -"
  "1 shard + 1 worker, $consistency|one_plus_one|dist 1 1 $consistency"
  "1+1, $consistency, --no-batch|one_plus_one_nobatch|dist 1 1 $consistency --no-batch"
  "1+1, $consistency, --compute-threads 1|one_plus_one_1thread|dist 1 1 $consistency --compute-threads 1"
  "1+1, $consistency, --no-shm, 1 thread|one_plus_one_noshm|dist 1 1 $consistency --no-shm --compute-threads 1"
  "1+1, $consistency, tcp (--no-local-ipc)|one_plus_one_tcp|dist 1 1 $consistency --no-local-ipc"
)
# pinned: the worker's training thread on every CPU but the last; psd and
# the worker's ZeroMQ I/O thread on the last (--cpus, --io-cpus)
cpus=$(python3 -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0)))))')
if [ "${cpus//[^,]/}" != "" ]; then
  last=${cpus##*,}
  configs+=("1+1, $consistency, pinned (--cpus)|one_plus_one_pinned|dist 1 1 $consistency psd:--cpus=$last --cpus ${cpus%,*} --io-cpus $last")
fi
configs+=(
  "2 shards + 2 workers, $consistency|two_plus_two|dist 2 2 $consistency"
  "2 shards + 2 workers, asp|two_plus_two_asp|dist 2 2 asp"
  "2+2, $consistency, --topk 0.01|two_plus_two_topk|dist 2 2 $consistency --topk 0.01"
  "2+2, $consistency, --wire-dtype f16|two_plus_two_f16|dist 2 2 $consistency --wire-dtype f16"
)
# The CNN (--model cnn's default --arch), standalone: 1 thread, and
# psworker's default threads (the helper thread; OpenBLAS's own with 1)
configs+=(
  "cnn standalone, 1 thread|cnn_1thread|alone 1 --model cnn --max-steps $cnn_steps --compute-threads 1"
  "cnn standalone (default threads)|cnn|alone - --model cnn --max-steps $cnn_steps"
  "cnn standalone, --precision bf16|cnn_bf16|alone - --model cnn --max-steps $cnn_steps --precision bf16"
  "cnn standalone, --precision f16|cnn_f16|alone - --model cnn --max-steps $cnn_steps --precision f16"
  "standalone, --precision bf16|standalone_bf16|alone - --precision bf16"
)
torch() { # threads: the same MLP in PyTorch (python3-torch), same BLAS, same batch
  /usr/bin/python3 tests/bench/torch_mlp.py --steps "$steps" --batch "$batch" --threads "$1"
}
torch_cnn() { # threads: the same CNN in PyTorch, local optimizer, same batch
  rm -f "$run/torch_cnn.json"
  /usr/bin/python3 worker/python/examples/fashion_cnn.py --local --steps "$cnn_steps" \
    --batch "$batch" --threads "$1" --json "$run/torch_cnn.json" >"$run/torch_cnn.log" 2>&1 ||
    { echo "train_bench: fashion_cnn.py --local failed:" >&2; tail -n 5 "$run/torch_cnn.log" >&2; return 1; }
  sps "$run/torch_cnn.json"
}
if [ "$with_torch" = 1 ] && [ "$device" = cpu ] && /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  configs+=("pytorch, 1 thread|pytorch_1thread|torch 1" "pytorch, $(nproc) threads|pytorch|torch $(nproc)")
  configs+=("pytorch cnn, 1 thread|pytorch_cnn_1thread|torch_cnn 1"
            "pytorch cnn, $(nproc) threads|pytorch_cnn|torch_cnn $(nproc)")
fi
for n in "${wide[@]}"; do
  configs+=("2 shards + $n workers, $consistency|workers_$n|dist 2 $n $consistency")
done
if [ "$wide_only" = 1 ]; then
  kept=()
  for c in "${configs[@]}"; do
    IFS='|' read -r _ key _ <<<"$c"
    if [[ $key =~ ^(standalone|standalone_1thread|standalone_helper|two_plus_two|workers_[0-9]+)$ ]]; then
      kept+=("$c")
    fi
  done
  configs=("${kept[@]}")
fi
declare -A runs=()
for ((i = 0; i < repeat; i++)); do # interleaved: drifts in machine speed hit every row alike
  for c in "${configs[@]}"; do
    IFS='|' read -r name key how <<<"$c"
    # shellcheck disable=SC2086
    runs[$key]+="$($how) "
  done
done
declare -A med=()
for c in "${configs[@]}"; do
  IFS='|' read -r name key how <<<"$c"
  # shellcheck disable=SC2086
  med[$key]=$(median ${runs[$key]})
done
best=$(printf '%s\n' "${med[standalone]}" "${med[standalone_1thread]}" "${med[standalone_helper]}" | sort -g | tail -1)

printf '\ntraining throughput: MLP 784-256-128-10, batch %s per worker, %s steps, device %s, %s cores, %s BLAS thread(s) per distributed worker, median of %s\n' \
  "$batch" "$steps" "$device" "$(nproc)" "$blas" "$repeat"
printf '%-38s %12s %14s %14s  %s\n' configuration samples/s "vs best alone" "vs 1-thread" "runs"
jrows=""
for c in "${configs[@]}"; do
  IFS='|' read -r name key how <<<"$c"
  v=${med[$key]}
  printf '%-38s %12s %13.1f%% %13.1f%%  %s\n' "$name" "$v" "$(awk -v a="$v" -v b="$best" 'BEGIN{print 100*a/b}')" \
    "$(awk -v a="$v" -v b="${med[standalone_1thread]}" 'BEGIN{print 100*a/b}')" "${runs[$key]}"
  jrows+="${jrows:+, }\"$key\": $v"
done
if [ -n "$json" ]; then
  printf '{%s, "batch": %s, "steps": %s, "consistency": "%s", "device": "%s"}\n' \
    "$jrows" "$batch" "$steps" "$consistency" "$device" >"$json"
fi
if [ -n "${med[cnn]:-}" ]; then
printf 'mixed precision / f32, default threads: cnn bf16 %s, cnn f16 %s, mlp bf16 %s\n' \
  "$(awk -v a="${med[cnn_bf16]}" -v b="${med[cnn]}" 'BEGIN { printf "%.3fx", a / b }')" \
  "$(awk -v a="${med[cnn_f16]}" -v b="${med[cnn]}" 'BEGIN { printf "%.3fx", a / b }')" \
  "$(awk -v a="${med[standalone_bf16]}" -v b="${med[standalone_helper]}" 'BEGIN { printf "%.3fx", a / b }')"
fi
if [ -n "${med[pytorch_cnn_1thread]:-}" ]; then
  printf 'cnn, psworker / PyTorch: %s with 1 thread each, %s with default threads each\n' \
    "$(awk -v a="${med[cnn_1thread]}" -v b="${med[pytorch_cnn_1thread]}" 'BEGIN { printf "%.3fx", a / b }')" \
    "$(awk -v a="${med[cnn]}" -v b="${med[pytorch_cnn]}" 'BEGIN { printf "%.3fx", a / b }')"
fi
