#!/usr/bin/env bash
# run_extra.sh - on the device machine, after run_tests.sh: same-run A/B points for the notes.
#   tune B at 16K into a fresh cache, then B 16K dense with and without that cache;
#   A 64K dense with chunk_bytes 1 GiB vs 2 GiB; fragmented masks; shapes C and D at 16K.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export SPH_COMMIT=$(cat COMMIT 2>/dev/null || echo unknown)
J="$OUT/bench_extra.jsonl"
b() { echo "### $*"; timeout 120 ./bin/spanhead bench "$@" --json "$J" --repeats 5 --warmup 1 | grep -v '^#' ; }
{
  echo "## tune"
  timeout 120 ./bin/spanhead tune --H 4096 --V 37984 --N 16K --repeats 3 --cache "$OUT/tune.json"
  echo "## B 16K: default layout, then with the tuned cache"
  SPH_TUNE_CACHE=/nonexistent b --shape B --N 16K --active 1 --mode general
  SPH_TUNE_CACHE="$OUT/tune.json" b --shape B --N 16K --active 1 --mode general
  echo "## A 64K dense: chunk_bytes 1 GiB vs 2 GiB"
  b --shape A --N 64K --active 1 --mode both --chunk-bytes 1073741824
  b --shape A --N 64K --active 1 --mode both --chunk-bytes 2147483648
  echo "## fragmented masks (runs of 16 active rows)"
  b --shape A,B --N 64K --active 0.5,0.25 --mask fragmented --mode general
  echo "## shapes C and D"
  b --shape C,D --N 16K --active 1,0.5,0.25 --mode both
} 2>&1 | tee "$OUT/bench_extra.md"
