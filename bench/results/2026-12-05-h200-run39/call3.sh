#!/usr/bin/env bash
# call3.sh - run 39, call 3 (~6 min): bundle v32b. Call 1's Nsight at A 16K: the seed's warp
# select 60 us (84), the merge 153 us (177) with 88.7 M instructions (103.9 M): the sort's
# share fell as predicted (-15 M), but ~5400 warp instructions per row remain where the warp
# path's phases add up to ~2800. Suspect: rows the warp cannot take (more than 512 entries
# reach the threshold) going to the block merge. v32b: the warp raises its threshold to the K-th
# largest packed key and compacts its buffer before it could overflow (the block keeps only
# recomputes and ties); the seed's hidden-row loads issued beside its sample loads.
# 1. In parallel: the contract test and its memcheck (variants, K 40 / 20; the compaction in
#    the no-seed and tie cases), and the merge's row counts (SPH_TEST_TOPK_COUNT=1: warp /
#    compacted / block) at A, D, E 16K under variants 0 and 16. Prediction: tests pass; under 16
#    a tenth or more of A's rows go to the block, under 0 nearly none (compacted instead).
# 2. Nsight at A and D 16K general, variants 0 and 16. Prediction: the merge at A ~100 us
#    (88.7 M -> ~50 M instructions) under 0; the seed ~45 us.
# 3. The shares (top-k 64 + sum_p2 over plain, interleaved, 10 repetitions, response mask),
#    A, D, E 16K, general and one-pass, variants 0 and 16.
#   device: bash bench/results/2026-12-05-h200-run39/call3.sh
#           carry [".devbundle-v32b.txz"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
rm -rf .devbundle && mkdir -p .devbundle && tar xJf .devbundle-v32b.txz -C .devbundle
LIMIT=330
. scripts/device/call_common.sh
trap 'tar czf "$OUT/call3.tgz" -C "$R" .' EXIT
step gpu_test_head_cuda_contract 330 "$B/bin/gpu_test_head_cuda_contract" &
step memcheck_contract 330 /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
  --error-exitcode 9 "$B/bin/gpu_test_head_cuda_contract" &
( for v in 0 16; do
    SPH_TEST_TOPK_VARIANT=$v SPH_TEST_TOPK_COUNT=1 step count_v$v 60 $S bench --shape A,D,E \
      --N 16K --active 1 --mode general --topk 64 --sum-p2 --repeats 1 --warmup 0
  done ) &
wait
for v in 0 16; do
  SPH_TEST_TOPK_VARIANT=$v step ncu_v$v 120 /usr/local/cuda/bin/ncu --clock-control none \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum --csv $S bench --shape A,D \
    --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2
done
row() { # row <name> <variant> <mode>
  SPH_TEST_TOPK_VARIANT=$2 step bench_$3_$1 100 $S bench --shape A,D,E --N 16K --active 1 \
    --mask response --mode $3 --topk 64 --sum-p2 --repeats 10 --json "$R/bench_$3_$1.jsonl"
}
for m in general one-pass; do row v0 0 $m; row v16 16 $m; done
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
for f in "$R"/gpu_test_*.log; do
  grep -q "FAILED\|status [1-9]" "$f" && { echo "== $(basename "$f")"; grep -m8 -iE "fail|status|error" "$f"; }
  echo "== $(basename "$f"): $(grep -E "PASSED|FAILED" "$f" | tail -2 | tr '\n' ' ')"
done
grep -h "ERROR SUMMARY" "$R"/memcheck_*.log
for v in 0 16; do
  echo "== count v$v"; grep -h "spanhead top-k" "$R/count_v$v.log" | cut -c1-170 | sort | uniq -c | head -12
  echo "== ncu v$v"
  ncu_table "$R/ncu_v$v.log" topk_merge topk_seed extras_final 2>/dev/null | grep " ms " | head -8
done
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"
  grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -12
done
