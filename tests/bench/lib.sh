# Shell functions the training benchmarks share (sourced by
# train_bench.sh, torch_bench.sh and pipeline_bench.sh). bench_setup sets
# what the others expect: $psd (the psd binary), $psw, $run (a scratch
# folder), and the arrays pids and psd_opts.

# Builds $build (release) unless do_build is 0, sets psd, psw, run (a new
# folder /tmp/NAME.XXXXXX), pids and psd_opts, and stops what pids holds
# when the script exits.
bench_setup() { # name
  if [ "$do_build" = 1 ]; then
    if [ ! -f "$build/build.ninja" ]; then meson setup "$build" -Dbuildtype=release >/dev/null; fi
    ninja -C "$build" >/dev/null
  fi
  psd="$build/server/psd" psw="$build/worker/psworker"
  run=$(mktemp -d "/tmp/$1.XXXXXX")
  pids=() psd_opts=()
  trap bench_cleanup EXIT INT TERM
}
bench_cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }

# The summed samples_per_sec of the summary files given.
sps() { python3 -c 'import json,sys; print("%.1f" % sum(json.load(open(f))["samples_per_sec"] for f in sys.argv[1:]))' "$@"; }
# The median of the numbers given.
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

# Starts SHARDS psd shards for WORKERS workers in CONSISTENCY on free
# ports (psd_opts added), and sets servers to their endpoints.
start_shards() { # shards workers consistency -> sets servers
  servers=""
  local n=$1 w=$2 mode=$3 i t
  for ((i = 0; i < n; i++)); do
    rm -f "$run/ep$i"
    "$psd" --listen tcp://127.0.0.1:0 --endpoint-file "$run/ep$i" --shard "$i" --shards "$n" \
      --consistency "$mode" --workers "$w" "${psd_opts[@]}" 2>"$run/psd$i.log" &
    pids+=($!)
  done
  for ((i = 0; i < n; i++)); do
    for ((t = 0; t < 2000; t++)); do [ -s "$run/ep$i" ] && break; sleep 0.01; done
    [ -s "$run/ep$i" ] || { echo "psd $i did not start" >&2; cat "$run/psd$i.log" >&2; exit 1; }
    servers+="${servers:+,}$(cat "$run/ep$i")"
  done
}

stop_shards() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
