#!/usr/bin/env bash
# call2.sh - run 33, call 2: call 1's PC sampling found no kernel (the demangled name reads
# "<__nv_bfloat16, (int)2, (bool)1>"). Call 1 measured the fold (v23's epilogue, variant 0)
# slower than v22's count (variant 1): 1.641 G against 1.565 G instructions, 8.2 against 7.9
# ms; the statistics kernel's time follows its instructions (~4 ms per G at A 16K). So this
# call counts where the +448 M instructions over plain go (v22's count, the bundle of call 1):
# per SASS instruction and per CUDA source line, executed instructions and stall samples.
#   device: bash bench/results/2026-12-02-h200-run33/call2.sh
#           carry [".devbundle.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
. scripts/device/call_common.sh
NCU=/usr/local/cuda/bin/ncu
A="$S bench --shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0 --topk 64 --sum-p2"
KN="regex:head_logits_sm90_kernel<__nv_bfloat16, .int.2, .bool.1>"
SPH_TEST_TOPK_VARIANT=1 step ncu_src 300 $NCU --clock-control none --import-source yes \
  --section SourceCounters --section WarpStateStats --section InstructionStats \
  --kernel-name-base demangled --kernel-name "$KN" --launch-count 4 -o "$R/src" -f $A
for id in 0 1 2 3; do
  $NCU -i "$R/src.ncu-rep" --page source --csv --print-source sass --launch-skip $id \
    --launch-count 1 > "$R/sass_$id.csv" 2> "$R/sass_$id.err"
  $NCU -i "$R/src.ncu-rep" --page source --csv --print-source cuda --launch-skip $id \
    --launch-count 1 --source-folders "$root/src/cuda" > "$R/cuda_$id.csv" 2> "$R/cuda_$id.err"
done
$NCU -i "$R/src.ncu-rep" --page details --csv > "$R/details.csv" 2>&1
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
tail -5 "$R/ncu_src.log"
ls -la "$R"
for id in 0 1 2 3; do
  echo "== launch $id"; head -c 400 "$R/sass_$id.err"; head -c 400 "$R/cuda_$id.err"
  head -3 "$R/sass_$id.csv" | cut -c1-400
  python3 scripts/device/ncu_sass_hot.py "$R/sass_$id.csv" --cover 0.5 --top 40 | head -80
done > "$R/hot.txt" 2>&1
head -60 "$R/hot.txt"
grep -i "inst\|duration" "$R/details.csv" | head -20
cp "$R/hot.txt" "$OUT/hot.txt"
gzip -c "$R/src.ncu-rep" > "$OUT/src.ncu-rep.gz" 2>/dev/null
rm -f "$R/src.ncu-rep"
tar czf "$OUT/call2.tgz" -C "$R" .
