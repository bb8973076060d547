#!/usr/bin/env bash
# call1.sh - run 32, call 1: v22, the fused top-k's cost per candidate instead of per position.
# Run 31 call 6: the statistics kernel with top-k 64 + sum_p2 executed +825 M warp instructions
# (+72 %) at A 16K, the stall profile unchanged: v21's emission loop ran its body at every
# position where any lane of the warp had a candidate (~1650 instructions per warp, tile and
# row half). v22: the count loop keeps a 64-bit mask of the candidates' positions and stages
# their values in shared memory (24 per thread and row half, 25 KB past the barriers); the
# emission walks the mask's bits (the warp's largest count of iterations, ~4 .. 6) and the
# staged values; a thread with more candidates than the stage holds emits from its registers
# (v21's loop). The merge packs the entries that reach max(the final threshold, the fresh
# minimum of the slots) (~300 of ~1350 per row) before its radix passes, and finds each pass's
# bin with a warp scan instead of one thread's serial walk; the seed's select takes one
# barrier per step instead of two.
# Prediction: instructions of the statistics kernel +825 M -> ~+200 M; its time 8.4 -> ~6.6 ms
# at A 16K; the merge 0.76 -> ~0.3 ms, the seed's select 0.25 -> ~0.15 ms: general A
# +13.9 % -> +5 .. +6 %, E +5 % -> +2 .. +3 %.
#   1. the contract test (+ memcheck), the TP program, the GPU pytest files of the extras;
#   2. top-k 64 + sum_p2 at A, E 16K general and one-pass, A 32K, K = 256 at A, the policy
#      call at A, B, D 16K, the candidate counts at A 16K, Nsight Compute's kernel times at A
#      16K general (every kernel of the extras) and the statistics kernel's instructions.
#   here:   scripts/device/bundle.sh && make python/spanhead/_spanhead.abi3.so
#   device: bash bench/results/2026-12-02-h200-run32/call1.sh
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
SPH_TEST_TOPK_COUNT=1 timeout 60 $S bench $A --repeats 1 --warmup 0 2>&1 \
  | grep "spanhead top-k" | head -2 > "$R/count_a.txt"
step bench_k256 60 $S bench --shape A --N 16K --active 1 --mask response --topk 256 --mode both --json "$R/bench_k256.jsonl"
step bench_policy 120 $S bench --shape A,B,D --N 16K --active 1 --mask response --mode policy --topk 64 --sum-p2 --json "$R/bench_policy.jsonl"
step ncu_a 120 /usr/local/cuda/bin/ncu --clock-control none --metrics gpu__time_duration.sum --csv \
  $S bench --shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2
M=smsp__inst_executed.sum,gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
M=$M,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_requests_pipe_lsu_mem_global_op_red.sum
step ncu_inst 200 /usr/local/cuda/bin/ncu --clock-control none \
  --kernel-name head_logits_sm90_kernel --launch-count 16 --metrics $M --csv \
  $S bench --shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
tail -3 "$R/pytest_gpu.log" 2>/dev/null
grep -h "ERROR SUMMARY" "$R/memcheck_contract.log" 2>/dev/null
for f in "$R"/gpu_test_*.log; do
  grep -q "FAILED\|status [1-9]" "$f" && { echo "== $(basename "$f")"; grep -m8 -iE "fail|status" "$f"; }
done
echo "== counts"; cat "$R/count_a.txt"
python3 - "$R/ncu_a.log" "$R/ncu_inst.log" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if rows:
    h = rows[0]
    ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
    sc = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}
    for r in rows[1:]:
        k = r[ki]
        t = float(r[vi].replace(',', '')) * sc.get(r[ui], 1e-6)
        if "topk" in k or "extras" in k or "<__nv_bfloat16, 2, 1>" in k or ("nvjet" in k and "TNT" in k):
            print(f"{t:9.3f} ms  {k[:70]}")
rows = [r for r in csv.reader(open(sys.argv[2])) if len(r) > 10]
if rows:
    h = rows[0]
    ii, ni, vi = (h.index(x) for x in ("ID", "Metric Name", "Metric Value"))
    by = collections.OrderedDict()
    for r in rows[1:]:
        by.setdefault(r[ni], {})[r[ii]] = r[vi]
    ids = [i for i in sorted({r[ii] for r in rows[1:]}, key=int) if int(i) % 4 == 0]
    print(f"{'metric':60s} " + " ".join(f"{i:>14s}" for i in ids))
    for n, d in by.items():
        print(f"{n[:60]:60s} " + " ".join(f"{d.get(i, ''):>14s}" for i in ids))
PY
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"; grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -12; done
tar czf "$OUT/call1.tgz" -C "$R" .
