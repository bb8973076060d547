#!/usr/bin/env bash
# call4.sh - run 33, call 4: the kept default's bench rows (v22's count, the new emission, the
# Poisson seed, the warp merge) from call 3's bundle, where that form is SPH_TEST_TOPK_VARIANT=1
# (the bundle's default was the spilling pairs); the GPU pytest files under the same setting.
# Prediction (call 3's kernel times): general A ~+7 %, E ~+3 %.
#   device: bash bench/results/2026-12-02-h200-run33/call4.sh
#           carry [".devbundle.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
. scripts/device/call_common.sh
export SPH_TEST_TOPK_VARIANT=1
SPANHEAD_LIB=$B/lib/libspanhead.so.0 PYTHONPATH=$root/python SPANHEAD_CLI=$S \
  step pytest_gpu $LIMIT python3 -m pytest -rs -p no:cacheprovider --tb=short \
  python/tests/test_topk.py python/tests/test_policy_extras.py
P="--shape A,E --N 16K --active 1 --mask response --topk 64 --sum-p2"
step bench_general 100 $S bench $P --mode general --json "$R/bench_general.jsonl"
step bench_onepass 100 $S bench $P --mode one-pass --json "$R/bench_onepass.jsonl"
step bench_a32k 100 $S bench --shape A --N 32K --active 1 --mask response --topk 64 --sum-p2 --mode both --json "$R/bench_a32k.jsonl"
step bench_k256 100 $S bench --shape A --N 16K --active 1 --topk 256 --sum-p2 --mode both --json "$R/bench_k256.jsonl"
step bench_policy 120 $S bench --shape A,B,D --N 16K --active 1 --mask response --mode policy --topk 64 --sum-p2 --json "$R/bench_policy.jsonl"
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
tail -2 "$R/pytest_gpu.log"
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"; grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | grep -E "topk|policy \||one-pass \||general \|" | head -16; done
tar czf "$OUT/call4.tgz" -C "$R" .
