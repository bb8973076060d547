#!/usr/bin/env bash
# bench_grid.sh - on the device machine, inside the carried bundle (scripts/device/bundle.sh):
# the benchmark grid and the seed's matrix in one call (runs 13 and 17 were taken this way).
# The grid: shapes A-D, 16K and 64K rows, response / fragmented / packed-RL masks, general and
# one-pass. Then the seed's matrix (packed-RL, general path) once per variant: by default
# as is, under SPH_CUDA_BWD_DENSE=1 (the dense-backward ablation) and under SPH_CUDA_FUSED=0
# (fused kernels off); any other switch of docs/design.md section 5.5 can be a variant.
# Everything lands in one tarball ($OUT/bench_grid.tgz: the device tool returns few files);
# steps.txt inside lists each step's exit code and seconds. Then, here:
#   python3 bench/ab_summary.py matrix_default.jsonl matrix_SPH_CUDA_BWD_DENSE_1.jsonl ...
#   python3 bench/plot_bench.py bench.jsonl plot_16K.png --N 16384 [--peers peers.jsonl]
# Environment: GRID_TIMEOUT (240 s), MATRIX_TIMEOUT (110 s per variant), MATRIX_SHAPES
# (default A,B,C,D; e.g. C,D to finish a matrix cut short), MATRIX_VARIANTS (default
# "default SPH_CUDA_BWD_DENSE=1 SPH_CUDA_FUSED=0"; "default" alone for one matrix), SKIP_GRID=1,
# PROBE=1 (first a test_pingpong sanity run and bench_sm90_epi at shapes A to D: the fused
# kernels against cuBLAS). The device tool's 600 s per command bounds the sum of the timeouts.
#   device: mkdir -p .devbundle && tar xJf .devbundle.txz -C .devbundle &&
#           bash .devbundle/bench_grid.sh     carry [".devbundle.txz"]
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export SPH_COMMIT=$(cat COMMIT 2>/dev/null || echo unknown)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$(mktemp -d)
{
  echo "commit $SPH_COMMIT"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  /usr/local/cuda/bin/nvcc --version | tail -1
} > "$R/machine.txt" 2>&1
if [ -n "${PROBE:-}" ]; then
  SPH_GPU_TESTS=test_pingpong timeout 100 ./bin/gpu_test_head_cuda \
    > "$R/test_pingpong.txt" 2>&1
  echo "test_pingpong rc=$?" >> "$R/steps.txt"
  for s in "2048 62080" "4096 37984" "5120 37984" "2048 151936"; do
    set -- $s
    timeout 60 ./bin/bench_sm90_epi --N 16384 --H "$1" --V "$2" --reps 7 >> "$R/epi.md" 2>&1
  done
  echo "probe rc=$?" >> "$R/steps.txt"
fi
if [ -z "${SKIP_GRID:-}" ]; then
  t0=$(date +%s)
  timeout "${GRID_TIMEOUT:-240}" ./bin/spanhead bench --shape A,B,C,D --N 16K,64K \
    --mask response,fragmented,packed-rl --mode both --json "$R/bench.jsonl" > "$R/bench.md" 2>&1
  echo "grid rc=$? $(( $(date +%s) - t0 )) s" >> "$R/steps.txt"
fi
M="--matrix seed --shape ${MATRIX_SHAPES:-A,B,C,D} --mask packed-rl --mode general --repeats 3 --warmup 1"
for v in ${MATRIX_VARIANTS:-default SPH_CUDA_BWD_DENSE=1 SPH_CUDA_FUSED=0}; do
  t0=$(date +%s)
  n=$(echo "$v" | tr '=' '_')
  if [ "$v" = default ]; then
    timeout "${MATRIX_TIMEOUT:-110}" ./bin/spanhead bench $M --json "$R/matrix_$n.jsonl" \
      > "$R/matrix_$n.md" 2>&1
  else
    env "$v" timeout "${MATRIX_TIMEOUT:-110}" ./bin/spanhead bench $M \
      --json "$R/matrix_$n.jsonl" > "$R/matrix_$n.md" 2>&1
  fi
  echo "matrix $v rc=$? $(( $(date +%s) - t0 )) s" >> "$R/steps.txt"
done
tar czf "$OUT/bench_grid.tgz" -C "$R" .
cat "$R/steps.txt"
