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
#    0, 64, 48 (16|32) with every 128, 112 (16|32|64) with every 128, and 16 with every 64.
#    Prediction (bench/cuda/topk_sim.py, 4 bisections; calibrated on run 33's 679 / 906 at
#    A / E, the model 680 / 855): A 696 / 1033 / 433 / 578 / 379; D 887 / 1353 / 494 / 710 /
#    439; E 851 / ~1280 / 477 / 683 / 427.
# 3. Nsight at A and D 16K general (top-k 64 + sum_p2): the statistics launch, seed and merge
#    under variants 0, 32, 64 and 112 with every 128. The model's warp instructions per 16K
#    rows in the epilogue's top-k parts (count + emission + read-backs), against 0: A 168 M;
#    32 +-0 (8 % of the groups empty: the skip rarely fires), 64 +7 M, 112 / every 128 +4 M;
#    D 391 M; 32 -63 M, 64 +11 M, 112 / every 128 -106 M (the K-th read-backs +39 M, the
#    skip -156 M). The seed's GEMM + select 0.19 -> ~0.06 ms under 64; the merge 0.15 ->
#    ~0.10 ms everywhere (its K-th key searched below the keys' common prefix: the default).
#   device: bash bench/results/2026-12-05-h200-run37/call1.sh checks    (then: call1.sh counts)
#           carry [".devbundle-v30b.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
rm -rf .devbundle && mkdir -p .devbundle && tar xJf .devbundle-v30b.txz -C .devbundle
LIMIT=330
. scripts/device/call_common.sh
cp "$R/machine.txt" "$OUT/"; R=$OUT # logs straight to $OUT
phase=${1:-checks} # two calls: the checks (~5 min), then the counts and Nsight (~4 min)
if [ "$phase" = checks ]; then
  step gpu_test_head_cuda_contract 330 "$B/bin/gpu_test_head_cuda_contract" &
  step memcheck_contract 330 /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
    --error-exitcode 9 "$B/bin/gpu_test_head_cuda_contract" &
  for t in head_cuda head_cuda_ref head_cuda_temp_rows head_cuda_policies bi_dhidden distill_cuda; do
    SPH_GPU_TESTS=-test_huge step gpu_test_$t 200 "$B/bin/gpu_test_$t" &
  done
  SPH_CUDA_PINGPONG=0 SPH_GPU_TESTS=-test_huge step gpu_test_head_cuda_cooperative 200 \
    "$B/bin/gpu_test_head_cuda" &
  wait
else
  count() { # count <name> <variant> [every]
    SPH_TEST_TOPK_VARIANT=$2 SPH_TEST_TOPK_EVERY=${3:-256} SPH_TEST_TOPK_COUNT=1 \
      step count_$1 40 $S bench --shape A,D,E --N 16K --active 1 --mode general --topk 64 \
      --sum-p2 --repeats 1 --warmup 0
  }
  count v0 0; count v64 64; count v48_e128 48 128; count v112_e128 112 128; count v16_e64 16 64
  ncu1() { # ncu1 <name> <variant> [every]
    SPH_TEST_TOPK_VARIANT=$2 SPH_TEST_TOPK_EVERY=${3:-256} step ncu_$1 120 \
      /usr/local/cuda/bin/ncu --clock-control none \
      --metrics gpu__time_duration.sum,smsp__inst_executed.sum --csv $S bench --shape A,D --N 16K \
      --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2
  }
  ncu1 v0 0; ncu1 v32 32; ncu1 v64 64; ncu1 v112_e128 112 128
fi
shopt -s nullglob # each phase reports what it ran
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
for f in "$R"/gpu_test_*.log; do
  grep -q "FAILED\|status [1-9]" "$f" && { echo "== $(basename "$f")"; grep -m8 -iE "fail|status" "$f"; }
  echo "== $(basename "$f"): $(grep -E "PASSED|FAILED" "$f" | tail -2 | tr '\n' ' ')"
done
grep -h "ERROR SUMMARY" "$R/memcheck_contract.log" 2>/dev/null
for f in "$R"/count_*.log; do
  echo "== $(basename "$f")"; grep -h "candidates per row" "$f" | cut -c1-150
done
for f in "$R"/ncu_*.log; do
  echo "== $(basename "$f")"; ncu_table "$f" "2, 1>" topk_merge topk_seed nvjet_sm90_tss | tail -n 12
done
