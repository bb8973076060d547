#!/usr/bin/env bash
# call2.sh - run 37, call 2: the extras' share (top-k 64 + sum_p2 over plain log-probs,
# interleaved rows, 10 repetitions, response mask) at A, D, E 16K, general and one-pass, under
# SPH_TEST_TOPK_VARIANT 0 (v29, the default), 64 (the small seed), 112 (all three of v30's
# bits) with every 64, and 80 (no group skip) with every 64: which of them to make the default.
# Prediction (run 36 call 3 for 0: general A +3.3 / +3.7, D +3.8, E +2.4 / +1.7 %; one-pass A
# +3.2 .. +3.8, D +2.8, E +2.5 %): 64 takes ~0.12 ms off every 16K row's extra (A general
# -0.4 points, one-pass -0.5); 112 + every 64 a further -0.2 .. -0.5 points at A and -0.5 ..
# -1 at D (the group skip: 55 % of D's groups empty in the simulation), less at E (its
# cooperative launches have no group skip: fewer candidates and a smaller merge only).
#   device: bash bench/results/2026-12-05-h200-run37/call2.sh
#           carry [".devbundle-v30.txz"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
rm -rf .devbundle && mkdir -p .devbundle && tar xJf .devbundle-v30.txz -C .devbundle
. scripts/device/call_common.sh
cp "$R/machine.txt" "$OUT/"; R=$OUT
row() { # row <name> <variant> <every> <mode>
  SPH_TEST_TOPK_VARIANT=$2 SPH_TEST_TOPK_EVERY=$3 step bench_$4_$1 120 $S bench --shape A,D,E \
    --N 16K --active 1 --mask response --mode $4 --topk 64 --sum-p2 --repeats 10 \
    --json "$R/bench_$4_$1.jsonl"
}
for m in general one-pass; do
  row v0 0 256 $m; row v64 64 256 $m; row v112_e64 112 64 $m; row v80_e64 80 64 $m
done
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"
  grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -12
done
