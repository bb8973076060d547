#!/usr/bin/env bash
# call2.sh - run 39, call 2 (~7 min): the extras' share (top-k 64 + sum_p2 over plain
# log-probs, interleaved rows, 10 repetitions, response mask) at A, D, E 16K, general and
# one-pass, variants 0 (v32) and 16 (v31's per-row kernels), then the head's GPU test program
# on both schedules (the merge of del-v30-bits: the cooperative one-pass kernels lost 8 bytes
# of stack).
# Prediction: v32 takes ~0.14 ms off every 16K row's extra: general A -0.5 points (run 37's
# default +3.1 / +5.8 %, run 36 +3.3 / +3.7), one-pass A -0.6, D -0.3, E -0.2; the test
# programs pass.
#   device: bash bench/results/2026-12-05-h200-run39/call2.sh
#           carry [".devbundle-v32.txz"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
rm -rf .devbundle && mkdir -p .devbundle && tar xJf .devbundle-v32.txz -C .devbundle
. scripts/device/call_common.sh
trap 'tar czf "$OUT/call2.tgz" -C "$R" .' EXIT
REPS=${REPS:-10}
row() { # row <name> <variant> <mode>
  SPH_TEST_TOPK_VARIANT=$2 step bench_$3_$1 100 $S bench --shape A,D,E --N 16K --active 1 \
    --mask response --mode $3 --topk 64 --sum-p2 --repeats $REPS --json "$R/bench_$3_$1.jsonl"
}
for m in general one-pass; do row v0 0 $m; row v16 16 $m; done
if [ "${1:-}" != bench ]; then
  SPH_GPU_TESTS=-test_huge step gpu_test_head_cuda 220 "$B/bin/gpu_test_head_cuda" &
  SPH_CUDA_PINGPONG=0 SPH_GPU_TESTS=-test_huge step gpu_test_head_cuda_cooperative 220 \
    "$B/bin/gpu_test_head_cuda" &
  wait
fi
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
for f in "$R"/gpu_test_*.log; do
  grep -q "FAILED\|status [1-9]" "$f" && { echo "== $(basename "$f")"; grep -m8 -iE "fail|status" "$f"; }
  echo "== $(basename "$f"): $(grep -E "PASSED|FAILED" "$f" | tail -2 | tr '\n' ' ')"
done
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"
  grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -12
done
