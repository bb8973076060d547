#!/usr/bin/env bash
# call1.sh - run 39, call 1 (~6 min): bundle v32 (main after the merge of del-v30-bits, the
# shared per-row temperature check, and v32's per-row kernels of the fused top-k).
# 1. Checks, in parallel: the contract test (variants 1 .. 13 and 16 = v31's per-row kernels,
#    the new K 40 / 20 cases) and its memcheck; the distillation's CUDA test and its memcheck
#    (run 38 call 2, not lent: a non-finite row's loss NaN on CUDA); the TP and policy
#    programs; the GPU pytest of top-k, the policy's extras and the distillation (run 38's
#    torch-operator fix: ttrows without a default). Prediction: all pass.
# 2. Nsight at A and D 16K general, top-k 64 + sum_p2, variants 0 (v32) and 16 (v31's
#    per-row kernels in the same binary). Prediction at A (run 37: wnorm 10, seed select 84,
#    merge 177, finalize 22 us): wnorm ~4 us, seed ~40 us (memory: 64 MB of samples + 64 MB
#    of hidden), merge ~100 us (its sort ~1/4 of its instructions, loads 4x in flight),
#    finalize ~6 us: ~-140 us of ~0.4 ms per-row kernels; the statistics launch unchanged.
#   device: bash bench/results/2026-12-05-h200-run39/call1.sh
#           carry [".devbundle-v32.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
rm -rf .devbundle && mkdir -p .devbundle && tar xJf .devbundle-v32.txz -C .devbundle
LIMIT=330
. scripts/device/call_common.sh
trap 'tar czf "$OUT/call1.tgz" -C "$R" .' EXIT
step gpu_test_head_cuda_contract 330 "$B/bin/gpu_test_head_cuda_contract" &
step memcheck_contract 330 /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
  --error-exitcode 9 "$B/bin/gpu_test_head_cuda_contract" &
step gpu_test_distill_cuda 200 "$B/bin/gpu_test_distill_cuda" &
step memcheck_distill 250 /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
  --error-exitcode 9 "$B/bin/gpu_test_distill_cuda" &
for t in head_cuda_tp policy_cuda; do
  SPH_TEST_SKIP_HUGE=1 step gpu_test_$t 300 "$B/bin/gpu_test_$t" &
done
SPANHEAD_LIB=$B/lib/libspanhead.so.0 PYTHONPATH=$root/python SPANHEAD_CLI=$S \
  step pytest_gpu 300 python3 -m pytest -q -rs -p no:cacheprovider --tb=short \
  python/tests/test_topk.py python/tests/test_policy_extras.py python/tests/test_distill_cuda.py \
  python/tests/test_distill.py &
wait
for v in 0 16; do
  SPH_TEST_TOPK_VARIANT=$v step ncu_v$v 120 /usr/local/cuda/bin/ncu --clock-control none \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum --csv $S bench --shape A,D \
    --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2
done
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
for f in "$R"/gpu_test_*.log; do
  grep -q "FAILED\|status [1-9]" "$f" && { echo "== $(basename "$f")"; grep -m8 -iE "fail|status|error" "$f"; }
  echo "== $(basename "$f"): $(grep -E "PASSED|FAILED" "$f" | tail -2 | tr '\n' ' ')"
done
grep -h "ERROR SUMMARY" "$R"/memcheck_*.log
grep -E "^(FAILED|ERROR)" "$R/pytest_gpu.log" | cut -c1-200 | head -10
tail -3 "$R/pytest_gpu.log"
for v in 0 16; do
  echo "== variant $v"
  ncu_table "$R/ncu_v$v.log" "2, 1>" topk extras_finalize nvjet_sm90_tss | tail -n 24
done
