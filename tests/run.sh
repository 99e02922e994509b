#!/usr/bin/env bash
# The one test command: installs dependencies, builds with ASan+UBSan in its
# own build directory, runs every meson test, and ends with one line
#   tests: N passed, M failed, K skipped
# Exit status is non-zero when anything failed (or the build did).
set -uo pipefail
cd "$(dirname "$0")/.."

BUILD=${PSD_TEST_BUILD_DIR:-build-test}

summary() { echo "tests: $1 passed, $2 failed, $3 skipped"; }

if ! deploy/install-deps.sh test; then
  echo "run.sh: installing dependencies failed" >&2
  summary 0 1 0
  exit 1
fi

if [ ! -f "$BUILD/build.ninja" ]; then
  if ! meson setup "$BUILD" -Dbuildtype=debug -Db_sanitize=address,undefined; then
    summary 0 1 0
    exit 1
  fi
fi
if ! meson compile -C "$BUILD"; then
  echo "run.sh: build failed" >&2
  summary 0 1 0
  exit 1
fi

meson test -C "$BUILD" --print-errorlogs --num-processes "$(nproc)" "$@"
test_rc=$?

# Fuzzing: each libFuzzer target runs for a bounded time from the seed
# corpus in tests/fuzz/corpus; a crash, leak, sanitizer report or an input
# that takes over 10 s fails it. PSD_FUZZ_SECONDS=0 skips this phase.
fuzz_seconds=${PSD_FUZZ_SECONDS:-60}
fuzz_pass=0 fuzz_fail=0 fuzz_skip=0
fuzz_targets=(wire dispatch checkpoint replies records)
if [ "$fuzz_seconds" -gt 0 ] && command -v clang >/dev/null; then
  FUZZ_BUILD=${PSD_FUZZ_BUILD_DIR:-build-fuzz}
  if [ ! -f "$FUZZ_BUILD/build.ninja" ]; then
    CC=clang meson setup "$FUZZ_BUILD" -Dfuzz=enabled -Dcuda=disabled -Dbuildtype=debugoptimized \
      -Db_sanitize=address,undefined -Db_lundef=false >"${TMPDIR:-/tmp}/psd-fuzz-setup.log" 2>&1 ||
      { cat "${TMPDIR:-/tmp}/psd-fuzz-setup.log" >&2; }
  fi
  if ninja -C "$FUZZ_BUILD" "${fuzz_targets[@]/#/tests/fuzz_}" >/dev/null; then
    for t in "${fuzz_targets[@]}"; do
      corpus="$FUZZ_BUILD/corpus-$t"
      rm -rf "$corpus" && mkdir -p "$corpus" && cp tests/fuzz/corpus/$t/* "$corpus/"
      log="$FUZZ_BUILD/fuzz_$t.log"
      if ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 \
         UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
         timeout $((fuzz_seconds + 120)) "$FUZZ_BUILD/tests/fuzz_$t" -max_total_time="$fuzz_seconds" \
           -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$FUZZ_BUILD/" "$corpus" >"$log" 2>&1; then
        echo "fuzz_$t: OK ($(grep -E '^Done' "$log"))"
        fuzz_pass=$((fuzz_pass + 1))
      else
        echo "fuzz_$t: FAILED; the end of $log:" >&2
        tail -40 "$log" >&2
        fuzz_fail=$((fuzz_fail + 1))
      fi
    done
  else
    echo "run.sh: building the fuzz targets failed" >&2
    fuzz_fail=$((fuzz_fail + ${#fuzz_targets[@]}))
  fi
else
  fuzz_skip=${#fuzz_targets[@]}
fi

# Count from meson's machine-readable log, not from its exit code alone.
read -r passed failed skipped < <(python3 - "$BUILD/meson-logs/testlog.json" <<'PY'
import json, sys
p = f = s = 0
try:
    for line in open(sys.argv[1]):
        r = json.loads(line).get("result")
        if r in ("OK", "EXPECTEDFAIL"):
            p += 1
        elif r == "SKIP":
            s += 1
        else:
            f += 1
except OSError:
    f = 1
print(p, f, s)
PY
)
passed=$((passed + fuzz_pass)) failed=$((failed + fuzz_fail)) skipped=$((skipped + fuzz_skip))
summary "$passed" "$failed" "$skipped"
if [ "$failed" -ne 0 ] || [ "$test_rc" -ne 0 ]; then
  exit 1
fi
exit 0
