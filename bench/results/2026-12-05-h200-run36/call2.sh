#!/usr/bin/env bash
# call2.sh - run 36, call 2: v29 against v28 (call 1's library) in the same call.
# v29, the epilogues' per-logit work on whole tiles (no softcap):
# - the backward's dlogits epilogue (16-byte stores) gets a whole-tile copy: no column tests,
#   the math folded into per-row coefficients (p = 2^(u it log2e - lse log2e), du = p (it cp -
#   eg it^2 u) + it gmV: FFMA, the exponential, two FFMA where there were ~10 instructions),
#   inactive rows zeroed on the packed words;
# - the statistics epilogue's exponential takes its argument from one FFMA (z log2e - mx log2e);
# - both have a copy without the target's compare, taken by a warp none of whose 16 rows has its
#   target in the tile (~14 of 15 warp-tiles at V 62080).
# SASS per tile and thread (scripts/sass_epi.sh): dlogits 3032 -> 1664 (with a target) / 1368
# (without); statistics, whole tile, plain 1616 -> 1488 / 1240; the kernels' stack 0 (the
# one-pass kernel's too, 8 before).
# Prediction: the checks pass (the contract test against the float64 reference, TP, memcheck,
# Python); Nsight at A 16K: the dlogits launches (3 chunks, ~2.1 .. 2.4 ms each against ~1.7
# for cuBLAS's GEMM of the same size in run 35) -300 .. -400 M instructions together and -0.6
# .. -1.2 ms; the plain statistics launch -60 .. -90 M instructions, -0.1 .. -0.3 ms; general
# A -3 .. -6 %, D about the same, E less (H 4096); the top-k share moves up a little (the same
# absolute extra over a smaller base).
#   here:   scripts/device/bundle.sh build-dev /work/main/.devbundle-v29
#   device: bash bench/results/2026-12-05-h200-run36/call2.sh
#           carry [".devbundle-v29.txz", ".devbundle-v28.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
# this call's bundle, never a warm machine's earlier one (ignored folders stay between calls)
rm -rf .devbundle .devbundle-v28 && mkdir -p .devbundle && tar xJf .devbundle-v29.txz -C .devbundle
. scripts/device/call_common.sh
L28=$root/.devbundle-v28
mkdir -p "$L28" && tar xJf "$root/.devbundle-v28.txz" -C "$L28"
libpath() { [ "$1" = v28 ] && echo "$L28/lib:$LD_LIBRARY_PATH" || echo "$LD_LIBRARY_PATH"; }
[ -z "${NO_CHECKS:-}" ] && extras_checks
g="$S bench --shape A --N 16K --active 1 --repeats 1 --warmup 0"
for lib in v29 v28; do
  LD_LIBRARY_PATH=$(libpath $lib) step ncu_gen_$lib 120 /usr/local/cuda/bin/ncu --clock-control \
    none --metrics gpu__time_duration.sum,smsp__inst_executed.sum --csv $g --mode general
  LD_LIBRARY_PATH=$(libpath $lib) step ncu_op_$lib 120 /usr/local/cuda/bin/ncu --clock-control \
    none --metrics gpu__time_duration.sum,smsp__inst_executed.sum --csv $g --mode one-pass \
    --topk 64 --sum-p2
done
for round in 1 2; do
  for lib in v29 v28; do
    LD_LIBRARY_PATH=$(libpath $lib) step bench_gen_${lib}_$round 150 $S bench --shape A,D,E \
      --N 16K --active 1 --mask response --mode general --topk 64 --sum-p2 --repeats 10 \
      --json "$R/bench_gen_${lib}_$round.jsonl"
  done
done
for lib in v29 v28; do
  LD_LIBRARY_PATH=$(libpath $lib) step bench_op_$lib 150 $S bench --shape A,D,E --N 16K \
    --active 1 --mask response --mode one-pass --topk 64 --sum-p2 --repeats 10 \
    --json "$R/bench_op_$lib.jsonl"
done
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
[ -z "${NO_CHECKS:-}" ] && extras_report
for lib in v29 v28; do
  echo "== ncu general $lib"; ncu_table "$R/ncu_gen_$lib.log" "4, 1>" "2, 1>" | tail -n 16
  echo "== ncu one-pass $lib"; ncu_table "$R/ncu_op_$lib.log" "10, 1>" topk_merge | tail -n 8
done
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"
  grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -12
done
tar czf "$OUT/call2.tgz" -C "$R" .
