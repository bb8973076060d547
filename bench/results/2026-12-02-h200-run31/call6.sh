#!/usr/bin/env bash
# call6.sh - run 31, call 6: call 5 profiled only the plain row's kernels (its launch count
# stopped before the top-k row). The statistics kernels (every 4th launch of the kernel: plain,
# plain, top-k, top-k), with the warp stall reasons per issued instruction, the
# instructions executed, and the global stores' and reductions' requests and sectors.
#   device: bash bench/results/2026-12-02-h200-run31/call6.sh   carry [".devbundle.txz"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
. scripts/device/call_common.sh
M=smsp__inst_executed.sum,sm__cycles_elapsed.avg,smsp__issue_active.avg.pct_of_peak_sustained_active
for s in long_scoreboard lg_throttle mio_throttle wait barrier membar math_pipe_throttle \
         short_scoreboard not_selected selected dispatch_stall no_instruction drain sleeping \
         branch_resolving imc_miss misc; do
  M=$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio
done
M=$M,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum
M=$M,l1tex__t_requests_pipe_lsu_mem_global_op_red.sum,l1tex__t_requests_pipe_lsu_mem_global_op_atom.sum
M=$M,lts__t_sectors_op_red.sum,lts__t_sectors_op_atom.sum,gpu__time_duration.sum
step ncu_stalls 300 /usr/local/cuda/bin/ncu --clock-control none \
  --kernel-name head_logits_sm90_kernel --launch-count 16 \
  --metrics $M --csv \
  $S bench --shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
python3 - "$R/ncu_stalls.log" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit(print(open(sys.argv[1]).read()[-3000:]))
h = rows[0]
ii, ni, vi = (h.index(x) for x in ("ID", "Metric Name", "Metric Value"))
by = collections.OrderedDict()
for r in rows[1:]:
    by.setdefault(r[ni], {})[r[ii]] = r[vi]
ids = [i for i in sorted({r[ii] for r in rows[1:]}, key=int) if int(i) % 4 == 0]
print(f"{'metric':78s} " + " ".join(f"{i:>14s}" for i in ids))
for n, d in by.items():
    print(f"{n[:78]:78s} " + " ".join(f"{d.get(i, ''):>14s}" for i in ids))
PY
tar czf "$OUT/call6.tgz" -C "$R" .
