#!/usr/bin/env bash
# call1.sh - run 36, call 1: v28 (the one-pass statistics epilogue's whole-tile copy, without
# softcap) and the bench's interleaved extras rows.
# - v28: the one-pass kernel (statistics + E) gets v27's whole-tile copy (no column tests) for
#   launches without softcap; its stack stays 8 bytes (with softcap's copy too it went to 32).
# - bench: a point's plain and extras configurations now alternate within each repetition
#   (ABBA), extra_pct the median of the repetitions' own ratios; the policy rows interleave too.
# Prediction: the checks pass; Nsight at A 16K one-pass, top-k 64 + sum_p2: the one-pass
# statistics + E launch -5 .. -8 % instructions plain and with top-k (v27 took the general
# launch's -59 M plain, -231 M with top-k, and the one-pass epilogue is the general's plus the
# E stores); one-pass A extra +8 .. +11 % -> ~+4 .. +6 %; the plain one-pass row -1 .. -3 %
# against v27's library (.devbundle-v27.txz: run 35's libspanhead, the same CLI).
#   here:   scripts/device/bundle.sh && make python/spanhead/_spanhead.abi3.so
#   device: bash bench/results/2026-12-05-h200-run36/call1.sh
#           carry [".devbundle.txz", ".devbundle-v27.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
rm -rf .devbundle .devbundle-v27 # this call's bundles, never a warm machine's earlier ones
. scripts/device/call_common.sh
L27=$root/.devbundle-v27
mkdir -p "$L27" && tar xJf "$root/.devbundle-v27.txz" -C "$L27"
[ -z "${NO_CHECKS:-}" ] && extras_checks
op="$S bench --shape A --N 16K --active 1 --mode one-pass --repeats 1 --warmup 0 --topk 64 --sum-p2"
for lib in new v27; do
  ll=$LD_LIBRARY_PATH; [ $lib = v27 ] && ll=$L27/lib:$LD_LIBRARY_PATH
  LD_LIBRARY_PATH=$ll step ncu_op_$lib 120 /usr/local/cuda/bin/ncu --clock-control none \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum --csv $op
done
for m in one-pass general; do
  step bench_${m} 200 $S bench --shape A,D,E --N 16K --active 1 --mask response \
    --topk 64 --sum-p2 --mode $m --repeats 20 --json "$R/bench_$m.jsonl"
done
LD_LIBRARY_PATH=$L27/lib:$LD_LIBRARY_PATH step bench_one-pass_v27 200 $S bench --shape A,D \
  --N 16K --active 1 --mask response --topk 64 --sum-p2 --mode one-pass --repeats 20 \
  --json "$R/bench_one-pass_v27.jsonl"
step bench_policy 200 $S bench --shape A,D --N 16K --active 1 --mask response --topk 64 \
  --sum-p2 --mode policy --repeats 10 --json "$R/bench_policy.jsonl"
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
[ -z "${NO_CHECKS:-}" ] && extras_report
for lib in new v27; do echo "== ncu $lib"; ncu_table "$R/ncu_op_$lib.log" "10, 1>" topk_merge | tail -n 14; done
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"
  grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -14
done
tar czf "$OUT/call1.tgz" -C "$R" .
