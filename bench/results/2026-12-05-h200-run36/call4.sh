#!/usr/bin/env bash
# call4.sh - run 36, call 4: the GPU test programs that calls 1-3 did not run, on v29's bundle
# (the dlogits epilogue changed the general backward everywhere): gpu_test_head_cuda (default
# and cooperative schedule), _ref, _temp_rows, _policies, bi_dhidden, distill_cuda, in
# parallel; each log lands in $OUT as it finishes (a cut call still brings back what ran).
# Prediction: all pass (the contract test, TP and the policy test passed in call 2).
# Then the top-k threshold's read-back period (SPH_TEST_TOPK_EVERY, a run-time knob: the slots
# are read back when a row's candidate count crosses a multiple of it; default 256, tuned in
# runs 30-31 before v24's seed and v26's slot raises): 64, 128, 256, 512 at A 16K, general and
# one-pass, interleaved shares. A has ~679 candidates per row, so 256 reads back ~2-3 times per
# row: the threshold sits at the seed for the first third of the sweep. Prediction: 128 cuts
# the share by 0.3 .. 0.8 points if a read-back costs less than the ~250 candidates it saves.
#   device: bash bench/results/2026-12-05-h200-run36/call4.sh
#           carry [".devbundle-v29.txz"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
rm -rf .devbundle && mkdir -p .devbundle && tar xJf .devbundle-v29.txz -C .devbundle
. scripts/device/call_common.sh
cp "$R/machine.txt" "$OUT/"; R=$OUT # logs straight to $OUT
for t in head_cuda head_cuda_ref head_cuda_temp_rows head_cuda_policies bi_dhidden distill_cuda; do
  SPH_GPU_TESTS=-test_huge step gpu_test_$t 170 "$B/bin/gpu_test_$t" &
done
SPH_CUDA_PINGPONG=0 SPH_GPU_TESTS=-test_huge step gpu_test_head_cuda_cooperative 170 \
  "$B/bin/gpu_test_head_cuda" &
wait
for ev in 64 128 256 512; do
  for m in general one-pass; do
    SPH_TEST_TOPK_EVERY=$ev step bench_${m}_every$ev 60 $S bench --shape A --N 16K --active 1 \
      --mask response --mode $m --topk 64 --sum-p2 --repeats 10 --json "$R/bench_${m}_every$ev.jsonl"
  done
done
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
for f in "$R"/gpu_test_*.log; do
  grep -q "FAILED\|status [1-9]" "$f" && { echo "== $(basename "$f")"; grep -m8 -iE "fail|status" "$f"; }
  echo "== $(basename "$f"): $(grep -E "PASSED|FAILED" "$f" | tail -2 | tr '\n' ' ')"
done
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"; grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2
done
