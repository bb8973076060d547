#!/usr/bin/env bash
# call3.sh - run 31, call 3: the fused top-k's per-tile cost, not its candidates'. Call 2
# (A 16K general, top-k 64 + sum_p2): the candidates per row and the extra barely related:
# v19d's rule 3050 per row +14.2 %, the seed + the minimum rule 1234 +15.3 % (every 128) and
# 1350 +13.8 % (every 256), the probes 607 .. 820 +24 .. +29 %. So what the extra costs is
# per tile and row, whatever it emits: the count loop, the quad scan, the atomicAdd's round
# trip (one per quad and row with candidates), the read-back's round trips. Nsight Compute's
# kernel times (one forward each) separate them:
#   seed_inf: every seed +inf (SPH_TEST_TOPK_SEED=inf): no candidate at all, so the epilogue
#     runs only its compare loop and the scan's shuffles (the merge then recomputes every row:
#     its time is no measurement); prediction: the statistics kernel ~plain + 0.3 ms if the
#     round trips are the cost, ~the full extra if the loops are;
#   min256: the seed, the minimum rule, every 256 (call 2's best, +13.8 %);
#   default: the seed, probes, every 64 (call 1's ~11.7 ms).
#   here:   (call 2's bundle)   device: bash bench/results/2026-12-02-h200-run31/call3.sh
#           carry [".devbundle.txz"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
. scripts/device/call_common.sh
P="--shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2"
nc() { # name env...
  local name=$1; shift
  ( export "$@"; step "ncu_$name" 120 /usr/local/cuda/bin/ncu --clock-control none \
      --metrics gpu__time_duration.sum --csv $S bench $P )
}
nc seed_inf SPH_TEST_TOPK_SEED=inf
nc min256 SPH_TEST_TOPK_RULE=min SPH_TEST_TOPK_SLOTS=1 SPH_TEST_TOPK_EVERY=256
nc default X=1
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
for f in "$R"/ncu_*.log; do
  echo "== $(basename "$f")"
  python3 - "$f" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if rows:
    h = rows[0]
    ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
    sc = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}
    for r in rows[1:]:
        k = r[ki]
        if "nvjet" in k or "gemm" in k.lower(): continue
        t = float(r[vi].replace(',', '')) * sc.get(r[ui], 1e-6)
        if t > 0.05: print(f"{t:9.3f} ms  {k[:70]}")
PY
done
tar czf "$OUT/call3.tgz" -C "$R" .
