#!/bin/sh
# Worker that records which signal reached it: usage trap_signals.sh OUTDIR [EXIT_STATUS]
# Traps INT, TERM, HUP, QUIT, USR1 and USR2; on one it writes the signal's name to OUTDIR/sig_<LOCAL_RANK>
# and exits with EXIT_STATUS (default 0). OUTDIR/ready_<LOCAL_RANK> (its pid) means "traps set".
out="$1"
status="${2:-0}"
for s in INT TERM HUP QUIT USR1 USR2; do
  trap "echo $s > '$out/sig_$LOCAL_RANK.tmp'; mv '$out/sig_$LOCAL_RANK.tmp' '$out/sig_$LOCAL_RANK'; exit $status" $s
done
echo $$ > "$out/ready_$LOCAL_RANK.tmp"
mv "$out/ready_$LOCAL_RANK.tmp" "$out/ready_$LOCAL_RANK"
while :; do
  sleep 60 &
  wait $!
done
