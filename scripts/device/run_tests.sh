#!/usr/bin/env bash
# run_tests.sh - on the device machine, inside the carried bundle: machine record, the GPU
# tests (default, then SPH_CUDA_GATHER=0, SPH_CUDA_SQUARE=0, SPH_CUDA_FUSED=0,
# SPH_CUDA_PINGPONG=0), compute-sanitizer memcheck and racecheck on subsets (SANITIZE=1), then
# `spanhead bench` with the given arguments,
# and a second bench with $BENCH2 arguments under $BENCH2_ENV (default SPH_CUDA_GATHER=0: a
# same-run A/B) when set.
#   usage: run_tests.sh [bench-args...]   (logs under $OUT)
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
commit=$(cat COMMIT 2>/dev/null || echo unknown)
{
  echo "commit $commit"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  nvcc --version | tail -1
  ldd bin/gpu_test_head_cuda | grep -i "not found" || echo "all libraries found"
} 2>&1 | tee "$OUT/machine.txt"
status=0
run() { # name timeout cmd...
  local name=$1 to=$2; shift 2; local t0=$(date +%s)
  timeout "$to" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/summary.txt"
  grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|SKIP" "$OUT/$name.log" | tail -4
  # 77: the binary skipped something it names (a device without sm_90, ...): visible, not a pass
  if [ $rc -eq 77 ]; then echo "$name SKIPPED:"; grep -E "^SKIP|^  test_" "$OUT/$name.log" | head -5
  elif [ $rc -ne 0 ]; then status=1; tail -30 "$OUT/$name.log"; fi
}
for t in bin/gpu_test_*; do run "$(basename $t)" 150 "$t"; done
if [ -z "${QUICK:-}" ]; then # QUICK=1: the default, SPH_CUDA_FUSED=0 and SPH_CUDA_PINGPONG=0 runs only
  for t in bin/gpu_test_*; do SPH_CUDA_GATHER=0 SPH_GPU_TESTS=-test_huge run "$(basename $t)_nogather" 100 "$t"; done
  SPH_CUDA_SQUARE=0 run gpu_test_head_cuda_nosquare 100 bin/gpu_test_head_cuda
fi
SPH_CUDA_FUSED=0 SPH_GPU_TESTS=-test_huge run gpu_test_head_cuda_nofused 100 bin/gpu_test_head_cuda
SPH_CUDA_PINGPONG=0 SPH_GPU_TESTS=-test_huge run gpu_test_head_cuda_cooperative 100 bin/gpu_test_head_cuda
if [ -n "${SANITIZE:-}" ]; then
  SPH_GPU_TESTS=-test_huge run memcheck 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
    bin/gpu_test_head_cuda
  run memcheck_tp 100 compute-sanitizer --tool memcheck --error-exitcode 9 bin/gpu_test_head_cuda_tp
  [ -n "${RACECHECK:-}" ] && SPH_GPU_TESTS=test_bi_parity,test_span_gaps run racecheck 150 \
    compute-sanitizer --tool racecheck --error-exitcode 9 bin/gpu_test_head_cuda
fi
if [ $# -gt 0 ]; then
  echo "== bench"
  SPH_COMMIT=$commit timeout "${BENCH_TIMEOUT:-240}" ./bin/spanhead bench "$@" --json "$OUT/bench.jsonl" 2>&1 | tee "$OUT/bench.md"
fi
if [ -n "${BENCH2:-}" ]; then
  b2env=${BENCH2_ENV:-SPH_CUDA_GATHER=0}
  echo "== bench, $b2env"
  env $b2env SPH_COMMIT=$commit timeout "${BENCH2_TIMEOUT:-150}" ./bin/spanhead bench $BENCH2 --json "$OUT/bench2.jsonl" 2>&1 | tee "$OUT/bench2.md"
fi
tar czf "$OUT/logs.tar.gz" -C "$OUT" $(cd "$OUT" && ls *.log) 2>/dev/null && (cd "$OUT" && rm -f *.log)
exit $status
