#!/usr/bin/env bash
# call4.sh - run 32, call 4: call 3 found the seed's select issue-bound (84 % issue active,
# 210 M instructions for 16K rows): its 24 counts compared 32 slots per thread at every sample
# size, three quarters of them padding at m = 1024. Now PER = m / 128 slots (a template).
# Prediction: the select 0.24 -> ~0.07 ms at A 16K (K = 64), the extra ~0.17 ms lower.
#   1. the contract test (+ memcheck; a new case: 2048 samples, K = 128), the GPU pytest files;
#   2. Nsight Compute's kernel times at A 16K general, top-k 64 and 256; the benches of call 2.
#   here:   scripts/device/bundle.sh && make python/spanhead/_spanhead.abi3.so
#   device: bash bench/results/2026-12-02-h200-run32/call4.sh
#           carry [".devbundle.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
. scripts/device/call_common.sh
SPH_TEST_SKIP_HUGE=1 step gpu_test_head_cuda_contract $LIMIT $B/bin/gpu_test_head_cuda_contract &
step memcheck_contract $LIMIT /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
  --error-exitcode 9 "$B/bin/gpu_test_head_cuda_contract" &
SPANHEAD_LIB=$B/lib/libspanhead.so.0 PYTHONPATH=$root/python SPANHEAD_CLI=$S \
  step pytest_gpu $LIMIT python3 -m pytest -rs -p no:cacheprovider --tb=short \
  python/tests/test_topk.py python/tests/test_policy_extras.py &
wait
for k in 64 256; do
  step ncu_k$k 120 /usr/local/cuda/bin/ncu --clock-control none --metrics gpu__time_duration.sum \
    --csv --kernel-name head_topk_seed_kernel \
    $S bench --shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk $k
done
P="--shape A,E --N 16K --active 1 --mask response --topk 64 --sum-p2"
step bench_x_general 100 $S bench $P --mode general --json "$R/bench_x_general.jsonl"
step bench_x_onepass 100 $S bench $P --mode one-pass --json "$R/bench_x_onepass.jsonl"
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
tail -3 "$R/pytest_gpu.log" 2>/dev/null
grep -h "ERROR SUMMARY" "$R/memcheck_contract.log" 2>/dev/null
grep -m8 -iE "fail|status [1-9]" "$R/gpu_test_head_cuda_contract.log"
for k in 64 256; do
  echo "== seed select, K = $k"
  python3 - "$R/ncu_k$k.log" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if rows:
    h = rows[0]
    ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
    for r in rows[1:]: print(f"{r[vi]:>12s} {r[ui]}  {r[ki][:40]}")
PY
done
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"; grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -12; done
tar czf "$OUT/call4.tgz" -C "$R" .
