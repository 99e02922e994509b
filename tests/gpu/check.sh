#!/usr/bin/env bash
# The GPU check: one command for a bare GPU host (nvcc, a C compiler,
# meson, ninja and Python with a CUDA PyTorch; none of psd's libraries; no
# network), from a clean tree, within about 8 minutes. Run
# tests/gpu/fetch-debs.sh on a Debian 12 machine first and bring its
# tests/gpu/debs/ along: they are unpacked (dpkg -x) into a private prefix
# and the build links them by rpath, so nothing on the host changes.
#
# Steps, each with a time limit, each passed, failed or skipped:
#   env         the host: CPU, memory, GPU, driver, nvcc, PyTorch
#   prefix      the packages unpacked and their pkg-config files pointed there
#   build       meson + ninja, release, the CUDA backend for this GPU's arch
#   parity      the CUDA backend against the CPU one (test_parity)
#   quickstart  deploy/quickstart.sh --device cuda (2 shards, 2 workers, MLP)
#   mlp         psworker --standalone, the MLP on the GPU, fixed steps
#   cnn-f32, cnn-bf16, cnn-f16
#               psworker --standalone --model cnn --precision P on the GPU
#   gemm        cuBLAS SGEMM (gemm_bench) on the MLP's and CNN's shapes and
#               a square product, beside the measured step times
#   torch       psd.torch with CUDA tensors and GradScaler (pytest
#               tests/python/test_torch_cuda.py) and the CPU suite
#               test_torch.py, on this host's PyTorch
#   train-bench tests/bench/train_bench.sh with 4 and 8 workers (--wide-only)
# One report: OUT/report.md (the format is in tests/gpu/README.md), with
# every step's log in OUT/steps.log. Exit 0 when nothing failed.
#
# Without a GPU (none found, or --no-gpu) the steps that need one are
# skipped and the rest run on the CPU (gemm on OpenBLAS); --quick shrinks
# every run. The test suite runs it so (the 'gpu-check' test).
#   tests/gpu/check.sh [--out DIR] [--debs DIR] [--prefix DIR] [--build-dir DIR]
#                      [--no-build] [--no-gpu] [--quick] [--budget SECONDS]
# --out: where the report goes (default $OUT when set, else tests/gpu/out);
# --prefix: where the packages are unpacked (default: the build folder's
# name + .prefix, kept after the check since the build links it);
# --no-build: use --build-dir as it is.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=${OUT:-$root/tests/gpu/out} debs=$root/tests/gpu/debs build=$root/build-gpu
do_build=1 gpu=auto quick=0 budget=480 prefix=""
usage() { sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --debs) debs=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --no-gpu) gpu=no; shift ;;
    --quick) quick=1; shift ;;
    --budget)
      budget=$2
      [[ $budget =~ ^[1-9][0-9]*$ ]] || { echo "check: --budget takes whole seconds, not '$budget'" >&2; exit 2; }
      shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "check: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $build in /*) ;; *) build=$root/$build ;; esac
