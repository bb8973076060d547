#!/usr/bin/env bash
# check.sh - run 28, the merged tree's GPU checks in one call (correctness only; their
# seconds are no measurements): every GPU test program of the bundle in parallel (per-row
# temperature, top-k / sum_p2, the distillation loss, sph_scale_inplace through the torch
# backward, the house's row hook and path choice under the old tests), the GPU pytest files,
# the CLI's --check on CUDA for the new options, compute-sanitizer memcheck on the extras.
#   here:   scripts/device/bundle.sh && make python/spanhead/_spanhead.abi3.so
#   device: bash bench/results/2026-12-01-h200-run28/check.sh   (GPU_TESTS="" skips the C test
#           programs: the second call of run 28, after the pytest fix)
#           carry [".devbundle.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
B=$root/.devbundle
[ -d "$B/bin" ] || { mkdir -p "$B" && tar xJf "$root/.devbundle.txz" -C "$B"; } || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$(mktemp -d)
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
S=$B/bin/spanhead
LIMIT=${LIMIT:-230}
t0=$(date +%s)
step() { # name timeout cmd...
  local name=$1 to=$2 s=$(date +%s); shift 2
  timeout "$to" "$@" > "$R/$name.log" 2>&1
  local rc=$? v=PASS
  [ $rc -eq 77 ] && v=SKIP
  [ $rc -eq 124 ] && v=TIMEOUT
  [ $rc -ne 0 ] && [ $rc -ne 77 ] && [ $rc -ne 124 ] && v=FAIL
  echo "$v $name rc=$rc $(( $(date +%s) - s )) s" >> "$R/steps.txt"
}
for t in ${GPU_TESTS-"$B"/bin/gpu_test_*}; do
  SPH_TEST_SKIP_HUGE=1 step "$(basename "$t")" $LIMIT "$t" &
done
SPANHEAD_LIB=$B/lib/libspanhead.so.0 PYTHONPATH=$root/python SPANHEAD_CLI=$S \
  step pytest_gpu $LIMIT python3 -m pytest -q -rs -p no:cacheprovider --tb=short \
  python/tests/test_torch_cuda.py python/tests/test_policy_cuda.py python/tests/test_temp_rows.py \
  python/tests/test_topk.py python/tests/test_distill_cuda.py python/tests/test_torch_onepass.py \
  python/tests/test_contract.py python/tests/test_entry_points.py &
( step run_topk_bf16 90 "$S" run --device cuda --N 1024 --H 256 --V 32003 --dtype bf16 \
      --mask random --active 0.6 --temperature 0.7 --topk 64 --sum-p2 --check
  step run_topk_f32_onepass 90 "$S" run --device cuda --N 512 --H 128 --V 20011 --dtype f32 \
      --one-pass --topk 256 --sum-p2 --softcap 20 --check
  mkdir -p "$R/dd" "$R/ds"
  python3 tests/cli/distill_oracle.py gen "$R/dd" 1 dense > /dev/null 2>&1
  python3 tests/cli/distill_oracle.py gen "$R/ds" 2 sparse > /dev/null 2>&1
  step run_distill_dense 90 "$S" run --distill jsd --device cuda --inputs "$R/dd" --check
  step run_distill_sparse 90 "$S" run --distill forward-kl --device cuda --inputs "$R/ds" --check
  step memcheck_contract 200 /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
      --error-exitcode 9 "$B/bin/gpu_test_head_cuda_contract" ) &
wait
sort "$R/steps.txt"
for f in "$R"/*.log; do
  if grep -q "FAIL\|Error\|error:" "$f" 2>/dev/null && ! grep -q "^\[  PASSED  \]" "$f"; then
    echo "== $(basename "$f")"; grep -m12 -iE "fail|error" "$f"; fi
done
tail -4 "$R/pytest_gpu.log"
grep -h "check\|PASS\|FAIL" "$R"/run_*.log | head -20
tar czf "$OUT/check.tgz" -C "$R" .
