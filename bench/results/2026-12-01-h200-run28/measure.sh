#!/usr/bin/env bash
# measure.sh - run 28, call 1: issue 25's costs and the issue-23 backward change, measured one
# at a time on an idle GPU (the checks run in the next call, check.sh):
#   1. top-k (K = 64) and sum_p2 as extra cost over plain log-probs: `spanhead bench --topk 64`
#      / `--sum-p2` at A and E, 16K rows, dense (each point's plain row, then its extras row);
#   2. per-row temperature against the scalar one: the same bench points with and without
#      --temperature-rows, back to back;
#   3. the fused distillation (dense teacher) against Liger's LigerFusedLinearJSD and torch
#      eager: bench/cuda/distill_bench.py, bf16, H = H_T = 4096, V 128256, N 4096 / 16384;
#   4. the torch path per call at a tiny shape and B 1K (bench/cuda/torch_overhead.py): the
#      one-pass backward's scaling is one sph_scale_inplace launch now.
#   here:   scripts/device/bundle.sh && make python/spanhead/_spanhead.abi3.so
#   device: bash bench/results/2026-12-01-h200-run28/measure.sh
#           carry [".devbundle.txz", "python/spanhead/_spanhead.abi3.so", ".whl"]
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
B=$root/.devbundle
[ -d "$B/bin" ] || { mkdir -p "$B" && tar xJf "$root/.devbundle.txz" -C "$B"; } || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
export SPH_COMMIT=$(cat "$B/COMMIT")
S=$B/bin/spanhead
t0=$(date +%s)
{ echo "commit $SPH_COMMIT"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  /usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1; } > "$OUT/machine.txt" 2>&1
step() { # name timeout cmd...
  local name=$1 to=$2 s=$(date +%s); shift 2
  timeout -s INT -k 10 "$to" "$@" > "$OUT/$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - s )) s (t=$(( $(date +%s) - t0 )))" >> "$OUT/steps.txt"
}
P="--shape A,E --N 16K --active 1 --mask response --mode ${MODE:-general}"
[ -z "${ONLY2:-}" ] && step bench_topk 100 $S bench $P --topk 64 --json "$OUT/bench_topk.jsonl"
[ -z "${ONLY2:-}" ] && step bench_sum_p2 70 $S bench $P --sum-p2 --json "$OUT/bench_sum_p2.jsonl"
[ -z "${ONLY1:-}" ] && step bench_trows_scalar 45 $S bench $P --json "$OUT/bench_trows_scalar.jsonl"
[ -z "${ONLY1:-}" ] && step bench_trows_rows 45 $S bench $P --temperature-rows --json "$OUT/bench_trows_rows.jsonl"
[ -z "${ONLY1:-}" ] && step bench_trows_scalar2 45 $S bench $P --json "$OUT/bench_trows_scalar2.jsonl"
mkdir -p /tmp/lg && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/lg .whl/liger_kernel-*.whl > /dev/null 2>&1
[ -z "${ONLY1:-}" ] && PYTHONPATH=$root/python:/tmp/lg SPANHEAD_LIB=$B/lib/libspanhead.so.0 \
  step distill 150 python3 bench/cuda/distill_bench.py --N 4096 16384 --H 4096 --HT 4096 --V 128256
[ -z "${ONLY1:-}" ] && PYTHONPATH=$root/python SPANHEAD_LIB=$B/lib/libspanhead.so.0 \
  step torch_overhead 50 python3 bench/cuda/torch_overhead.py --points tiny:64:1.0,B:1024:0.25 --iters 30 --out "$OUT/torch_overhead.md"
cat "$OUT/steps.txt"
grep -h "^|" "$OUT/bench_topk.txt" "$OUT/bench_sum_p2.txt" | head -30
for f in bench_trows_scalar bench_trows_rows bench_trows_scalar2; do echo "== $f"; grep -h "^|" "$OUT/$f.txt" | head -8; done
tail -25 "$OUT/distill.txt"
head -22 "$OUT/torch_overhead.md"
