#!/usr/bin/env bash
# run.sh - run 26, one device call (the session's last ~10 minutes of device time) on the merged
# tree: first the measurements on an idle GPU, one at a time (issue 23's second A/B and the
# torch-path overhead, scripts/device/issue23.sh; the verl and SkyRL adapters against those
# frameworks' Triton kernels with one timed step each, scripts/device/integrations_gpu.sh),
# then the GPU checks in parallel (correctness only: their seconds are not measurements).
#   here:   scripts/device/bundle.sh && make python/spanhead/_spanhead.abi3.so &&
#           bash scripts/device/integrations_gpu.sh prepare verl skyrl
#   device: bash bench/results/2026-12-01-h200-run26/run.sh
#           carry [".devbundle.txz", "python/spanhead/_spanhead.abi3.so",
#                  "build-intwhl/verl.tar.xz", "build-intwhl/skyrl.tar.xz"]
# Output: $OUT/run26.tgz (every log) and the summary printed.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
B=$root/.devbundle
[ -d "$B/bin" ] || { mkdir -p "$B" && tar xJf "$root/.devbundle.txz" -C "$B"; } || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$(mktemp -d); mkdir -p "$R/i23" "$R/integ" "$R/tests"
export SPH_COMMIT=$(cat "$B/COMMIT")
t0=$(date +%s)
{
  echo "commit $SPH_COMMIT"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  /usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1
} > "$R/machine.txt" 2>&1
step() { # name timeout cmd...
  local name=$1 to=$2 s=$(date +%s); shift 2
  timeout "$to" "$@" > "$R/$name.log" 2>&1
  local rc=$? v=PASS
  [ $rc -eq 77 ] && v=SKIP
  [ $rc -eq 124 ] && v=TIMEOUT
  [ $rc -ne 0 ] && [ $rc -ne 77 ] && [ $rc -ne 124 ] && v=FAIL
  echo "$v $name rc=$rc $(( $(date +%s) - s )) s (t=$(( $(date +%s) - t0 )))" >> "$R/steps.txt"
}
# A. measurements, one at a time
OUT=$R/i23 LIMIT=215 step issue23 230 bash "$B/issue23.sh"
OUT=$R/integ SPANHEAD_LIB=$B/lib/libspanhead.so.0 LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64 \
  step integrations 130 bash scripts/device/integrations_gpu.sh verl skyrl
# B. the checks, in parallel, all done by ~t0 + 560 s
left=$(( 560 - ($(date +%s) - t0) )); [ $left -lt 60 ] && left=60
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
for t in "$B"/bin/gpu_test_*; do
  SPH_TEST_SKIP_HUGE=1 step "tests/$(basename "$t")" $left "$t" &
done
SPANHEAD_LIB=$B/lib/libspanhead.so.0 PYTHONPATH=$root/python SPANHEAD_CLI=$B/bin/spanhead \
  step tests/pytest_gpu $left python3 -m pytest -q -rs -p no:cacheprovider \
  python/tests/test_torch_cuda.py python/tests/test_policy_cuda.py \
  python/tests/test_entry_points.py python/tests/test_contract.py python/tests/test_errors.py &
wait
cat "$R/machine.txt" "$R/steps.txt"
tail -3 "$R/tests/pytest_gpu.log"
grep -h "FAIL\|PASSED\|FAILED" "$R"/tests/gpu_test_*.log 2>/dev/null | tail -20
cat "$R/i23/"*.txt 2>/dev/null | tail -5
tar czf "$OUT/run26.tgz" -C "$R" .
ls -la "$OUT"
