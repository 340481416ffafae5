#!/usr/bin/env bash
# `make run`: the daemon with the example packages installed, on a state directory inside the
# target folder (so it never touches the operator's real one).
#
# Usage: scripts/run-demo.sh TARGET_DIR
# Stages the examples (already built by make), installs them, starts `conduit daemon run`,
# waits until every extension is ready, shows their status and a call, then keeps the daemon
# in the foreground until Ctrl-C (which stops every extension gracefully).
set -euo pipefail
target=${1:?usage: run-demo.sh TARGET_DIR}
conduit="$target/debug/conduit"
export CONDUIT_STATE_DIR="$target/demo-state"
packages="$target/packages"

scripts/stage-examples.sh debug "$packages" >/dev/null
for p in "$packages"/*/; do
  "$conduit" ext install "$p" 2>/dev/null
done

"$conduit" daemon run &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon' INT TERM

for _ in $(seq 1 100); do
  if "$conduit" ext status >/dev/null 2>&1; then break; fi
  sleep 0.1
done
echo
"$conduit" ext list
echo
show() { echo "\$ conduit $*"; "$conduit" "$@"; }
show ext call echo echo '{"text":"hello from conduit"}'
# A few notes: the trigger groups them by thread, a wait for @dora is satisfied by the one
# that mentions her, a digest timer fires and is rescheduled, an annotation is committed.
run_id=$(date +%s)
show waits add mentions dora
show timers add digest "every 15m"
for i in 1 2 3 4; do
  thread=$(( i % 2 ))
  text="note $i in thread $thread"
  [ "$i" = 4 ] && text="note $i: thanks @dora"
  show events push --source notes-inbox --delivery-id "demo-$run_id-$i" --kind note.posted \
    --payload "{\"thread\":\"t-$thread\",\"author\":\"demo\",\"text\":\"$text\"}"
done
show emissions add annotation '{"text":"a short note about the demo"}'
sleep 1.5
show work list
show ext status notes
echo
echo "The daemon runs (pid $daemon) on $CONDUIT_STATE_DIR. In another terminal:"
echo "  CONDUIT_STATE_DIR=$CONDUIT_STATE_DIR $conduit ext status notes"
echo "Ctrl-C stops it."
wait $daemon
