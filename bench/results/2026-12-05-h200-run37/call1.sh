#!/usr/bin/env bash
# call1.sh - run 37, call 1: v30's variants of the fused top-k (SPH_TEST_TOPK_VARIANT bits 4-6,
# built 2026-12-05, third session; the default path's SASS is v29's, instruction for
# instruction) checked and their candidates counted, with run 36 call 4's pending GPU test
# programs on the same bundle.
#   bit 4 (16): 2 K' slots and the read-back's K-th rule (4 bisections to a value K slots reach)
#   bit 5 (32): the count's group skip (a warp skips a group of 8 positions none of its rows
#               reaches: the group maxima from the row's maximum loop; ping-pong kernels
#               only, so not at E, whose H 4096 takes the cooperative schedule)
#   bit 6 (64): the seed's sample of max(256, 4 K') columns (1024 at K 64 before: the seed's
#               GEMM 0.10 ms + select 0.084 ms at A 16K, run 36 call 2's ncu)
# 1. Correctness, in parallel: the contract test (11 variant sets now, 12 cases each), its
#    memcheck, the GPU test programs run 36 did not run on v29 (gpu_test_head_cuda default and
#    cooperative, _ref, _temp_rows, _policies, bi_dhidden, distill_cuda). Prediction: all pass.
# 2. Candidates per row (SPH_TEST_TOPK_COUNT=1, general, 16K rows) at A, D, E under variants
#    0, 64, 80 (16|64), and 80 and 16 with SPH_TEST_TOPK_EVERY=64. Prediction
#    (bench/cuda/topk_sim.py with 4 bisections, calibrated on run 33's 679 / 906 at A / E: the
#    model 680 / 855): A 680 / 1025 / 654 / 513 / 379; E 855 / 1283 / 783 / 592 / 427; D 886 /
#    1372 / 826 / 619 / 437.
# 3. Nsight at A 16K general (top-k 64 + sum_p2): the statistics launch, seed and merge under
#    variants 0, 32, 64, 112 and 112 with every 64. Prediction: 64 cuts the seed's GEMM +
#    select from ~0.19 to ~0.06 ms; 32 adds ~+20 M instructions at A (8 % of the groups empty
#    under today's rule: the skip rarely fires) and saves at D; 112 + every 64: the
#    statistics launch -20 .. -60 M instructions against 0 (fewer candidates, 33 % of the
#    groups skipped, +~500 instructions per read-back event), the merge 0.15 -> ~0.10 ms
#    with every variant (its K-th key searched below the keys' common prefix: the default).
#   device: bash bench/results/2026-12-05-h200-run37/call1.sh
#           carry [".devbundle-v30.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
rm -rf .devbundle && mkdir -p .devbundle && tar xJf .devbundle-v30.txz -C .devbundle
LIMIT=330
. scripts/device/call_common.sh
cp "$R/machine.txt" "$OUT/"; R=$OUT # logs straight to $OUT
step gpu_test_head_cuda_contract 330 "$B/bin/gpu_test_head_cuda_contract" &
step memcheck_contract 330 /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
  --error-exitcode 9 "$B/bin/gpu_test_head_cuda_contract" &
for t in head_cuda head_cuda_ref head_cuda_temp_rows head_cuda_policies bi_dhidden distill_cuda; do
  SPH_GPU_TESTS=-test_huge step gpu_test_$t 200 "$B/bin/gpu_test_$t" &
done
SPH_CUDA_PINGPONG=0 SPH_GPU_TESTS=-test_huge step gpu_test_head_cuda_cooperative 200 \
  "$B/bin/gpu_test_head_cuda" &
wait
count() { # count <name> <variant> [every]
  SPH_TEST_TOPK_VARIANT=$2 SPH_TEST_TOPK_EVERY=${3:-256} SPH_TEST_TOPK_COUNT=1 \
    step count_$1 40 $S bench --shape A,D,E --N 16K --active 1 --mode general --topk 64 \
    --sum-p2 --repeats 1 --warmup 0
}
count v0 0; count v64 64; count v80 80; count v80_e64 80 64; count v16_e64 16 64
ncu1() { # ncu1 <name> <variant> [every]
  SPH_TEST_TOPK_VARIANT=$2 SPH_TEST_TOPK_EVERY=${3:-256} step ncu_$1 90 \
    /usr/local/cuda/bin/ncu --clock-control none \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum --csv $S bench --shape A --N 16K \
    --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2
}
ncu1 v0 0; ncu1 v32 32; ncu1 v64 64; ncu1 v112_e64 112 64
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
for f in "$R"/gpu_test_*.log; do
  grep -q "FAILED\|status [1-9]" "$f" && { echo "== $(basename "$f")"; grep -m8 -iE "fail|status" "$f"; }
  echo "== $(basename "$f"): $(grep -E "PASSED|FAILED" "$f" | tail -2 | tr '\n' ' ')"
done
grep -h "ERROR SUMMARY" "$R/memcheck_contract.log"
for f in "$R"/count_*.log; do
  echo "== $(basename "$f")"; grep -h "candidates per row" "$f" | cut -c1-150
done
for f in "$R"/ncu_*.log; do
  echo "== $(basename "$f")"; ncu_table "$f" "2, 1>" topk_merge topk_seed nvjet_sm90_tss | tail -n 12
done