case $debs in /*) ;; *) debs=$root/$debs ;; esac
mkdir -p "$out" || { echo "check: cannot make '$out'" >&2; exit 2; }
out=$(cd "$out" && pwd)
work=$(mktemp -d /tmp/psd-gpucheck.XXXXXX)
report=$out/report.md steplog=$out/steps.log
: >"$steplog"
started=$(date +%s)
py=$(command -v python3 || true)

if [ "$gpu" = auto ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then gpu=yes; else gpu=no; fi
fi

# Each step: step NAME LIMIT_S FUNCTION. The function prints its log;
# it writes one line of what it measured to $work/NAME.detail and may
# write Markdown to $work/NAME.md; it returns 0 (passed), 77 (skipped,
# the detail says why) or anything else (failed).
names=() results=() secs=()
step() {
  local name=$1 limit=$2 fn=$3 left rc t0
  left=$((budget - ($(date +%s) - started)))
  t0=$(date +%s)
  : >"$work/$name.detail"
  if [ "$left" -le 5 ]; then
    echo "not run: the budget of $budget s was spent" >"$work/$name.detail"
    rc=124
  else
    [ "$limit" -le "$left" ] || limit=$left
    export STEP_LIMIT=$limit
    echo "=== $name (at most $limit s)" >>"$steplog"
    # a step's children go with it when it runs out of time
    timeout --kill-after=10 "$limit" bash -c "$(declare -f "$fn"); $fn" \
      >>"$steplog" 2>&1
    rc=$?
    [ "$rc" -ne 124 ] || echo "ran out of its $limit s" >>"$work/$name.detail"
  fi
  names+=("$name") secs+=("$(($(date +%s) - t0))")
  case $rc in
    0) results+=(passed) ;;
    77) results+=(skipped) ;;
    *) results+=(failed); echo "=== $name failed with status $rc" >>"$steplog" ;;
  esac
  echo "check: $name ${results[-1]} in ${secs[-1]} s: $(head -c 300 "$work/$name.detail")" >&2
}
[ -n "$prefix" ] || prefix=$build.prefix # kept: the build links it by rpath
case $prefix in /*) ;; *) prefix=$root/$prefix ;; esac
export work root build debs gpu quick py out prefix

# ---- the steps

env_step() {
  {
    echo "- date: $(date -u +%FT%TZ)"
    echo "- tree: $(git -C "$root" describe --always --dirty 2>/dev/null || echo 'not a git checkout')"
    echo "- host: $(uname -srm); $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')); $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
    if [ "$gpu" = yes ]; then
      echo "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader | head -1)"
    else
      echo "- GPU: none used (no-GPU mode)"
    fi
    echo "- nvcc: $( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>/dev/null) | grep -o 'release [0-9.]*' || echo 'not found')"
    echo "- cc: $(cc --version 2>/dev/null | head -1 || echo 'not found'); meson $(meson --version 2>/dev/null || echo 'not found'); ninja $(ninja --version 2>/dev/null || echo 'not found')"
    echo "- python: ${py:-not found} $("$py" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null); torch $("$py" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available" if torch.cuda.is_available() else "not available")' 2>/dev/null || echo 'not importable')"
  } >"$work/env.md"
  cat "$work/env.md"
  echo "$(nproc) CPUs, GPU: $([ "$gpu" = yes ] && nvidia-smi --query-gpu=name --format=csv,noheader | head -1 || echo none)" >"$work/env.detail"
}

prefix_step() {
  local p=$prefix n=0 f d
  shopt -s nullglob
  local all=("$debs"/*.deb)
  if [ ${#all[@]} -eq 0 ]; then
    echo "no packages in $debs: the host's own libraries" >"$work/prefix.detail"
    return 77
  fi
  rm -rf "$p"
  mkdir -p "$p"
  for f in "${all[@]}"; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$p" || { echo "cannot unpack $(basename "$f")" >"$work/prefix.detail"; return 1; }
    else # ar and tar, where the host has no dpkg
      d=$(mktemp -d "$work/ar.XXXXXX")
      (cd "$d" && ar x "$f" && tar -xf data.tar.* -C "$p") ||
        { echo "cannot unpack $(basename "$f")" >"$work/prefix.detail"; return 1; }
    fi
    n=$((n + 1))
  done
  # pkg-config files: paths into the prefix, and no private requirements
  # (the link is dynamic; the libraries they name are there at run time)
  for f in "$p"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc "$p"/usr/share/pkgconfig/*.pc \
           "$p"/usr/lib/x86_64-linux-gnu/openblas-pthread/pkgconfig/*.pc; do
    sed -i -E -e "s#(^[a-z_]+=|[[:space:]]-[IL])/usr(/|\$|[[:space:]])#\\1$p/usr\\2#g" \
      -e '/^(Requires|Libs)\.private:/d' "$f"
  done
  local left
  left=$(grep -lE '(^[a-z_]+=|[[:space:]]-[IL])/usr(/|$|[[:space:]])' "$p"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc \
    "$p"/usr/share/pkgconfig/*.pc "$p"/usr/lib/x86_64-linux-gnu/openblas-pthread/pkgconfig/*.pc 2>/dev/null)
  if [ -n "$left" ]; then
    echo "pkg-config files still point at /usr: $(basename -a $left | paste -sd' ')" >"$work/prefix.detail"
    return 1
  fi
  mkdir -p "$p/wrap"
  local lib=$p/usr/lib/x86_64-linux-gnu
  for t in protoc-c pkgconf; do
    [ -x "$p/usr/bin/$t" ] || continue
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s:%s/openblas-pthread exec %s "$@"\n' "$lib" "$lib" "$p/usr/bin/$t" >"$p/wrap/$t"
    chmod +x "$p/wrap/$t"
  done
  [ -x "$p/wrap/pkgconf" ] && ln -sf pkgconf "$p/wrap/pkg-config"
  echo "$n packages unpacked into the prefix ($(du -sh "$p" | cut -f1))" >"$work/prefix.detail"
}

# What the prefix (if any) changes in the environment of later steps.
use_prefix() {
  local p=$prefix lib=$prefix/usr/lib/x86_64-linux-gnu
  if [ -d "$p/usr" ] && [ "${results[1]}" = passed ]; then
    export PATH=$p/wrap:$PATH
    export PKG_CONFIG_PATH=$lib/pkgconfig:$lib/openblas-pthread/pkgconfig:$p/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    export PREFIX_LIB=$lib
  fi
  data=/usr/share/datasets/fashion-mnist
  [ -d "$p$data" ] && data=$p$data
  export data
}

build_step() {
  if [ "$do_build" = 0 ]; then
    [ -f "$build/build.ninja" ] || { echo "--no-build, and $build has no build.ninja" >"$work/build.detail"; return 1; }
    echo "used $build as it is (--no-build)" >"$work/build.detail"
    return 0
  fi
  local opts=(-Dbuildtype=release "-Dpython=$py") arch
  if [ "$gpu" = yes ]; then
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
    opts+=(-Dcuda=enabled "-Dgpu_archs=$arch")
    [ -d /usr/local/cuda ] || opts+=("-Dtoolkit_dir=$(dirname "$(dirname "$(command -v nvcc)")")")
  fi
  if [ -n "${PREFIX_LIB:-}" ]; then
    local r="-Wl,--disable-new-dtags,-rpath,$PREFIX_LIB,-rpath,$PREFIX_LIB/openblas-pthread"
    opts+=("-Dc_link_args=$r" "-Dcpp_link_args=$r")
  fi
  if [ -f "$build/build.ninja" ]; then
    meson configure "$build" "${opts[@]}" || { echo "meson configure failed" >"$work/build.detail"; return 1; }
  else
    meson setup "$build" "${opts[@]}" || { echo "meson setup failed" >"$work/build.detail"; return 1; }
  fi
  ninja -C "$build" || { echo "ninja failed" >"$work/build.detail"; return 1; }
  local what="CPU backend only"
  grep -q psk_cuda_kernels "$build/build.ninja" && what="CUDA backend built${arch:+ for sm_$arch}"
  echo "$what, in $build" >"$work/build.detail"
}

parity_step() {
  "$build/tests/test_parity"
  local rc=$?
  case $rc in
    0) echo "the CUDA backend matches the CPU's" >"$work/parity.detail" ;;
    77) echo "no CUDA device (test_parity exits 77)" >"$work/parity.detail" ;;
    *) echo "test_parity failed with status $rc" >"$work/parity.detail" ;;
  esac
  return $rc
}

needs_gpu() { # NAME: skips the step without a GPU
  if [ "$gpu" != yes ]; then echo "needs a GPU" >"$work/$1.detail"; return 77; fi
  if [ ! -f "$data/t10k-images-idx3-ubyte.gz" ]; then
    echo "no Fashion-MNIST (fetch-debs.sh without --no-data brings it)" >"$work/$1.detail"
    return 77
  fi
}

quickstart_step() {
  needs_gpu quickstart || return $?
  local epochs=5 log=$work/quickstart.log
  [ "$quick" = 1 ] && epochs=1
  deploy/quickstart.sh --no-install --build-dir "$build" --device cuda --epochs "$epochs" \
    -- --data "$data" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  grep -E "^(quickstart: [0-9]+ steps|test accuracy)" "$log" | paste -sd';' >"$work/quickstart.detail"
  [ "$rc" = 0 ] || echo "quickstart failed (status $rc)" >>"$work/quickstart.detail"
  return "$rc"
}

# psworker --standalone on the GPU: NAME, then psworker's flags
alone_gpu() {
  local name=$1
  shift
  needs_gpu "$name" || return $?
  local steps=600
  [ "$quick" = 1 ] && steps=30
  "$build/worker/psworker" --standalone --device cuda --data "$data" --batch 64 --max-steps "$steps" \
    --epochs 1000 --log-every 100 --summary-json "$work/$name.json" "$@"
  local rc=$?
  [ "$rc" = 0 ] || { echo "psworker failed (status $rc)" >"$work/$name.detail"; return "$rc"; }
  "$py" - "$work/$name.json" >"$work/$name.detail" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("%d steps, %.0f samples/s, %.1f us a step, test accuracy %.4f" % (
    s["steps"], s["samples_per_sec"], 64e6 / s["samples_per_sec"], s["test_accuracy"]))
PY
}
mlp_step() { alone_gpu mlp; }
cnn_f32_step() { alone_gpu cnn-f32 --model cnn --precision f32; }
cnn_bf16_step() { alone_gpu cnn-bf16 --model cnn --precision bf16; }
cnn_f16_step() { alone_gpu cnn-f16 --model cnn --precision f16; }

gemm_step() {
  local dev=cuda args=()
  if [ "$gpu" != yes ]; then dev=cpu; fi
  [ "$quick" = 1 ] && args=(--seconds 0.02 --peak 256)
  "$build/tests/gemm_bench" --device "$dev" --json "$work/gemm.json" "${args[@]}" | tee "$work/gemm.txt"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { echo "gemm_bench failed (status $rc)" >"$work/gemm.detail"; return "$rc"; }
  { echo '```'; cat "$work/gemm.txt"; echo '```'; } >"$work/gemm.md"
  "$py" - "$work" "$dev" >"$work/gemm.detail" <<'PY'
import json, os, sys
work, dev = sys.argv[1], sys.argv[2]
g = json.load(open(os.path.join(work, "gemm.json")))
line = "%s: peak %.0f GFLOP/s; a step's products at SGEMM's rates: mlp %.1f us, cnn %.1f us" % (
    dev, g["peak_gflops"], g["mlp_step_gemm_us"], g["cnn_step_gemm_us"])
for model, name in (("mlp", "mlp"), ("cnn", "cnn-f32")):
    f = os.path.join(work, name + ".json")
    if os.path.exists(f):
        step = 64e6 / json.load(open(f))["samples_per_sec"]
        line += "; %s measured %.1f us a step, SGEMM %.0f%% of it" % (
            model, step, 100 * g[model + "_step_gemm_us"] / step)
print(line)
PY
}

torch_step() {
  if [ "$gpu" != yes ]; then
    echo "needs a GPU (the python test collects tests/python/test_torch_cuda.py, and skips it)" >"$work/torch.detail"
    return 77
  fi
  if [ -z "$py" ] || ! "$py" -c 'import torch, numpy, pytest' 2>/dev/null; then
    echo "python3 with torch, numpy and pytest is needed" >"$work/torch.detail"
    return 77
  fi
  local files=(tests/python/test_torch_cuda.py)
  [ "$quick" = 0 ] && files+=(tests/python/test_torch.py)
  PSD_BIN=$build/server/psd PSWORKER_BIN=$build/worker/psworker PSCTL_BIN=$build/worker/client/psctl \
    PSD_LIBPSCLIENT=$build/worker/client/libpsclient.so.1 \
    "$py" -m pytest -q -rs -p no:cacheprovider "${files[@]}" 2>&1 | tee "$work/torch.log"
  local rc=${PIPESTATUS[0]} last
  last=$(grep -E "(passed|failed|skipped|error)" "$work/torch.log" | tail -1)
  echo "${files[*]##*/}: $last" >"$work/torch.detail"
  if [ "$rc" = 0 ] && ! grep -q passed <<<"$last"; then return 77; fi
  return "$rc"
}

