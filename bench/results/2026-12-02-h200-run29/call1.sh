#!/usr/bin/env bash
# call1.sh - run 29, call 1: sum_p2 in the fused sm_90a statistics epilogue checked and timed,
# and the host path of a small call attributed (issue 23's small-batch rows).
#   1. every GPU test program of the bundle in parallel (the epilogue change touches every
#      statistics kernel; test_head_cuda_contract has the sum_p2-alone cases); correctness
#      only, their seconds are no measurements;
#   2. sum_p2 as extra cost over plain log-probs, A and E 16K dense, general and one-pass
#      (`spanhead bench --sum-p2`: each point's plain row, then its sum_p2 row, same run);
#      default (staged, run 28: +5 .. +14 %) and SPH_CUDA_SUMP2FUSED=1 (v18) back to back;
#      prediction for v18: +0.5 .. +2 % (one FMA per logit in an epilogue of ~15 instructions per
#      logit, 4 bytes per 256 columns; run 28's staged path: +5 .. +14 %);
#   3. SPH_HOST_TRACE=1: where a call's host time goes, C path (`spanhead bench`, tiny shape
#      H 64 V 1000 N 64 and B 1K 0.25) and through Python (torch_overhead.py, tiny).
#   here:   scripts/device/bundle.sh && make python/spanhead/_spanhead.abi3.so
#   device: bash bench/results/2026-12-02-h200-run29/call1.sh
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
LIMIT=${LIMIT:-200}
t0=$(date +%s)
{ echo "commit $(cat "$B/COMMIT")"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  /usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1; } > "$R/machine.txt" 2>&1
step() { # name timeout cmd...
  local name=$1 to=$2 s=$(date +%s); shift 2
  timeout -s INT -k 10 "$to" "$@" > "$R/$name.log" 2>&1
  local rc=$? v=PASS
  [ $rc -eq 77 ] && v=SKIP
  [ $rc -eq 124 ] && v=TIMEOUT
  [ $rc -ne 0 ] && [ $rc -ne 77 ] && [ $rc -ne 124 ] && v=FAIL
  echo "$v $name rc=$rc $(( $(date +%s) - s )) s (t=$(( $(date +%s) - t0 )))" >> "$R/steps.txt"
}
if [ -z "${NO_CHECKS:-}" ]; then
  for t in ${GPU_TESTS-"$B"/bin/gpu_test_*}; do
    SPH_TEST_SKIP_HUGE=1 step "$(basename "$t")" $LIMIT "$t" &
  done
  SPANHEAD_LIB=$B/lib/libspanhead.so.0 PYTHONPATH=$root/python SPANHEAD_CLI=$S \
    step pytest_gpu $LIMIT python3 -m pytest -q -rs -p no:cacheprovider --tb=short \
    python/tests/test_torch_cuda.py python/tests/test_policy_cuda.py python/tests/test_temp_rows.py \
    python/tests/test_topk.py python/tests/test_distill_cuda.py python/tests/test_torch_onepass.py \
    python/tests/test_contract.py python/tests/test_entry_points.py \
    python/tests/test_policy_extras.py &
  wait
fi
P="--shape A,E --N 16K --active 1 --mask response"
# the staged rows (default) and the fused rows (v18, SPH_CUDA_SUMP2FUSED=1), back to back
step bench_sum_p2_general 90 $S bench $P --mode general --sum-p2 --json "$R/bench_sum_p2_general.jsonl"
SPH_CUDA_SUMP2FUSED=1 step bench_sum_p2_general_fused 90 $S bench $P --mode general --sum-p2 --json "$R/bench_sum_p2_general_fused.jsonl"
step bench_sum_p2_onepass 90 $S bench $P --mode one-pass --sum-p2 --json "$R/bench_sum_p2_onepass.jsonl"
SPH_CUDA_SUMP2FUSED=1 step bench_sum_p2_onepass_fused 90 $S bench $P --mode one-pass --sum-p2 --json "$R/bench_sum_p2_onepass_fused.jsonl"
SPH_HOST_TRACE=1 step trace_tiny 40 $S bench --H 64 --V 1000 --N 64 --active 1 --mode both --repeats 50 --warmup 5
SPH_HOST_TRACE=1 step trace_B1K 40 $S bench --shape B --N 1K --active 0.25 --mode one-pass --repeats 50 --warmup 5
SPH_HOST_TRACE=1 PYTHONPATH=$root/python SPANHEAD_LIB=$B/lib/libspanhead.so.0 \
  step trace_torch 60 python3 bench/cuda/torch_overhead.py --points tiny:64:1.0 --iters 30 --out "$R/torch_overhead.md"
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
tail -4 "$R/pytest_gpu.log" 2>/dev/null
for f in "$R"/gpu_test_*.log; do
  [ -f "$f" ] || continue
  if grep -q "FAIL\|Error\|error:" "$f" 2>/dev/null && ! grep -q "^\[  PASSED  \]" "$f"; then
    echo "== $(basename "$f")"; grep -m12 -iE "fail|error" "$f"; fi
done
for f in bench_sum_p2_general bench_sum_p2_general_fused bench_sum_p2_onepass bench_sum_p2_onepass_fused; do echo "== $f"; grep -h "^|" "$R/$f.log" | head -8; done
for f in trace_tiny trace_B1K trace_torch; do echo "== $f"; grep -h "^|" "$R/$f.log" | head -6; sed -n '/host trace/,$p' "$R/$f.log" | head -40; done
head -14 "$R/torch_overhead.md" 2>/dev/null
tar czf "$OUT/call1.tgz" -C "$R" .
