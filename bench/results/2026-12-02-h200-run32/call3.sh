#!/usr/bin/env bash
# call3.sh - run 32, call 3: why the seed's select takes 0.24 ms for 16K rows x 1024 samples
# (call 2: halving its barriers changed nothing) and where the merge's 0.39 ms go: Nsight
# Compute's launch statistics, occupancy, memory throughput and stall reasons of
# head_topk_seed_kernel and head_topk_merge_kernel at A 16K general (top-k 64 + sum_p2).
# Prediction: the seed's select is latency-bound on its 24 dependent block-wide counts at low
# occupancy (the u[32] array: registers), not on memory.
#   device: bash bench/results/2026-12-02-h200-run32/call3.sh   carry [".devbundle.txz"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
. scripts/device/call_common.sh
M=gpu__time_duration.sum,launch__registers_per_thread,launch__shared_mem_per_block_static
M=$M,sm__warps_active.avg.pct_of_peak_sustained_active,launch__occupancy_limit_registers
M=$M,launch__occupancy_limit_shared_mem,launch__occupancy_limit_blocks,dram__bytes.sum
M=$M,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
for s in long_scoreboard barrier membar short_scoreboard mio_throttle lg_throttle wait \
         not_selected math_pipe_throttle no_instruction; do
  M=$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio
done
for k in head_topk_seed_kernel head_topk_merge_kernel; do
  step ncu_$k 120 /usr/local/cuda/bin/ncu --clock-control none --kernel-name $k \
    --launch-count 1 --metrics $M --csv \
    $S bench --shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2
done
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
for k in head_topk_seed_kernel head_topk_merge_kernel; do
  echo "== $k"
  python3 - "$R/ncu_$k.log" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit(print(open(sys.argv[1]).read()[-2000:]))
h = rows[0]
ni, ui, vi = h.index("Metric Name"), h.index("Metric Unit"), h.index("Metric Value")
for r in rows[1:]: print(f"{r[ni][:70]:70s} {r[vi]:>16s} {r[ui]}")
PY
done
tar czf "$OUT/call3.tgz" -C "$R" .
