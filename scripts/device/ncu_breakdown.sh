#!/usr/bin/env bash
# ncu_breakdown.sh - on the device machine, inside the carried bundle: per-kernel GPU time of
# one bench point (one repeat, no warm-up) under Nsight Compute, summed by kernel name, so a
# pass's time splits into its logits / fused / cuBLAS / elementwise parts.
#   usage: ncu_breakdown.sh SHAPE MODE [N]     (MODE general or one-pass; table on stdout)
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
shape=$1 mode=$2 n=${3:-16K}
csv=$OUT/ncu_${shape}_${mode}_${n}.csv
timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv ./bin/spanhead bench \
  --shape "$shape" --N "$n" --active 1 --mask response --mode "$mode" --repeats 1 --warmup 0 \
  >"$csv" 2>"$csv.err" || { echo "ncu failed: $(tail -3 "$csv.err")"; exit 1; }
python3 - "$csv" "$shape" "$mode" "$n" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]
ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}
agg = collections.OrderedDict()
for r in rows[1:]:
    a = agg.setdefault(r[ki][:80], [0, 0.0])
    a[0] += 1
    a[1] += float(r[vi].replace(",", "")) * scale.get(r[ui], 1e-6)
# two bench points run (the maskless one and the response mask at active 1): per point = / 2
print(f"## {sys.argv[2]} {sys.argv[3]} N={sys.argv[4]}: GPU time per kernel, per bench point")
print("| launches | ms | kernel |\n|---|---|---|")
for k, (n, t) in agg.items():
    print(f"| {n / 2:g} | {t / 2:.3f} | `{k}` |")
PY
