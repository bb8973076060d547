#!/usr/bin/env bash
# call5.sh - run 31, call 5: where the fused top-k's ~2.6 ms go (v21, call 4's bundle). Call 4:
# the statistics kernel 8.4 .. 8.5 ms against 5.8 .. 6.9 plain at A 16K general (top-k 64 +
# sum_p2), the same as v20's seed + minimum rule although the atomicAdd's wait is off the
# critical path now; reading the slots back 8x less often (every 1024: 1897 candidates per row
# instead of 1238) costs the same too. Not the round trips, then, and not the candidates'
# number: Nsight Compute's warp-state, scheduler, instruction and memory sections of the plain
# and the top-k statistics kernels say what the warps wait on (stall reasons per instruction
# issued), how many instructions each runs, and the L1 / L2 traffic of the stores and atomics.
#   here:   (call 4's bundle)   device: bash bench/results/2026-12-02-h200-run31/call5.sh
#           carry [".devbundle.txz"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
. scripts/device/call_common.sh
step ncu_sections 300 /usr/local/cuda/bin/ncu --clock-control none \
  --kernel-name regex:head_logits_sm90_kernel --launch-count 8 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section InstructionStats --section MemoryWorkloadAnalysis --csv --page details \
  $S bench --shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
python3 - "$R/ncu_sections.log" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit(print(open(sys.argv[1]).read()[-3000:]))
h = rows[0]
ii, ki, ni, ui, vi = (h.index(x) for x in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
by = collections.OrderedDict()
for r in rows[1:]:
    by.setdefault(r[ii], []).append(r)
for i, rs in by.items():
    dur = [r[vi] for r in rs if r[ni] == "Duration"]
    print(f"== kernel {i} {rs[0][ki][:60]} duration {dur[:1]}")
    for r in rs:
        n = r[ni]
        if any(s in n for s in ("Stall", "Warp Cycles", "Issued", "Executed Ipc", "Instructions",
                                "Throughput", "Eligible", "No Eligible", "Active Warps", "L1/TEX Hit",
                                "L2 Hit", "Mem Busy", "Max Bandwidth", "Issue Slots")):
            print(f"   {n[:60]:60s} {r[vi]:>14s} {r[ui]}")
PY
tar czf "$OUT/call5.tgz" -C "$R" .
