#!/usr/bin/env bash
# call4.sh - run 30, call 4: where v19c's extra time goes at A 16K (general, top-k 64), per
# kernel under Nsight Compute (GPU time, one repeat, no warm-up): the plain point alone, then
# the point with --topk 64 (its plain run, then its extras run), kernel by kernel in launch
# order, so the extras run's statistics kernel, merge kernel and the rest separate.
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
B=$root/.devbundle
[ -d "$B/bin" ] || { mkdir -p "$B" && tar xJf "$root/.devbundle.txz" -C "$B"; } || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64 PATH=/usr/local/cuda/bin:$PATH
for K in 0 64; do
  x=""; [ $K -gt 0 ] && x="--topk $K"
  timeout 250 ncu --clock-control none --metrics gpu__time_duration.sum --csv $B/bin/spanhead bench \
    --shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0 $x > "$OUT/ncu_k$K.csv" 2> "$OUT/ncu_k$K.err"
  echo "k=$K rc=$?"
done
python3 - "$OUT/ncu_k64.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]
ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
sc = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}
for r in rows[1:]:
    print(f"{float(r[vi].replace(',', '')) * sc.get(r[ui], 1e-6):9.3f} ms  {r[ki][:90]}")
PY
