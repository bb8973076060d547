#!/usr/bin/env bash
# call2.sh - run 38, call 2 (~1 min): call 1's two failures fixed, rerun: the distillation's
# CUDA rows whose record is not finite now come out NaN (loss and du; call 1 found a finite
# loss for a row whose teacher temperature was 0: the terms' 0 log 0 guards dropped its NaN
# probabilities), and the torch operator's ttrows without a default (torch 2.11's dispatcher
# dropped the trailing default argument: the backward's 15 gradients against 14 inputs).
# Prediction: gpu_test_distill_cuda (5 tests) and its memcheck pass; the distillation's pytest
# passes on the GPU (71 tests).
#   device: bash bench/results/2026-12-05-h200-run38/call2.sh
#           carry [".devbundle-v31b.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
rm -rf .devbundle && mkdir -p .devbundle && tar xJf .devbundle-v31b.txz -C .devbundle
LIMIT=200
. scripts/device/call_common.sh
trap 'tar czf "$OUT/call2.tgz" -C "$R" .' EXIT
step gpu_test_distill_cuda 120 "$B/bin/gpu_test_distill_cuda" &
step memcheck_distill 200 /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
  --error-exitcode 9 "$B/bin/gpu_test_distill_cuda" &
SPANHEAD_LIB=$B/lib/libspanhead.so.0 PYTHONPATH=$root/python SPANHEAD_CLI=$S \
  step pytest_distill 200 python3 -m pytest -q -rs -p no:cacheprovider --tb=short \
  python/tests/test_distill_cuda.py python/tests/test_distill.py &
wait
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
for f in "$R"/gpu_test_*.log; do
  grep -q "FAILED\|status [1-9]" "$f" && { echo "== $(basename "$f")"; grep -m8 -iE "fail|status|error" "$f"; }
  echo "== $(basename "$f"): $(grep -E "PASSED|FAILED" "$f" | tail -2 | tr '\n' ' ')"
done
grep -h "ERROR SUMMARY" "$R/memcheck_distill.log"
grep -E "^(FAILED|ERROR)" "$R/pytest_distill.log" | cut -c1-200 | head -10
tail -3 "$R/pytest_distill.log"
