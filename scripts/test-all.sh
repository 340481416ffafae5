#!/usr/bin/env bash
# `make test`: runs every suite even when one fails, then prints one line per suite and fails
# if any failed. Suites: rust (every crate's unit and integration tests, the drills among
# them; not the benchmarks), doc (the doc tests), python (the Python example's own tests),
# python-sdk (extensions/python's tests, its test kit's among them), layout (scripts/layout: the
# source layout's rules) and node-sdk (extensions/node's, its test kit's, and the Node examples').
# The examples' own tests (written with the kit) run in their staged folders
# ($CARGO_TARGET_DIR/packages, as `make stage` leaves them), where staging put their SDK and its
# kit. The Rust examples' kit tests are in the rust suite, and so is the run of each generated
# skeleton's own tests (host/tests/sdks.rs).
# Failure output is printed as it happens and again at the end, never under a progress bar.
#
# Usage: scripts/test-all.sh            (CARGO and CARGO_TARGET_DIR are honoured)
set -uo pipefail
cd "$(dirname "$0")/.."
cargo="${CARGO:-cargo}"
target="${CARGO_TARGET_DIR:-$PWD/target}"

names=() results=() times=()
total_passed=0 total_failed=0
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

# Counts the tests a suite's runner reported passed and failed (nextest's Summary line, cargo
# test's "test result" lines, unittest's "Ran N tests" and "FAILED (failures=F, errors=E)",
# node --test's "# pass N" and "# fail N").
count_tests() {
  python3 - "$1" <<'PY'
import re, sys
text = open(sys.argv[1], errors="replace").read()
passed = failed = 0
m = re.findall(r"Summary \[.*?\] +(\d+) tests? run: (\d+) passed(?:.*?(\d+) failed)?", text)
if m:
    # Whatever ran and did not pass failed: nextest reports timeouts apart from failures.
    for run, p, f in m:
        passed += int(p); failed += int(run) - int(p)
else:
    for p, f in re.findall(r"test result: \w+\. (\d+) passed; (\d+) failed", text):
        passed += int(p); failed += int(f)
    for n in re.findall(r"^Ran (\d+) tests?", text, re.M):
        bad = sum(int(x) for x in re.findall(r"(?:failures|errors)=(\d+)", text))
        passed += int(n) - bad; failed += bad
    for p, f in re.findall(r"^# pass (\d+)\n# fail (\d+)", text, re.M):
        passed += int(p); failed += int(f)
print(passed, failed)
PY
}

run_suite() {
  local name="$1"; shift
  echo
  echo "=== suite $name: $*"
  local t0=$SECONDS
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local p f
  read -r p f < <(count_tests "$log")
  total_passed=$((total_passed + p)) total_failed=$((total_failed + f))
  names+=("$name")
  times+=("$((SECONDS - t0))")
  if [ "$rc" -eq 0 ]; then results+=("passed ($p tests)"); else results+=("FAILED (exit $rc; $p passed, $f failed)"); fi
}

# The telemetry tests parse /v1/metrics with Prometheus's own text parser (pure Python, from
# PyPI); install it for this user when it is missing, so `make test` works on a fresh machine.
if ! python3 -c 'import prometheus_client' 2>/dev/null; then
  echo "installing the Python package prometheus_client (the tests' Prometheus text parser)"
  python3 -m pip install --quiet --disable-pip-version-check --user prometheus_client 2>/dev/null \
    || python3 -m pip install --quiet --disable-pip-version-check --user --break-system-packages prometheus_client \
    || echo "could not install prometheus_client: the metrics test will fail; install it with pip" >&2
fi

rm -rf "$target/tmp/drills" # each drill writes its line afresh

# The benchmarks' own tests (conduit-bench: the budget gate and its negative controls) are
# timing measurements; they run in `make check`, alone, not here.
if "$cargo" nextest --version >/dev/null 2>&1; then
  run_suite rust "$cargo" nextest run --workspace --exclude conduit-bench --no-fail-fast \
    --hide-progress-bar --failure-output immediate-final --final-status-level fail
else
  run_suite rust "$cargo" test --workspace --exclude conduit-bench --no-fail-fast
fi
run_suite doc "$cargo" test --workspace --exclude conduit-bench --doc
packages="$target/packages"
scripts/stage-examples.sh dev "$packages" >/dev/null \
  || echo "staging the examples into $packages failed (above): the python and node-sdk suites fail" >&2
run_suite python python3 -B -m unittest discover -s "$packages/python-echo" -p 'test_*.py'
run_suite python-sdk python3 -m unittest discover -s extensions/python/tests -p 'test_*.py'
# The source layout's rules (no import circle between files, no file over 700 lines without a
# reason): the checker's own tests and its run over this checkout.
run_suite layout python3 -m unittest discover -s scripts/layout -p 'test_*.py'
if command -v node >/dev/null; then
  run_suite node-sdk node --test extensions/node/test/sdk.test.mjs extensions/node/test/testing.test.mjs \
    "$packages/node-notes/test.mjs" "$packages/node-notes/kit.test.mjs" "$packages/node-echo/echo.test.mjs"
else
  echo "node is not installed: the node-sdk suite is not run (.ci/run installs it)" >&2
  names+=(node-sdk) times+=(0) results+=("FAILED (node is not installed)")
fi

if ls "$target"/tmp/drills/*.txt >/dev/null 2>&1; then
  echo
  echo "=== drills (each drill's bound and what it measured)"
  scripts/drill-report.sh "$target" || true
fi

echo
echo "=== summary"
failed=0
for i in "${!names[@]}"; do
  printf 'suite %-10s %s in %ss\n' "${names[$i]}" "${results[$i]}" "${times[$i]}"
  case "${results[$i]}" in passed*) ;; *) failed=$((failed + 1)) ;; esac
done
echo "suites: $(( ${#names[@]} - failed )) passed, $failed failed"
echo "tests: $total_passed passed, $total_failed failed"
[ "$failed" -eq 0 ]
