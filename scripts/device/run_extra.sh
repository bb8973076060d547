#!/usr/bin/env bash
# run_extra.sh - on the device machine, after run_tests.sh: extra same-run points for the
# notes: shape D, and the backward's square chunks against whole-shard rows
# (SPH_CUDA_SQUARE=0) on A 64K and D 16K. Output under $OUT.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export SPH_COMMIT=$(cat COMMIT 2>/dev/null || echo unknown)
J="$OUT/bench_extra.jsonl"
b() { echo "### $*"; timeout 150 ./bin/spanhead bench "$@" --json "$J" --repeats 5 --warmup 1 | grep -v '^#' ; }
{
  echo "## shape D (V_loc 151936)"
  b --shape D --N 16K --active 1,0.5,0.25 --mode general
  echo "## fragmented mask, exact spans"
  b --shape A,B --N 64K --active 0.25 --mask fragmented --mode general
  echo "## A/B: SPH_CUDA_SQUARE=0 (backward chunks of whole-shard rows)"
  SPH_CUDA_SQUARE=0 b --shape A --N 64K --active 1 --mode general
  SPH_CUDA_SQUARE=0 b --shape D --N 16K --active 1 --mode general
} 2>&1 | tee "$OUT/bench_extra.md"
