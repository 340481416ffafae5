#!/usr/bin/env bash
# Builds the fuzz targets in fuzz/ with cargo-fuzz (on the stable toolchain: no sanitizer) and
# runs each for a bounded time, one after the other, then prints one line per target: executions,
# the coverage libFuzzer reports, the corpus size, and whether it found anything.
#
# Usage: scripts/fuzz.sh SECONDS_PER_TARGET FUZZ_DIR [TARGET...]
#   FUZZ_DIR holds the build, the growing corpus (corpus/T), crash inputs (artifacts/T) and the
#   logs (logs/T.log); the checked-in seeds (fuzz/seeds/T) are read, never written.
# Exits 1 if any target found a failing input (its path is printed), 2 if a run could not start.
set -euo pipefail

CARGO_FUZZ_VERSION=0.13.2
seconds="${1:?usage: fuzz.sh SECONDS FUZZ_DIR [TARGET...]}"
dir="${2:?usage: fuzz.sh SECONDS FUZZ_DIR [TARGET...]}"
shift 2
root="$(cd "$(dirname "$0")/.." && pwd)"
cargo="${CARGO:-cargo}"

# The input size limit per target: the frame reader needs lines past the 4 KiB head to reach
# its oversized paths at the head-sized caps; archives need room for a few 512-byte headers.
max_len() {
  case "$1" in
    frame_reader) echo 16384 ;;
    archive) echo 32768 ;;
    *) echo 4096 ;;
  esac
}

if [ "$($cargo fuzz --version 2>/dev/null || true)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]; then
  echo "installing cargo-fuzz $CARGO_FUZZ_VERSION"
  $cargo install --locked "cargo-fuzz@$CARGO_FUZZ_VERSION"
fi

cd "$root"
targets=("$@")
# `-s none`: the sanitizers need a nightly compiler; coverage instrumentation and libFuzzer do not.
build() { $cargo fuzz build -s none --target-dir "$dir" "$@"; }
if [ ${#targets[@]} -eq 0 ]; then
  build
  mapfile -t targets < <($cargo fuzz list)
else
  for t in "${targets[@]}"; do build "$t"; done
fi
bin="$dir/$(rustc -vV | sed -n 's/^host: //p')/release"

mkdir -p "$dir/logs"
found=0
rows=()
for t in "${targets[@]}"; do
  corpus="$dir/corpus/$t"
  artifacts="$dir/artifacts/$t"
  log="$dir/logs/$t.log"
  mkdir -p "$corpus" "$artifacts"
  echo "fuzzing $t for ${seconds}s (log: $log)"
  status=0
  "$bin/$t" "$corpus" "fuzz/seeds/$t" \
    -max_total_time="$seconds" -max_len="$(max_len "$t")" -timeout=20 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" >"$log" 2>&1 || status=$?
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
  # The last status line, e.g. "#123456	DONE   cov: 1234 ft: 5678 corp: 90/12Kb exec/s: 2000".
  last="$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)"
  cov="$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$last")"
  ft="$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")"
  corp="$(sed -nE 's/.* corp: ([0-9]+\/[0-9]+[a-zA-Z]*).*/\1/p' <<<"$last")"
  if [ "$status" -eq 0 ]; then
    verdict="nothing found"
  else
    found=1
    written="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)"
    verdict="FOUND (exit $status): ${written:-see $log}"
    grep -m 3 -E "panicked at|SUMMARY|ERROR" "$log" | sed 's/^/    /' || true
  fi
  rate="-"
  if [ "$status" -eq 0 ] && [ -n "$execs" ]; then rate="$((execs / seconds))/s"; fi
  rows+=("$t	${seconds}s	${execs:-?}	$rate	${cov:-?}	${ft:-?}	${corp:-?}	$verdict")
done

{
  printf 'target\ttime\texecutions\trate\tcov\tft\tcorpus(units/size)\tresult\n'
  printf '%s\n' "${rows[@]}"
} | if command -v column >/dev/null; then column -t -s $'\t'; else cat; fi
exit "$found"
