#!/usr/bin/env bash
# call2.sh - run 34, call 2 (pending: no device was lent in the sessions of 2026-12-02 night
# and 2026-12-04; the next device session runs it as its first call, in a folder of its own):
# the checks of v26 and v25:
# - v26, now the default emission: the staged candidates at 16-17 SASS instructions each
#   instead of 40-47 (scripts/sass_epi.sh: the row's pointer formed once, the mask's words as
#   two 32-bit loops, the place clamped instead of a branch, one slot raise per thread and row
#   half instead of one per candidate), the overflowing threads' register emission before the
#   statistics loops in the general kernel too; the statistics kernels' stack 0 (general) and
#   8 (one-pass) bytes, against 0 and 40 in call 1's binary;
# - v27, the general statistics epilogue's whole-tile copy without column tests: 1616 SASS
#   instructions per tile and thread against 1960 plain (6608 against 7984 with top-k);
# - bit 0, v25: both row halves counted in one loop (their stage-pointer chains side by side,
#   the second half's stage filled from the top down), the rows' maxima as two chains of 32.
# Prediction: the checks pass (the contract test: every fused case runs v26; seven fused cases
# rerun under six variant sets, v25's stage at 6 entries among them). Nsight at A 16K, top-k 64
# + sum_p2, the statistics kernel: call 1's default 7.667 ms, 1.551 G instructions; v26 -40 ..
# -60 M instructions (per warp and tile ~8.4 emission iterations at ~43 instructions become
# ~10 at ~16.5: two word loops run the warp's largest count of each word), -0.15 .. -0.25 ms at
# run 33's ~4 ms per G; v25 (variant 1) -0.0 .. -0.3 ms more (the same instructions, two
# dependent chains at a time). v27: the plain statistics launch (5.6 .. 6.2 ms in runs 32-34)
# -0.2 .. -0.35 ms, ~-86 M instructions; the top-k launch the same on top of v26's. Bench
# rows: general A +7.3 -> ~+6 .. +6.5 % (the plain row itself -0.7 .. -1.3 %), E ~+2.5 %.
#   here:   scripts/device/bundle.sh && make python/spanhead/_spanhead.abi3.so
#   device: bash bench/results/2026-12-02-h200-run34/call2.sh
#           carry [".devbundle.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
. scripts/device/call_common.sh
[ -z "${NO_CHECKS:-}" ] && extras_checks
topk_ncu 0 1
topk_bench general 0 1
topk_bench one-pass 0 1
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
[ -z "${NO_CHECKS:-}" ] && extras_report
topk_report 0 1
tar czf "$OUT/call2.tgz" -C "$R" .
