#!/usr/bin/env bash
# Prints the drill suite's table from the lines each drill recorded (host/tests/support/drill.rs).
# Usage: scripts/drill-report.sh TARGET_DIR
set -euo pipefail
dir="${1:?usage: drill-report.sh TARGET_DIR}/tmp/drills"
if ! ls "$dir"/*.txt >/dev/null 2>&1; then
  echo "no drill recorded a result in $dir" >&2
  exit 1
fi
{
  printf 'drill\tbound\tmeasured\tverdict\n'
  cat "$dir"/*.txt | sort
} | if command -v column >/dev/null; then column -t -s $'\t'; else cat; fi
! grep -q $'\tFAILED$' "$dir"/*.txt