train_bench_step() {
  if [ ! -f "$data/t10k-images-idx3-ubyte.gz" ]; then
    echo "no Fashion-MNIST (fetch-debs.sh without --no-data brings it)" >"$work/train-bench.detail"
    return 77
  fi
  local args=(--workers 4,8 --repeat 3 --steps 600)
  [ "$quick" = 1 ] && args=(--workers 4 --repeat 1 --steps 20)
  tests/bench/train_bench.sh --no-build --build-dir "$build" --no-torch --wide-only --data "$data" "${args[@]}" \
    --json "$work/train.json" 2>&1 | tee "$work/train.txt"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { echo "train_bench.sh failed (status $rc)" >"$work/train-bench.detail"; return "$rc"; }
  { echo '```'; sed -n '/^training throughput/,$p' "$work/train.txt"; echo '```'; } >"$work/train-bench.md"
  "$py" - "$work/train.json" >"$work/train-bench.detail" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(", ".join("%s %.0f" % (k, v) for k, v in j.items()
                if isinstance(v, (int, float)) and k not in ("batch", "steps")) + " samples/s")
PY
}

export -f use_prefix needs_gpu alone_gpu
export do_build
step env 30 env_step
step prefix 120 prefix_step
use_prefix
export PATH PKG_CONFIG_PATH data
[ -n "${PREFIX_LIB:-}" ] && export PREFIX_LIB
step build 300 build_step
if [ "${results[-1]}" = failed ]; then
  echo "check: the build failed; the steps after it are not run" >&2
