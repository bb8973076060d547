#!/usr/bin/env bash
# followup.sh - run 23's second call: the checks that failed in the first, on the fixed tree
# (ae5de2a, 319f8ae), plus compute-sanitizer memcheck on the non-finite test.
#   here:   scripts/device/bundle.sh && the wheel (python_gpu.sh prepare)
#   device: bash bench/results/2026-12-01-h200-run23/followup.sh   carry [".devbundle.txz", ".pywhl"]
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
B=$root/.devbundle
[ -d "$B/bin" ] || { mkdir -p "$B" && tar xJf "$root/.devbundle.txz" -C "$B"; } || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$(mktemp -d); mkdir -p "$R/py" "$R/cli"
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export SPH_COMMIT=$(cat "$B/COMMIT")
t0=$(date +%s)
step() { # name timeout cmd...
  local name=$1 to=$2 s=$(date +%s); shift 2
  timeout "$to" "$@" > "$R/$name.log" 2>&1
  local rc=$? v=PASS
  [ $rc -eq 77 ] && v=SKIP
  [ $rc -ne 0 ] && [ $rc -ne 77 ] && v=FAIL
  echo "$v $name rc=$rc $(( $(date +%s) - s )) s (t=$(( $(date +%s) - t0 )))" >> "$R/steps.txt"
}
echo "commit $SPH_COMMIT; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)" > "$R/machine.txt"
step gpu_test_head_cuda_policies 60 "$B/bin/gpu_test_head_cuda_policies" &
step memcheck_policies 150 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$B/bin/gpu_test_head_cuda_policies" &
OUT=$R/py ONLY_PYTEST=1 PYTEST_TARGETS="python/tests/test_torch_cuda.py::test_nonfinite_counted_on_device \
python/tests/test_torch_compile.py::test_compile_with_a_spanhead_comm python/tests/test_coexist.py" \
  step python_gpu 170 bash scripts/device/python_gpu.sh &
OUT=$R/cli BENCH_ARGS="--shape A --N 4K --mode general --repeats 3" \
  step cli_check 120 bash scripts/device/cli_check.sh &
wait
cat "$R/machine.txt" "$R/steps.txt"
grep -h "passed\|failed" "$R/py/python_gpu.txt" 2>/dev/null | tail -3
for f in "$R"/*.log; do grep -q "FAIL\|ERROR SUMMARY: [1-9]" "$f" && { echo "== $(basename "$f")"; grep -m8 "FAIL\|ERROR" "$f"; }; done
tail -3 "$R/memcheck_policies.log"
tar czf "$OUT/followup.tgz" -C "$R" .
