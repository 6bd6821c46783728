#!/usr/bin/env bash
# Run a long job on a GPU host whose calls are cut at a time limit: start it detached (its own process
# session, so it outlives the call that started it), then wait for it from later calls.
#
#   bash scripts/gpu/detach.sh start NAME COMMAND...   # returns at once; logs to $JOBS/NAME.log
#   bash scripts/gpu/detach.sh wait NAME [SECONDS]     # waits up to SECONDS (default 540) and prints the log's tail;
#                                                      # exit 0 once the job ended (its status in $JOBS/NAME.rc), 3 if
#                                                      # it is still running
#   bash scripts/gpu/detach.sh stop NAME               # ends the job and everything it started
#
# $JOBS defaults to /tmp/masrl-jobs (/tmp survives between calls while the host stays warm). The environment
# of the starting call (e.g. after `source scripts/gpu/setup.sh`) is the job's.
set -uo pipefail
JOBS=${JOBS:-/tmp/masrl-jobs}
mkdir -p "$JOBS"
cmd=${1:-}; name=${2:-}
[ -n "$cmd" ] && [ -n "$name" ] || { echo "usage: $0 start|wait|stop NAME ..." >&2; exit 2; }
case $name in *[!A-Za-z0-9._-]*) echo "NAME may hold letters, digits, '.', '_' and '-' only: '$name'" >&2; exit 2 ;; esac
log="$JOBS/$name.log"; rc="$JOBS/$name.rc"; pid="$JOBS/$name.pid"
case $cmd in
  start)
    shift 2
    [ $# -gt 0 ] || { echo "start $name: no command given" >&2; exit 2; }
    if [ -f "$pid" ] && [ ! -f "$rc" ] && kill -0 "$(cat "$pid")" 2>/dev/null; then
      echo "job '$name' is already running (pid $(cat "$pid")); wait for it or stop it" >&2; exit 2
    fi
    rm -f "$rc"
    setsid bash -c '"$@"; echo $? > "$0"' "$rc" "$@" > "$log" 2>&1 < /dev/null &
    echo $! > "$pid"
    echo "started job '$name' (pid $!), log $log"
    ;;
  wait)
    limit=${3:-540}; waited=0
    while [ ! -f "$rc" ] && [ "$waited" -lt "$limit" ]; do sleep 5; waited=$((waited + 5)); done
    tail -n 20 "$log" 2>/dev/null
    if [ -f "$rc" ]; then echo "job '$name' ended with status $(cat "$rc")"; exit 0; fi
    if [ ! -f "$pid" ]; then echo "no job '$name' was started here" >&2; exit 2; fi
    if ! kill -0 "$(cat "$pid")" 2>/dev/null; then echo "job '$name' is gone without a status (killed?)" >&2; exit 1; fi
    echo "job '$name' still running after ${waited}s"; exit 3
    ;;
  stop)
    [ -f "$pid" ] || { echo "no job '$name' was started here" >&2; exit 2; }
    kill -- -"$(cat "$pid")" 2>/dev/null; sleep 2; kill -9 -- -"$(cat "$pid")" 2>/dev/null
    echo "stopped job '$name'"
    ;;
  *) echo "unknown command '$cmd': start, wait or stop" >&2; exit 2 ;;
esac
