"""ncu_table.py <ncu --csv log> [substring ...]: one line per launch and metric of an Nsight
Compute CSV log (gpu__time_duration in ms), only kernels whose name holds one of the
substrings (all without). Sourced through call_common.sh's ncu_table."""
import csv
import sys

SCALE = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit(print(open(sys.argv[1]).read()[-2000:]))
h = rows[0]
ii, ki, ni, ui, vi = (h.index(x) for x in ("ID", "Kernel Name", "Metric Name", "Metric Unit",
                                           "Metric Value"))
keep = sys.argv[2:]
for r in rows[1:]:
    if keep and not any(k in r[ki] for k in keep):
        continue
    if r[ni] == "gpu__time_duration.sum":
        t = float(r[vi].replace(",", "")) * SCALE.get(r[ui], 1e-6)
        print(f"{r[ii]:>4s} {t:9.3f} ms  {r[ki][:70]}")
    else:
        print(f"{r[ii]:>4s} {r[ni][:60]:60s} {r[vi]:>16s} {r[ui]}  {r[ki][:40]}")
