#!/usr/bin/env bash
# call4.sh - run 39, call 4 (~2 min): the extras' share on the final code (bundle v32b,
# variant 0), 20 repetitions, interleaved rows, response mask and none, A, D, E 16K, general
# and one-pass: the closing numbers of the session. Prediction: as run 36 call 3 (general A
# +3.3 / +3.7 %, D +3.8, E +2.4 / +1.7; one-pass A +3.8 / +3.2, D +2.8, E +2.5) less ~0.2
# points at A and D (v32's ~60 us per 16K rows), within the card's +-0.7.
#   device: bash bench/results/2026-12-05-h200-run39/call4.sh
#           carry [".devbundle-v32b.txz"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
rm -rf .devbundle && mkdir -p .devbundle && tar xJf .devbundle-v32b.txz -C .devbundle
. scripts/device/call_common.sh
trap 'tar czf "$OUT/call4.tgz" -C "$R" .' EXIT
for m in general one-pass; do
  step bench_$m 120 $S bench --shape A,D,E --N 16K --active 1 --mask response --mode $m \
    --topk 64 --sum-p2 --repeats 20 --json "$R/bench_$m.jsonl"
done
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"
  grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -12
done
