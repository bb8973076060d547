#!/usr/bin/env bash
# run_extra.sh - on the device machine, after run_tests.sh: extra same-run points for the
# notes (fragmented masks with exact spans vs coalesced spans; racecheck on the
# batch-invariant kernel). Output under $OUT.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export SPH_COMMIT=$(cat COMMIT 2>/dev/null || echo unknown)
J="$OUT/bench_extra.jsonl"
b() { echo "### $*"; timeout 150 ./bin/spanhead bench "$@" --json "$J" --repeats 5 --warmup 1 | grep -v '^#' ; }
{
  echo "## racecheck, batch-invariant parity (mma.sync kernel)"
  SPH_GPU_TESTS=test_bi_parity timeout 200 compute-sanitizer --tool racecheck bin/gpu_test_head_cuda 2>&1 \
    | grep -E "Race reported|RACECHECK SUMMARY|PASSED|FAILED" | sed 's/+0x[0-9a-f]*//g' | sort | uniq -c
  echo "## fragmented masks: exact spans (gap 0) vs coalesced (gap 128)"
  b --shape A,B --N 64K --active 0.5,0.25 --mask fragmented --mode both --gap 0
  b --shape A --N 64K --active 0.5,0.25 --mask fragmented --mode general --gap 128
} 2>&1 | tee "$OUT/bench_extra.md"
