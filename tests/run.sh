#!/usr/bin/env bash
# The one test command: installs dependencies, builds with ASan+UBSan in its
# own build directory, runs every meson test, and ends with one line
#   tests: N passed, M failed, K skipped
# Exit status is non-zero when anything failed (or the build did).
set -uo pipefail
cd "$(dirname "$0")/.."

BUILD=${PSD_TEST_BUILD_DIR:-build-test}

summary() { echo "tests: $1 passed, $2 failed, $3 skipped"; }

if ! deploy/install-deps.sh; then
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
summary "$passed" "$failed" "$skipped"
if [ "$failed" -ne 0 ] || [ "$test_rc" -ne 0 ]; then
  exit 1
fi
exit 0
