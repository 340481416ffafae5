#!/usr/bin/env bash
# `make run`: the daemon with the example packages installed, on a state directory inside the
# target folder (so it never touches the operator's real one).
#
# Usage: scripts/run-demo.sh TARGET_DIR
# Stages the examples (already built by make), installs them, starts `conduit daemon run` with
# its log in a file (named on screen), waits until every extension is ready, then runs a few
# commands, each printed first as a line that can be pasted back into a shell, and shows how
# the wait, the timer and the emission it creates turned out. The daemon then stays up until
# Ctrl-C, which stops it gracefully and ends the demo with exit 0 (so make reports no error).
set -euo pipefail
target=${1:?usage: run-demo.sh TARGET_DIR}
conduit="$target/debug/conduit"
export CONDUIT_STATE_DIR="$target/demo-state"
packages="$target/packages"
log="$target/demo-daemon.log"

# One argument as the shell reads it back: bare when it is plain, else in single quotes.
quote() {
  case $1 in
    '' | *[!A-Za-z0-9_./:=@%+,-]*) printf "'%s'" "${1//\'/\'\\\'\'}" ;;
    *) printf '%s' "$1" ;;
  esac
}
# Print `$ conduit ARGS…` (paste-safe), then run it.
show() {
  local line="\$ conduit"
  for a in "$@"; do line+=" $(quote "$a")"; done
  echo "$line"
  "$conduit" "$@"
}

scripts/stage-examples.sh debug "$packages" >/dev/null
# A demo from the last build: the same version with new binaries is a changed reinstall.
for p in "$packages"/*/; do
  "$conduit" ext install --force --no-wait --quiet "$p" >/dev/null
done

: >"$log"
"$conduit" daemon run 2>>"$log" &
daemon=$!
stop() {
  trap - INT TERM
  echo
  echo "stopping the daemon (pid $daemon) …"
  kill -TERM "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  echo "stopped; its log is $log"
  exit 0
}
trap stop INT TERM

for _ in $(seq 1 100); do
  if "$conduit" ext status >/dev/null 2>&1; then break; fi
  sleep 0.1
done
cat <<EOF
The daemon runs (pid $daemon); its log: $log
To use these commands in another terminal:
  alias conduit=$(quote "$conduit")
  export CONDUIT_STATE_DIR=$(quote "$CONDUIT_STATE_DIR")

EOF
show ext list
echo
show ext call echo echo '{"text":"hello from conduit"}'
echo
# A few notes: the trigger groups them by thread, a wait for @dora is satisfied by the one that
# mentions her, a digest timer fires and is rescheduled, an annotation is committed.
run_id=$(date +%s)
# `add` prints `wait 1`, `timer 1`, `emission 1 (commit …)`: the second word is the id.
id_of() { sed -n "s/^$1 \([0-9][0-9]*\).*/\1/p"; }
out=$(show waits add mentions dora) && echo "$out"
wait_id=$(id_of wait <<<"$out")
out=$(show timers add digest "every 15m") && echo "$out"
timer_id=$(id_of timer <<<"$out")
for i in 1 2 3 4; do
  thread=$((i % 2))
  text="note $i in thread $thread"
  [ "$i" = 4 ] && text="note $i: thanks @dora"
  show events push --source notes-inbox --delivery-id "demo-$run_id-$i" --kind note.posted \
    --payload "{\"thread\":\"t-$thread\",\"author\":\"demo\",\"text\":\"$text\"}"
done
out=$(show emissions add annotation '{"text":"a short note about the demo"}') && echo "$out"
emission_id=$(id_of emission <<<"$out")
# The host loop makes a pass at once when nudged, and at least every second: wait (bounded)
# until the wait is satisfied and the emission is no longer planned.
for _ in $(seq 1 50); do
  w=$("$conduit" waits show "$wait_id" --json 2>/dev/null || true)
  e=$("$conduit" emissions show "$emission_id" --json 2>/dev/null || true)
  case $w$e in *'"state": "active"'* | *'"state": "planned"'*) sleep 0.2 ;; *) break ;; esac
done
echo
show work list
echo
show waits show "$wait_id"
echo
show timers show "$timer_id"
echo
show emissions show "$emission_id"
echo
show ext status notes
echo
echo "Ctrl-C stops the daemon."
wait "$daemon" || true
trap - INT TERM
echo "the daemon exited; its log is $log"
