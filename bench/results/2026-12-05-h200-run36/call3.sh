#!/usr/bin/env bash
# call3.sh - run 36, call 3: the extras' cost with v29 (call 2's bundle, the code of b46f6bf)
# at 16K and 64K rows (issue 25: "< 3 % at K = 64 from 16K rows up"), the bench's interleaved
# rows (ABBA, the share the median of the repetitions' own ratios), 20 repetitions: general and
# one-pass at A, D, E; the policy loss at A, D 16K.
# Prediction: as call 2 at 16K (general A +3.5 .. +4.6 %, D +2.7 .. +3.9 %, E +1.6 .. +2.4 %;
# one-pass A +3.5 %, D +3 .. +5 %, E +1.5 .. +2.7 %); at 64K the same or lower (the seed and the
# merge are per row, the epilogue's work per tile: the share should not grow with N).
#   device: bash bench/results/2026-12-05-h200-run36/call3.sh
#           carry [".devbundle-v29.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
rm -rf .devbundle && mkdir -p .devbundle && tar xJf .devbundle-v29.txz -C .devbundle
. scripts/device/call_common.sh
for m in general one-pass; do
  step bench_$m 260 $S bench --shape A,D,E --N 16K,64K --active 1 --mask response --mode $m \
    --topk 64 --sum-p2 --repeats 20 --json "$R/bench_$m.jsonl"
done
step bench_policy 120 $S bench --shape A,D --N 16K --active 1 --mask response --mode policy \
  --topk 64 --sum-p2 --repeats 20 --json "$R/bench_policy.jsonl"
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"
  grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -24
done
tar czf "$OUT/call3.tgz" -C "$R" .
