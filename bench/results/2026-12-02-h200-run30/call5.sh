#!/usr/bin/env bash
# call5.sh - run 30, call 5: v19d, top-k inside the fused sm_90a statistics epilogue (issue 25),
# checked and timed.
#   1. every GPU test program of the bundle in parallel (test_head_cuda_contract has the fused
#      top-k cases: K 1 .. 256, splits, spans, staged E, the sweep, tile-edge rows, the
#      overflow's recompute), the contract test under compute-sanitizer memcheck (the
#      candidates' atomics and buffers), the GPU pytest files (top-k through Python, the
#      policy loss's extras): correctness only, their seconds are no measurements;
# v19b (after call 1: correct, but +120 .. +1090 %): the slots read back only when a row's
# candidate count crosses a multiple of 128 (call 1 read 16 slots serially per row and tile),
# the threshold read after the main loop, a candidate buffer sized for the first wave (~2300
# columns in flight per row before any threshold) + 2048 + 32 ks instead of 4096 (rows that
# overflowed recomputed their tiles: E one-pass +1064 %), the merge's candidates from K on.
# Prediction: +3 .. +10 % at K = 64 (the atomicAdd's round trip per row and tile in the
# epilogue, hidden under the other warpgroup's main loop at H 2048, not at H 4096), K = 256
# +5 .. +15 %.
# v19c (after call 2: +10 .. +45 %): the merge kernel selects instead of sorting: four 8-bit
# radix-histogram passes over the row's candidates (keys cached in shared memory) find the
# K-th largest z, and only the entries at or above it (~K) are sorted; call 2's merge sorted
# 2048 entries two or three times per row (~16K instructions per thread per sort: ~6 ms per
# 16K rows, most of call 2's extra). Prediction: general A +5 .. +12 %, E +2 .. +5 %;
# one-pass and the policy call the same order (the rest: the epilogue's atomicAdd round trip
# and the candidates' stores).
# v19d (after call 3: +2 .. +24 %): the merge's radix histograms warp-aggregated
# (__match_any_sync: one shared atomic per distinct bin and warp; the candidates share their
# exponent, so call 3's per-key atomics were ~32-way serialized in the first passes).
# Prediction: -0.5 .. -1.5 ms per 16K rows (A general +10 .. +20 %, E +3 .. +4 %). Then
# Nsight Compute's per-kernel times of the A general point with top-k 64 (call 4's plan).
# Checks in this call: the contract test (+ memcheck), the TP and policy programs, test_topk.py
# verbose (call 1's two "ref" failures: a CPU test, seed printed this time).
#   2. top-k 64 + sum_p2 as extra cost over plain log-probs, A and E 16K, general and one-pass
#      (`spanhead bench --topk 64 --sum-p2`: each point's plain row, then its extras row,
#      same run), default (fused, v19) and SPH_CUDA_EXTRAS=staged back to back; then K = 256
#      at A (the widest list) and the policy call with the extras at A, B, D 16K.
#      Prediction for v19: +1 .. +3 % at K = 64 (one compare per logit in the epilogue; the
#      candidates, ~2-3K per row of 8 bytes, and the merge, ~0.1-0.3 ms per 16K rows), against
#      the staged path's +40 .. +116 % (run 29 call 2); K = 256: +3 .. +8 % (4x the slots).
#   here:   scripts/device/bundle.sh && make python/spanhead/_spanhead.abi3.so
#   device: bash bench/results/2026-12-02-h200-run30/call1.sh
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
  for t in ${GPU_TESTS-$B/bin/gpu_test_head_cuda_contract $B/bin/gpu_test_head_cuda_tp}; do
    SPH_TEST_SKIP_HUGE=1 step "$(basename "$t")" $LIMIT "$t" &
  done
  step memcheck_contract $LIMIT /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
    --error-exitcode 9 "$B/bin/gpu_test_head_cuda_contract" &
  SPANHEAD_LIB=$B/lib/libspanhead.so.0 PYTHONPATH=$root/python SPANHEAD_CLI=$S \
    step pytest_gpu $LIMIT python3 -m pytest -rs -p no:cacheprovider --tb=short \
    python/tests/test_topk.py python/tests/test_policy_extras.py &
  wait
fi
P="--shape A,E --N 16K --active 1 --mask response --topk 64 --sum-p2"
step bench_x_general 100 $S bench $P --mode general --json "$R/bench_x_general.jsonl"
SPH_CUDA_EXTRAS=staged step bench_x_general_staged 100 $S bench $P --mode general --json "$R/bench_x_general_staged.jsonl"
step bench_x_onepass 100 $S bench $P --mode one-pass --json "$R/bench_x_onepass.jsonl"
SPH_CUDA_EXTRAS=staged step bench_x_onepass_staged 100 $S bench $P --mode one-pass --json "$R/bench_x_onepass_staged.jsonl"
: step bench_k256 60 $S bench --shape A --N 16K --active 1 --topk 256 --mode both --json "$R/bench_k256.jsonl"
NCU=1 step ncu_a 150 timeout 140 /usr/local/cuda/bin/ncu --clock-control none --metrics gpu__time_duration.sum --csv \
  $S bench --shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2
: step bench_policy 120 $S bench --shape A,B,D --N 16K --active 1 --mask response --mode policy --topk 64 --sum-p2 --json "$R/bench_policy.jsonl"
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
tail -4 "$R/pytest_gpu.log" 2>/dev/null
grep -h "ERROR SUMMARY" "$R/memcheck_contract.log" 2>/dev/null
for f in "$R"/gpu_test_*.log; do
  [ -f "$f" ] || continue
  if grep -q "FAIL\|Error\|error:" "$f" 2>/dev/null && ! grep -q "^\[  PASSED  \]" "$f"; then
    echo "== $(basename "$f")"; grep -m12 -iE "fail|error" "$f"; fi
done
python3 - "$R/ncu_a.log" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if rows:
    h = rows[0]
    ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
    sc = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}
    for r in rows[1:]:
        k = r[ki]
        if "nvjet" in k or "gemm" in k.lower() or "cutlass" in k: continue
        print(f"{float(r[vi].replace(',', '')) * sc.get(r[ui], 1e-6):9.3f} ms  {k[:80]}")
PY
for f in bench_x_general bench_x_general_staged bench_x_onepass bench_x_onepass_staged; do
  echo "== $f"; grep -h "^|" "$R/$f.log" | grep -v "^|---" | cut -d'|' -f2-9,16-17 | head -14; done
tar czf "$OUT/call5.tgz" -C "$R" .
