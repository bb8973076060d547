#!/usr/bin/env bash
# run_tests.sh - on the device machine, inside the carried bundle: machine record, the GPU
# tests, compute-sanitizer (memcheck, racecheck) on subsets, and optionally the benchmark.
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
  ldconfig -p | grep -E 'nccl|openblas|cublas' | head
  ldd bin/gpu_test_head_cuda | grep -i "not found" || echo "all libraries found"
} 2>&1 | tee "$OUT/machine.txt"
status=0
echo "== tests"; t0=$(date +%s)
timeout 120 ./bin/gpu_test_head_cuda 2>&1 | tee "$OUT/tests.log"; rc=${PIPESTATUS[0]}
echo "tests rc=$rc ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/tests.log"; [ $rc -eq 0 ] || status=1
if [ -n "${SANITIZE:-}" ] && command -v compute-sanitizer >/dev/null; then
  echo "== memcheck"
  SPH_GPU_TESTS=test_parity_grid,test_errors,test_span_gaps,test_graph_capture timeout 150 \
    compute-sanitizer --tool memcheck --error-exitcode 9 ./bin/gpu_test_head_cuda > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?" | tee -a "$OUT/memcheck.log"; tail -5 "$OUT/memcheck.log"
  echo "== racecheck"
  SPH_GPU_TESTS=test_determinism timeout 80 \
    compute-sanitizer --tool racecheck --error-exitcode 9 ./bin/gpu_test_head_cuda > "$OUT/racecheck.log" 2>&1
  echo "racecheck rc=$?" | tee -a "$OUT/racecheck.log"; tail -5 "$OUT/racecheck.log"
fi
if [ $# -gt 0 ]; then
  echo "== bench"
  SPH_COMMIT=$commit timeout "${BENCH_TIMEOUT:-240}" ./bin/spanhead bench "$@" --json "$OUT/bench.jsonl" 2>&1 | tee "$OUT/bench.md"
fi
exit $status
