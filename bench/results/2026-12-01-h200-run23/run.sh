#!/usr/bin/env bash
# run.sh - run 23, one device call (the session had ~600 s of device time): the benchmarks
# first on an idle GPU (v12's budgets A/B, the fused policy loss), then the GPU checks of the
# tree in parallel (correctness only; their timings are not measurements).
#   here:   scripts/device/bundle.sh && bash scripts/device/python_gpu.sh prepare
#   device: bash bench/results/2026-12-01-h200-run23/run.sh
#           carry [".devbundle.txz", ".pywhl"]
# Output: $OUT/run23.tgz (every log) and the summary printed.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
B=$root/.devbundle
[ -d "$B/bin" ] || { mkdir -p "$B" && tar xJf "$root/.devbundle.txz" -C "$B"; } || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$(mktemp -d); mkdir -p "$R/py" "$R/cli"
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export SPH_COMMIT=$(cat "$B/COMMIT")
cli=$B/bin/spanhead
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
  [ $rc -ne 0 ] && [ $rc -ne 77 ] && v=FAIL
  echo "$v $name rc=$rc $(( $(date +%s) - s )) s (t=$(( $(date +%s) - t0 )))" >> "$R/steps.txt"
}
# A. benchmarks, one at a time
for v in default 2G:2147483648 8G:8589934592; do
  extra=""; [ "$v" = default ] || extra="--chunk-bytes ${v#*:}"
  step "bench_onepass_${v%%:*}" 45 "$cli" bench --device cuda --shape D,E --N 16K --active 1,0.5 \
    --mask response --mode one-pass $extra --json "$R/bench_onepass_${v%%:*}.jsonl"
done
step bench_e64k_general 45 "$cli" bench --device cuda --shape E --N 64K --active 1 \
  --mode general --json "$R/bench_e64k_general.jsonl"
step bench_policy 60 "$cli" bench --device cuda --mode policy --shape A,D,E --N 16K \
  --mask response --active 0.5 --json "$R/bench_policy.jsonl"
# B. the checks, in parallel, all done by ~t0 + 420 s
left=$(( 420 - ($(date +%s) - t0) )); [ $left -lt 100 ] && left=100
for t in gpu_test_head_cuda_ref gpu_test_head_cuda_policies gpu_test_head_cuda_tp \
         gpu_test_policy_cuda gpu_test_bi_dhidden; do
  step "$t" $left "$B/bin/$t" &
done
SPH_TEST_SKIP_HUGE=1 step gpu_test_head_cuda $left "$B/bin/gpu_test_head_cuda" &
OUT=$R/py PYTEST_TARGETS="python/tests/test_torch_cuda.py python/tests/test_coexist.py \
python/tests/test_policy_cuda.py python/tests/test_torch_compile.py" SKIP_BENCH_TORCH=1 \
  step python_gpu $left bash scripts/device/python_gpu.sh &
OUT=$R/cli BENCH_ARGS="--shape A --N 4K --mode general --repeats 3" \
  step cli_check $left bash scripts/device/cli_check.sh &
wait
cat "$R/machine.txt" "$R/steps.txt"
grep -h "^\(PASS\|FAIL\|SKIP\)" "$R/py/python_gpu.txt" 2>/dev/null
grep -h "passed\|failed" "$R/py/python_gpu.txt" 2>/dev/null | tail -3
for f in "$R"/*.log; do grep -q "FAIL" "$f" && { echo "== $(basename "$f")"; grep -m8 "FAIL\|Error\|error" "$f"; }; done
for f in "$R"/bench_*.log; do echo "== $(basename "$f")"; cat "$f" | head -30; done
tar czf "$OUT/run23.tgz" -C "$R" .
