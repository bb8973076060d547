#!/usr/bin/env bash
# sm90_check.sh - on the device machine, inside the carried bundle (scripts/device/bundle.sh):
# the sm_90a batch-invariant logits kernel (src/cuda/head_sm90.cu). Machine record, the HGMMA
# count of the library's SASS, the GPU tests with SPH_CUDA_SM90=1 (wgmma kernel wherever it
# applies) and SPH_CUDA_SM90=0 (mma.sync kernel), compute-sanitizer memcheck on the sm_90
# test, and bench_sm90_logits (mma.sync vs wgmma, N=16384 H=4096 V=32768 bf16). Under 300 s (test_bi_sm90 alone takes about 26 s).
#   usage: sm90_check.sh        (logs under $OUT; exit status 0 only when every step passed)
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{
  echo "commit $(cat COMMIT 2>/dev/null || echo unknown)"; date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv
  echo "HGMMA instructions in libspanhead.so.0: $(cuobjdump --dump-sass lib/libspanhead.so.0 \
    2>/dev/null | grep -c HGMMA)"
} 2>&1 | tee "$OUT/sm90_machine.txt"
status=0
run() { # name timeout cmd...
  local name=$1 to=$2; shift 2; local t0=$(date +%s)
  timeout "$to" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/sm90_summary.txt"
  grep -E "PASSED|FAILED|ERROR SUMMARY|skip|speedup|^\| " "$OUT/$name.log" | tail -8
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || { status=1; tail -30 "$OUT/$name.log"; } # 77: skipped
}
SPH_CUDA_SM90=1 SPH_GPU_TESTS=-test_huge run gpu_test_head_cuda_sm90on 120 bin/gpu_test_head_cuda
SPH_CUDA_SM90=0 SPH_GPU_TESTS=-test_huge run gpu_test_head_cuda_sm90off 120 bin/gpu_test_head_cuda
SPH_GPU_TESTS=test_bi_sm90 run memcheck_bi_sm90 60 compute-sanitizer --tool memcheck \
  --error-exitcode 9 bin/gpu_test_head_cuda
run bench_sm90_logits 40 bin/bench_sm90_logits --N 16384 --H 4096 --V 32768 --reps 10
exit $status
