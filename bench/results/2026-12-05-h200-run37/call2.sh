#!/usr/bin/env bash
# call2.sh - run 37, call 2: the extras' share (top-k 64 + sum_p2 over plain log-probs,
# interleaved rows, 10 repetitions, response mask) at A, D, E 16K, general and one-pass, under
# SPH_TEST_TOPK_VARIANT 0 (v29, the default), 64 (the small seed), 96 (the group skip and the
# small seed), 48 (the K-th read-back and the group skip) and 112 (all three) with every 128:
# which of them to make the default.
# Prediction (run 36 call 3 for 0: general A +3.3 / +3.7, D +3.8, E +2.4 / +1.7 %; one-pass A
# +3.2 .. +3.8, D +2.8, E +2.5 %; the model's instructions, call1.sh, at ~4 ms per G where
# the epilogue is the critical path): 64 takes the seed's ~0.13 ms off every 16K row's extra
# (A general -0.45 points, one-pass -0.6, D -0.2, E -0.1); 96 adds D's group skip (-63 M:
# D -0.6 points); 48 / 112 with every 128: D -0.8 .. -1 point, A as 0 / as 64. E has no group
# skip (cooperative launches): only the seed and the merge move it.
#   device: bash bench/results/2026-12-05-h200-run37/call2.sh general    (then one-pass; or
#           `both`: both modes in one call without 48, when device time is short; `quick`:
#           0, 64 and 112 / every 128 at 6 repetitions, then `call1.sh checks` in the same call)
#           carry [".devbundle-v30b.txz"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
rm -rf .devbundle && mkdir -p .devbundle && tar xJf .devbundle-v30b.txz -C .devbundle
. scripts/device/call_common.sh
cp "$R/machine.txt" "$OUT/"; R=$OUT
REPS=10
row() { # row <name> <variant> <every> <mode>
  SPH_TEST_TOPK_VARIANT=$2 SPH_TEST_TOPK_EVERY=$3 step bench_$4_$1 100 $S bench --shape A,D,E \
    --N 16K --active 1 --mask response --mode $4 --topk 64 --sum-p2 --repeats $REPS \
    --json "$R/bench_$4_$1.jsonl"
}
m=${1:-general} # one mode per call: five rows of ~45 s each
if [ "$m" = quick ]; then # one call for everything: `call2.sh quick; call1.sh checks`
  REPS=6
  for m in general one-pass; do row v0 0 256 $m; row v64 64 256 $m; row v112_e128 112 128 $m; done
elif [ "$m" = both ]; then # short of device time: both modes in one call, four rows each
  for m in general one-pass; do
    row v0 0 256 $m; row v64 64 256 $m; row v96 96 256 $m; row v112_e128 112 128 $m
  done
else
  row v0 0 256 $m; row v64 64 256 $m; row v96 96 256 $m; row v48_e128 48 128 $m
  row v112_e128 112 128 $m
fi
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"
  grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -12
done
