#!/usr/bin/env bash
# call3.sh - run 33, call 3: v24, from call 2's per-instruction counts (the statistics kernel
# with top-k 64 + sum_p2 at A 16K, +513 M instructions over plain: the two count loops ~130 M,
# their stage pointer's 64-step dependent chain the loops' stall; the emission loops ~124 M,
# 45 instructions per candidate at 4.2 iterations per warp and row half; barrier spins ~150 M):
#   (1) the count by pairs of columns (one FSETP, STS.64 and pointer step per pair, the row's
#       maximum a tree over the pair maxima): the chain 64 -> a few, the loop's instructions
#       4 -> ~1.5 per logit;
#   (2) the emission with its pointers formed once, one 8-byte store, no branches: ~20
#       instructions per candidate;
#   (3) the seed at the sample's s-th largest logit, s the smallest rank a Poisson model of
#       the row's top K - 1 in the sample exceeds with probability <= 2^-30 (13 at A, K = 64,
#       instead of K: the seed at the row's ~800th largest logit instead of ~3900th): the
#       candidates per row ~1350 -> ~500 and the emission's iterations with them.
# Prediction: the statistics kernel's extra 1.9 -> ~0.7 ms at A 16K, the merge 0.20 -> ~0.12,
# general A +3 .. +5 %, E +1 .. +2 %. SPH_TEST_TOPK_VARIANT: 1 v22's count, 2 the block merge,
# 4 the seed at the K-th (correct lists either way).
#   here:   scripts/device/bundle.sh && make python/spanhead/_spanhead.abi3.so
#   device: bash bench/results/2026-12-02-h200-run33/call3.sh
#           carry [".devbundle.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
. scripts/device/call_common.sh
[ -z "${NO_CHECKS:-}" ] && extras_checks
NCU=/usr/local/cuda/bin/ncu
A="$S bench --shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2"
M=gpu__time_duration.sum,smsp__inst_executed.sum
for v in 0 1 4 5; do
  SPH_TEST_TOPK_VARIANT=$v step ncu_v$v 120 $NCU --clock-control none --metrics $M --csv $A
done
for v in 0 4; do
  SPH_TEST_TOPK_VARIANT=$v SPH_TEST_TOPK_COUNT=1 step count_v$v 60 $S bench --shape A,E --N 16K \
    --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2
done
P="--shape A,E --N 16K --active 1 --mask response --topk 64 --sum-p2"
step bench_general 100 $S bench $P --mode general --json "$R/bench_general.jsonl"
step bench_onepass 100 $S bench $P --mode one-pass --json "$R/bench_onepass.jsonl"
SPH_TEST_TOPK_VARIANT=5 step bench_general_v5 100 $S bench $P --mode general --json "$R/bench_general_v5.jsonl"
step bench_a32k 100 $S bench --shape A --N 32K --active 1 --mask response --topk 64 --sum-p2 --mode both --json "$R/bench_a32k.jsonl"
step bench_k256 100 $S bench --shape A --N 16K --active 1 --topk 256 --sum-p2 --mode both --json "$R/bench_k256.jsonl"
step bench_policy 120 $S bench --shape A,B,D --N 16K --active 1 --mask response --mode policy --topk 64 --sum-p2 --json "$R/bench_policy.jsonl"
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
[ -z "${NO_CHECKS:-}" ] && extras_report
for v in 0 1 4 5; do
  echo "== variant $v"; ncu_table "$R/ncu_v$v.log" "2, 1>" topk_merge topk_seed | tail -n 8
done
for v in 0 4; do echo "== counts, variant $v"; grep -h "spanhead top-k" "$R/count_v$v.log" | sort | uniq -c | head -6; done
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"; grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -12; done
tar czf "$OUT/call3.tgz" -C "$R" .
