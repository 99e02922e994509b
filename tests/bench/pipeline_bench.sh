#!/usr/bin/env bash
# Pipelines against one process, side by side in one run: an MLP whose
# halves cost the same (784,1024,1024,1024,1024,10, cut after fc2) trained
# through one shard by one psworker with one compute thread, and by 2
# stages (psworker --stages 2, one compute thread each) with M
# micro-batches under 1F1B and GPipe. Prints samples/s, the ratio to the
# single process, each stage's measured bubble (time waiting for its
# neighbour over training time) beside the schedule's own,
# (P - 1) / (M + P - 1), and the stages' imbalance (their busy times).
# Every configuration runs --repeat times, interleaved; medians reported.
# Reports numbers; never passes or fails on them.
# --pin puts stage r on CPU r and the single process on CPU 0 (--cpus);
# --layers and --cuts pick another model and split.
#   tests/bench/pipeline_bench.sh [--build-dir DIR] [--no-build] [--steps N] [--batch B]
#                                 [--microbatches M] [--repeat N] [--device D] [--pin]
#                                 [--layers L] [--cuts C] [--json PATH]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build-release steps=100 batch=512 micro=8 repeat=3 device=cpu json="" do_build=1 pin=0
layers=784,1024,1024,1024,1024,10 cuts=2
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --steps) steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --microbatches) micro=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --pin) pin=1; shift ;;
    --layers) layers=$2; shift 2 ;;
    --cuts) cuts=$2; shift 2 ;;
    *) echo "pipeline_bench: unknown option '$1'" >&2; exit 2 ;;
  esac
done
for v in steps batch micro repeat; do
  if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then
    name=${v/micro/microbatches}
    echo "pipeline_bench: --$name must be a positive whole number, not '${!v}'" >&2
    exit 2
  fi
done
# shellcheck source=tests/bench/lib.sh
. tests/bench/lib.sh
bench_setup psd-pipebench

common=(--layers "$layers" --batch "$batch" --max-steps "$steps" --epochs 1000 --device "$device"
  --log-every 1000000 --compute-threads 1)
export OPENBLAS_NUM_THREADS=1
pinned=()
if [ "$pin" = 1 ]; then pinned=(--cpus @); fi

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# one: the single process; stages SCHEDULE: 2 stages. Each prints its
# summaries' paths.
one() {
  start_shards 1 1 bsp
  rm -f "$run/one.json"
  if ! timeout 900 "$psw" --servers "$servers" "${common[@]}" "${pinned[@]/@/0}" --summary-json "$run/one.json" \
    2>"$run/one.log"; then
    echo "pipeline_bench: the single process failed; the end of its log:" >&2
    tail -n 5 "$run/one.log" >&2
    exit 1
  fi
  stop_shards
}
stages() {
  start_shards 1 2 bsp
  local eps="tcp://127.0.0.1:$(free_port),tcp://127.0.0.1:$(free_port)" wp=() failed=0 r
  for r in 0 1; do
    rm -f "$run/stage$r.json"
    timeout 900 "$psw" --servers "$servers" --rank "$r" --workers 2 --stages 2 --cuts "$cuts" "${pinned[@]/@/$r}" \
      --microbatches "$micro" --schedule "$1" --stage-endpoints "$eps" "${common[@]}" \
      --summary-json "$run/stage$r.json" 2>"$run/stage$r.log" &
    wp+=($!)
  done
  for p in "${wp[@]}"; do wait "$p" || failed=1; done
  stop_shards
  if [ "$failed" = 1 ]; then
    echo "pipeline_bench: a stage failed ($1); the end of its logs:" >&2
    tail -n 5 "$run"/stage*.log >&2
    exit 1
  fi
}
field() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$@"; }
busy() { /usr/bin/python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("%.6f" % (j["forward_seconds"] + j["backward_seconds"]))' "$1"; }

declare -A rate bub0 bub1 busy0 busy1
for ((i = 0; i < repeat; i++)); do
  one
  rate[one]+=" $(sps "$run/one.json")"
  for s in 1f1b gpipe; do
    stages "$s"
    rate[$s]+=" $(sps "$run/stage0.json")" # a pipeline's samples: either stage's
    bub0[$s]+=" $(field "$run/stage0.json" bubble_fraction)"
    bub1[$s]+=" $(field "$run/stage1.json" bubble_fraction)"
    busy0[$s]+=" $(busy "$run/stage0.json")"
    busy1[$s]+=" $(busy "$run/stage1.json")"
  done
done

# shellcheck disable=SC2086
base=$(median ${rate[one]})
theory=$(/usr/bin/python3 -c "print('%.3f' % (1 / ($micro + 1)))")
printf '%-44s %12s %7s %22s %10s\n' "configuration" "samples/s" "ratio" "bubble stage 0 / 1" "imbalance"
echo "model $layers, 2 stages cut after fc$cuts$([ "$pin" = 1 ] && echo ", pinned (--cpus)")"
printf '%-44s %12.0f %7s %22s %10s\n' "1 process, 1 thread, through 1 shard" "$base" "1.00" "-" "-"
rows="\"one\": {\"samples_per_sec\": $base}"
for s in 1f1b gpipe; do
  # shellcheck disable=SC2086
  v=$(median ${rate[$s]}) b0=$(median ${bub0[$s]}) b1=$(median ${bub1[$s]})
  # shellcheck disable=SC2086
  u0=$(median ${busy0[$s]}) u1=$(median ${busy1[$s]})
  ratio=$(/usr/bin/python3 -c "print('%.2f' % ($v / $base))")
  imb=$(/usr/bin/python3 -c "print('%.2f' % (max($u0, $u1) / min($u0, $u1)) if min($u0, $u1) > 0 else 0)")
  printf '%-44s %12.0f %7s %22s %10s\n' "2 stages, $s, M = $micro" "$v" "$ratio" \
    "$(printf '%.3f / %.3f' "$b0" "$b1")" "$imb"
  rows+=", \"$s\": {\"samples_per_sec\": $v, \"ratio\": $ratio, \"bubble_stage0\": $b0, \"bubble_stage1\": $b1, \"imbalance\": $imb}"
done
echo "the schedule's own bubble, (P - 1) / (M + P - 1) with P = 2, M = $micro: $theory"
echo "(batch $batch, $steps steps, median of $repeat; imbalance: the busier stage's forward and backward time over the other's)"
if [ -n "$json" ]; then
  echo "{$rows, \"bubble_theory\": $theory, \"batch\": $batch, \"microbatches\": $micro, \"steps\": $steps}" >"$json"
fi
