#!/usr/bin/env bash
# call1.sh - run 33, call 1: v23, two changes against the fused top-k's extra at A (run 32:
# +7.9 .. +11 % general at A 16K, the statistics kernel 7.5 ms against 5.6 plain, the merge
# 0.39 ms, the seed 0.19 ms):
#   (1) the merge as a warp per row for K <= 64 (tk_merge_warp: the packed entries, ~5 K, in
#       the warp's shared memory, the K-th largest key bit by bit over registers, a warp
#       bitonic sort of the ~K at or above it; the block per row only for the rows it cannot
#       take: recomputes, > 512 entries, ties). Prediction: 0.39 -> ~0.1 ms at A 16K;
#   (2) the epilogue's candidate test folded into the loop of the row's maximum (one basic
#       block, no branch on the row: the mask and stage chains interleave with the max's).
#       Prediction: the statistics kernel's extra 1.9 -> ~1.4 ms (if the separate loop's
#       chains were exposed latency; nothing if its issue slots are the cost).
# SPH_TEST_TOPK_VARIANT (correct lists either way): 1 v22's count loop, 2 the block merge.
# Then the statistics kernel's stalls per SASS instruction (PC sampling), to see where the
# remaining extra waits.
#   here:   scripts/device/bundle.sh && make python/spanhead/_spanhead.abi3.so
#   device: bash bench/results/2026-12-02-h200-run33/call1.sh
#           carry [".devbundle.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
. scripts/device/call_common.sh
[ -z "${NO_CHECKS:-}" ] && extras_checks
NCU=/usr/local/cuda/bin/ncu
A="$S bench --shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2"
M=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
for v in 0 1 2; do
  SPH_TEST_TOPK_VARIANT=$v step ncu_v$v 120 $NCU --clock-control none --metrics $M --csv $A
done
# PC sampling of the top-k statistics kernel (EPI 2, ping-pong): the launches of the bench's
# top-k row come after its plain ones; keep four and rank the one with the most instructions
step ncu_src 200 $NCU --clock-control none --section SourceCounters --section WarpStateStats \
  --kernel-name-base demangled --kernel-name "regex:head_logits_sm90_kernel<__nv_bfloat16, 2, 1>" \
  --launch-count 4 -o "$R/src" -f $A
for id in 0 1 2 3; do
  $NCU -i "$R/src.ncu-rep" --page source --csv --print-source sass --launch-skip $id \
    --launch-count 1 > "$R/src_$id.csv" 2> "$R/src_$id.err" ||
  $NCU -i "$R/src.ncu-rep" --page source --csv --launch-skip $id --launch-count 1 \
    > "$R/src_$id.csv" 2>> "$R/src_$id.err"
done
$NCU -i "$R/src.ncu-rep" --page details --csv > "$R/src_details.csv" 2>&1
P="--shape A,E --N 16K --active 1 --mask response --topk 64 --sum-p2"
for v in 0 1; do
  SPH_TEST_TOPK_VARIANT=$v step bench_general_v$v 100 $S bench $P --mode general --json "$R/bench_general_v$v.jsonl"
  SPH_TEST_TOPK_VARIANT=$v step bench_onepass_v$v 100 $S bench $P --mode one-pass --json "$R/bench_onepass_v$v.jsonl"
done
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
[ -z "${NO_CHECKS:-}" ] && extras_report
for v in 0 1 2; do
  echo "== variant $v"; ncu_table "$R/ncu_v$v.log" "2, 1>" topk
done
for id in 0 1 2 3; do
  echo "== PC sampling, launch $id"; head -c 300 "$R/src_$id.err"
  python3 scripts/device/ncu_sass_hot.py "$R/src_$id.csv" --cover 0.6 --top 45 | head -90
done > "$R/hot.txt" 2>&1
grep -E "^columns" "$R/hot.txt"
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"; grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -12; done
cp "$R/hot.txt" "$OUT/hot.txt"
rm -f "$R/src.ncu-rep.gz"; gzip -k "$R/src.ncu-rep" 2>/dev/null && mv "$R/src.ncu-rep.gz" "$OUT/" 2>/dev/null
rm -f "$R/src.ncu-rep"
tar czf "$OUT/call1.tgz" -C "$R" .
