#!/usr/bin/env bash
# call2.sh - run 32, call 2: call 1 cut the statistics kernel's instructions by 357 M (v22: the
# emission per candidate) and its time not at all (8.36 ms against 5.6 plain at A 16K, issue
# active 23 % against 25 %): the epilogue waits. v22b: both row halves' candidates counted,
# staged (the halves share the thread's 24 entries) and their atomicAdds issued before both
# statistics loops, the stores after both, so each atomic has two loops to return in.
# SPH_TEST_TOPK_PROBE separates the round trips (timing only, the lists come out wrong):
# 1 no read-backs, 2 no atomicAdds, 3 neither.
# Prediction: if the atomic's wait was the cost, v22b's kernel ~6.5 ms and probe 2 ~ v22b; if
# the read-backs, probe 1 ~plain; if neither moves, the stores' and reductions' traffic is
# the cost (next: fewer, wider stores).
#   here:   scripts/device/bundle.sh && make python/spanhead/_spanhead.abi3.so
#   device: bash bench/results/2026-12-02-h200-run32/call2.sh
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
step bench_policy 120 $S bench --shape A,B,D --N 16K --active 1 --mask response --mode policy --topk 64 --sum-p2 --json "$R/bench_policy.jsonl"
step ncu_a 120 /usr/local/cuda/bin/ncu --clock-control none --metrics gpu__time_duration.sum --csv \
  $S bench --shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2
M=smsp__inst_executed.sum,gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
for pr in 0 1 2 3; do
  SPH_TEST_TOPK_PROBE=$pr step ncu_probe$pr 200 /usr/local/cuda/bin/ncu --clock-control none \
    --kernel-name head_logits_sm90_kernel --launch-count 12 --metrics $M --csv \
    $S bench --shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2
done
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
tail -3 "$R/pytest_gpu.log" 2>/dev/null
grep -h "ERROR SUMMARY" "$R/memcheck_contract.log" 2>/dev/null
for f in "$R"/gpu_test_*.log; do
  grep -q "FAILED\|status [1-9]" "$f" && { echo "== $(basename "$f")"; grep -m8 -iE "fail|status" "$f"; }
done
python3 - "$R" <<'PY'
import csv, sys, collections, os
R = sys.argv[1]
rows = [r for r in csv.reader(open(f"{R}/ncu_a.log")) if len(r) > 10]
if rows:
    h = rows[0]
    ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
    sc = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}
    for r in rows[1:]:
        k = r[ki]
        t = float(r[vi].replace(',', '')) * sc.get(r[ui], 1e-6)
        if "topk" in k or "<__nv_bfloat16, 2, 1>" in k:
            print(f"{t:9.3f} ms  {k[:70]}")
for pr in range(4):
    f = f"{R}/ncu_probe{pr}.log"
    if not os.path.exists(f): continue
    rows = [r for r in csv.reader(open(f)) if len(r) > 10]
    if not rows: print(open(f).read()[-1500:]); continue
    h = rows[0]
    ii, ni, vi = (h.index(x) for x in ("ID", "Metric Name", "Metric Value"))
    by = collections.OrderedDict()
    for r in rows[1:]:
        by.setdefault(r[ni], {})[r[ii]] = r[vi]
    ids = sorted({r[ii] for r in rows[1:]}, key=int)
    print(f"== probe {pr}")
    for n, d in by.items():
        print(f"{n[:52]:52s} " + " ".join(f"{d.get(i, ''):>13s}" for i in ids))
PY
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"; grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -12; done
tar czf "$OUT/call2.tgz" -C "$R" .