else
  step parity 120 parity_step
  step quickstart 150 quickstart_step
  step mlp 60 mlp_step
  step cnn-f32 60 cnn_f32_step
  step cnn-bf16 60 cnn_bf16_step
  step cnn-f16 60 cnn_f16_step
  step gemm 90 gemm_step
  step torch 240 torch_step
  step train-bench 240 train_bench_step
fi

# ---- the report
np=0 nf=0 ns=0
for r in "${results[@]}"; do
  case $r in passed) np=$((np + 1)) ;; failed) nf=$((nf + 1)) ;; *) ns=$((ns + 1)) ;; esac
done
{
  echo "# psd GPU check"
  echo
  echo "mode: $([ "$gpu" = yes ] && echo gpu || echo no-gpu)$([ "$quick" = 1 ] && echo ', quick'), $(($(date +%s) - started)) s of a $budget s budget"
  echo
  cat "$work/env.md" 2>/dev/null
  echo
  echo "| step | result | seconds | what it measured |"
  echo "| --- | --- | --- | --- |"
  for i in "${!names[@]}"; do
    d=$(tr '\n|' ' /' <"$work/${names[$i]}.detail")
    echo "| ${names[$i]} | ${results[$i]} | ${secs[$i]} | ${d% } |"
  done
  echo
  for i in "${!names[@]}"; do
    n=${names[$i]}
    if [ -s "$work/$n.md" ] && [ "$n" != env ]; then echo "## $n"; echo; cat "$work/$n.md"; echo; fi
    if [ "${results[$i]}" = failed ]; then
      echo "## $n failed: the end of its log"; echo; echo '```'
      awk -v s="=== $n (" 'index($0, s) == 1 {p = 1; buf = ""; next} p && /^=== / {p = 0} p {print}' "$steplog" | tail -n 30
      echo '```'; echo
    fi
  done
  echo "check: $np passed, $nf failed, $ns skipped"
} >"$report"
rm -rf "$work"
echo "check: report in $report" >&2
tail -n 1 "$report"
[ "$nf" = 0 ]
