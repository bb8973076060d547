#!/usr/bin/env bash
# call4.sh - run 31, call 4: v21, no global round trip waits on the fused top-k's epilogue
# but the rare read-back. Call 3 (Nsight Compute, A 16K general, top-k 64 + sum_p2): with every
# seed +inf (no candidate at all) the statistics kernel is ~plain (5.8 .. 7.3 ms against
# 5.6 .. 6.9, noisy); with the seed and the minimum rule (1350 candidates per row) 8.5 .. 8.6
# ms (+2.8 ms), with the probes (607) 11.6 .. 11.7 ms. So the cost is per tile, not per
# candidate: a consumer warpgroup's epilogue ends with its slowest row, and nearly every
# tile has a row whose quad waited on its atomicAdd (every row and tile with candidates) or
# on its slots (a read-back: ~1 in 50 rows and tiles, so ~3 in 4 warpgroup-tiles of 64 rows).
# v21: the atomicAdd issued before the row's statistics loop, its result used after it (the
# loop's ~500 instructions per thread hide its latency); the probes gone (the minimum of K'
# slots), the read-back every 256 candidates (~5 per row). Prediction: the statistics kernel
# ~plain + 1.2 .. 1.8 ms at A 16K (the read-backs' delays and the stores), general A +5 .. +7 %,
# E +2 .. +3 %; the read-back period's sweep (128 .. 1024) shows how much the read-backs cost.
#   1. the contract test (+ memcheck), the TP program, the GPU pytest files of the extras;
#   2. top-k 64 + sum_p2 at A, E 16K general and one-pass, A 32K, the period's sweep at A 16K
#      general with the candidate counts, K = 256 at A, the policy call at A, B, D 16K,
#      Nsight Compute's kernel times at A 16K general.
#   here:   scripts/device/bundle.sh && make python/spanhead/_spanhead.abi3.so
#   device: bash bench/results/2026-12-02-h200-run31/call4.sh
#           carry [".devbundle.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
. scripts/device/call_common.sh
if [ -z "${NO_CHECKS:-}" ]; then
  for t in $B/bin/gpu_test_head_cuda_contract $B/bin/gpu_test_head_cuda_tp; do
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
step bench_x_onepass 100 $S bench $P --mode one-pass --json "$R/bench_x_onepass.jsonl"
step bench_x_a32k 100 $S bench --shape A --N 32K --active 1 --mask response --topk 64 --sum-p2 --mode both --json "$R/bench_x_a32k.jsonl"
A="--shape A --N 16K --active 1 --mask response --topk 64 --sum-p2 --mode general"
for ev in 128 256 512 1024; do
  ( export SPH_TEST_TOPK_EVERY=$ev
    SPH_TEST_TOPK_COUNT=1 timeout 60 $S bench $A --repeats 1 --warmup 0 2>&1 \
      | grep "spanhead top-k" | head -2 > "$R/count_every$ev.txt"
    step "bench_every$ev" 60 $S bench $A --json "$R/bench_every$ev.jsonl" )
done
step bench_k256 60 $S bench --shape A --N 16K --active 1 --mask response --topk 256 --mode both --json "$R/bench_k256.jsonl"
step bench_policy 120 $S bench --shape A,B,D --N 16K --active 1 --mask response --mode policy --topk 64 --sum-p2 --json "$R/bench_policy.jsonl"
step ncu_a 120 /usr/local/cuda/bin/ncu --clock-control none --metrics gpu__time_duration.sum --csv \
  $S bench --shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
tail -3 "$R/pytest_gpu.log" 2>/dev/null
grep -h "ERROR SUMMARY" "$R/memcheck_contract.log" 2>/dev/null
for f in "$R"/gpu_test_*.log; do
  grep -q "FAILED\|status [1-9]" "$f" && { echo "== $(basename "$f")"; grep -m8 -iE "fail|status" "$f"; }
done
for f in "$R"/count_*.txt; do echo "== $(basename "$f")"; cat "$f"; done
python3 - "$R/ncu_a.log" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if rows:
    h = rows[0]
    ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
    sc = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}
    for r in rows[1:]:
        k = r[ki]
        t = float(r[vi].replace(',', '')) * sc.get(r[ui], 1e-6)
        if "topk" in k or "<__nv_bfloat16, 2, 1>" in k or ("nvjet" in k and "TNT" in k):
            print(f"{t:9.3f} ms  {k[:70]}")
PY
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"; grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -12; done
tar czf "$OUT/call4.tgz" -C "$R" .
