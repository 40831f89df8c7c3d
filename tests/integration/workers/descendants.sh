#!/bin/sh
# Worker that leaves descendants behind in every way a worker can, then does ACTION.
# Usage: descendants.sh OUTDIR ACTION [NPROC]   with ACTION one of
#   exit:N       exit with status N at once
#   wait         sleep until killed
#   ignore_term  ignore SIGTERM (and SIGINT, SIGHUP) and sleep until SIGKILLed
# Each descendant writes its pid to OUTDIR/<kind>_<LOCAL_RANK> once it runs; the worker writes
# OUTDIR/ready_<LOCAL_RANK> when all four are running, then, given NPROC, waits until every
# local rank below NPROC is ready before it does ACTION.
out="$1"
action="$2"
nproc="${3:-0}"
r="$LOCAL_RANK"

# A plain child in the worker's process group, holding the worker's stdout pipe.
sh -c 'echo $$ > "$0.tmp"; mv "$0.tmp" "$0"; exec sleep 300' "$out/child_$r" &
# A child that ignores the polite signals.
(trap '' TERM INT HUP QUIT; exec sh -c 'echo $$ > "$0.tmp"; mv "$0.tmp" "$0"; exec sleep 301' "$out/stubborn_$r") &
# A grandchild in a session of its own (setsid), detached from the worker's group.
setsid sh -c 'echo $$ > "$0.tmp"; mv "$0.tmp" "$0"; exec sleep 302' "$out/session_$r" </dev/null >/dev/null 2>&1 &
# A double-forked daemon: its parent exits at once, it is in a new session, ignores TERM, stdio closed.
( (trap '' TERM INT HUP QUIT; exec setsid sh -c 'echo $$ > "$0.tmp"; mv "$0.tmp" "$0"; exec sleep 303' "$out/daemon_$r" \
     </dev/null >/dev/null 2>&1) & )

for kind in child stubborn session daemon; do
  while [ ! -f "$out/${kind}_$r" ]; do sleep 0.01; done
done
echo $$ > "$out/ready_$r.tmp"
mv "$out/ready_$r.tmp" "$out/ready_$r"
peer=0
while [ "$peer" -lt "$nproc" ]; do
  while [ ! -f "$out/ready_$peer" ]; do sleep 0.01; done
  peer=$((peer + 1))
done

case "$action" in
  exit:*) exit "${action#exit:}" ;;
  wait) while :; do sleep 60; done ;;
  ignore_term)
    trap '' TERM INT HUP QUIT
    while :; do sleep 60; done ;;
  *) echo "descendants.sh: unknown action $action" >&2; exit 99 ;;
esac
