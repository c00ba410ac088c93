#!/bin/bash
# usage: [BASE=bin] [NEW=bin] iwlat-ab.sh ROUNDS OUT (issue 18, session 15); alternates base and new for the six busy benches and the --events one
R=$1; OUT=$2; : > $OUT
BASE=${BASE:-/tmp/softrdma.base-iwlat}; NEW=${NEW:-/tmp/softrdma.new-iwlat}   # the two binaries to alternate
for r in $(seq 1 $R); do
 for cmd in "send --lat --size 8 --iters 20000" "write --lat --size 8 --iters 20000" "read --lat --size 8 --iters 20000" \
            "send --lat --size 64 --iters 20000" "write --lat --size 64 --iters 20000" "read --lat --size 64 --iters 20000" \
            "send --lat --events --size 8 --iters 5000"; do
  for b in base new; do
   if [ $b = base ]; then X=$BASE; else X=$NEW; fi
   la=$(cut -d' ' -f1 /proc/loadavg)
   res=$($X bench $cmd --baseline tcp --json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["lat"]["p50_us"], d["baseline"]["lat"]["p50_us"], d["baseline"]["ratio"])' 2>&1)
   echo "$r|$cmd|$b|$la|$res" >> $OUT
  done
 done
done
