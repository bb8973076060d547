#!/usr/bin/env bash
# call1.sh - run 34, call 1: the checks of the one bitonic sort (x_bitonic, block and warp merge
# by width and barrier; built, not yet run) and v24's count by pairs rebuilt without its array
# (variant bit 0; run 33's spilled version cost +1.3 ms). The statistics kernel has STACK 0 in
# every mode-2 instantiation now.
# Prediction: the checks pass unchanged (the sort is the same network); the pairs' kernel at
# A 16K within +-0.2 ms of v22's count (the array's spill was the whole +1.3 ms; the pairs'
# fewer instructions, ~130 M -> ~60 M in the count loops, give back ~0.25 ms at 4 ms / G).
#   here:   scripts/device/bundle.sh && make python/spanhead/_spanhead.abi3.so
#   device: bash bench/results/2026-12-02-h200-run34/call1.sh
#           carry [".devbundle.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
. scripts/device/call_common.sh
[ -z "${NO_CHECKS:-}" ] && extras_checks
NCU=/usr/local/cuda/bin/ncu
A="$S bench --shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2"
M=gpu__time_duration.sum,smsp__inst_executed.sum
for v in 0 1; do
  SPH_TEST_TOPK_VARIANT=$v step ncu_v$v 120 $NCU --clock-control none --metrics $M --csv $A
done
P="--shape A,E --N 16K --active 1 --mask response --topk 64 --sum-p2"
step bench_general 100 $S bench $P --mode general --json "$R/bench_general.jsonl"
SPH_TEST_TOPK_VARIANT=1 step bench_general_v1 100 $S bench $P --mode general --json "$R/bench_general_v1.jsonl"
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
[ -z "${NO_CHECKS:-}" ] && extras_report
for v in 0 1; do
  echo "== variant $v"; ncu_table "$R/ncu_v$v.log" "2, 1>" topk_merge topk_seed | tail -n 8
done
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"; grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -12; done
tar czf "$OUT/call1.tgz" -C "$R" .
