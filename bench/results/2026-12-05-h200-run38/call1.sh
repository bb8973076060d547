#!/usr/bin/env bash
# call1.sh - run 38: the bundle of the dense teacher's per-row temperature
# (sph_distill_args.teacher_temperature_rows), the distillation's device-pointer checks, and
# test_no_active_acc's fixed grid, on one GPU, in one call (~4 min):
#   - gpu_test_distill_cuda (the teacher's per-row temperatures in the cases, TP and CP in
#     threads; a bad value counted as non-finite; host pointers refused) and its memcheck;
#   - gpu_test_head_cuda (ping-pong and cooperative, without test_huge): test_no_active_acc;
#   - the GPU pytest of the distillation (test_distill_cuda.py, test_distill.py);
#   - the teacher's per-row temperature against the scalar: `spanhead run --distill jsd` on a
#     dense teacher (N 4096, H = H_T = 1024, V 32000, f32 inputs on the CUDA path) with
#     --teacher-temperature 1.25 and with teacher_temperature.npy of 1.25 everywhere, the
#     median of 20 calls each, alternated three times;
#   - the default's extras share (top-k 64 + sum_p2) at A, D, E 16K, both modes, 20 repetitions.
# Predictions: every test passes; the per-row call within 1 % of the scalar one (one load per
# row in k_stats against a kernel parameter; the call is its GEMMs); the shares
# within run 36 / 37's spread: general A ~+3.5, D ~+3, E ~+2 %, one-pass A ~+2, E ~+1.5 %.
#   device: bash bench/results/2026-12-05-h200-run38/call1.sh
#           carry [".devbundle-v31.txz", "python/spanhead/_spanhead.abi3.so"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
rm -rf .devbundle && mkdir -p .devbundle && tar xJf .devbundle-v31.txz -C .devbundle
LIMIT=240
. scripts/device/call_common.sh
# the logs stay in $R and travel as one archive (the device tool returns 8 files a call)
trap 'tar czf "$OUT/call1.tgz" -C "$R" .' EXIT
step gpu_test_distill_cuda 120 "$B/bin/gpu_test_distill_cuda" &
step memcheck_distill 240 /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
  --error-exitcode 9 "$B/bin/gpu_test_distill_cuda" &
SPH_GPU_TESTS=-test_huge step gpu_test_head_cuda 240 "$B/bin/gpu_test_head_cuda" &
SPH_CUDA_PINGPONG=0 SPH_GPU_TESTS=-test_huge step gpu_test_head_cuda_cooperative 240 \
  "$B/bin/gpu_test_head_cuda" &
SPANHEAD_LIB=$B/lib/libspanhead.so.0 PYTHONPATH=$root/python SPANHEAD_CLI=$S \
  step pytest_distill 240 python3 -m pytest -q -rs -p no:cacheprovider --tb=short \
  python/tests/test_distill_cuda.py python/tests/test_distill.py &
wait
# the per-row teacher temperature against the scalar (after the tests: the GPU to itself)
d=$(mktemp -d)
python3 - "$d" <<'PY'
import sys, numpy as np
d = sys.argv[1]; r = np.random.default_rng(7)
N, H, V = 4096, 1024, 32000
np.save(f"{d}/hidden.npy", r.standard_normal((N, H), dtype=np.float32))
np.save(f"{d}/weight.npy", (r.standard_normal((V, H), dtype=np.float32) / 32))
np.save(f"{d}/teacher_hidden.npy", r.standard_normal((N, H), dtype=np.float32))
np.save(f"{d}/teacher_weight.npy", (r.standard_normal((V, H), dtype=np.float32) / 32))
PY
mkdir -p "$d/rows" && ln -s "$d"/*.npy "$d/rows/"
python3 -c "import numpy as np; np.save('$d/rows/teacher_temperature.npy', np.full(4096, 1.25, np.float32))"
for k in 1 2 3; do
  step tt_scalar_$k 100 $S run --distill jsd --device cuda --teacher-temperature 1.25 \
    --inputs "$d" --repeats 20 --json
  step tt_rows_$k 100 $S run --distill jsd --device cuda --inputs "$d/rows" --repeats 20 --json
done
# the default's extras share at 20 repetitions (run 37's 6 moved 2-4 points between rows of
# the same code): top-k 64 + sum_p2 over plain log-probs, interleaved, A, D, E 16K
for m in general one-pass; do
  step bench_$m 150 $S bench --shape A,D,E --N 16K --active 1 --mask response --mode $m \
    --topk 64 --sum-p2 --repeats 20 --json "$R/bench_$m.jsonl"
done
cat "$R/machine.txt"; sort -k2 "$R/steps.txt"
for f in "$R"/gpu_test_*.log; do
  grep -q "FAILED\|status [1-9]" "$f" && { echo "== $(basename "$f")"; grep -m8 -iE "fail|status" "$f"; }
  echo "== $(basename "$f"): $(grep -E "PASSED|FAILED" "$f" | tail -2 | tr '\n' ' ')"
done
grep -h "ERROR SUMMARY" "$R/memcheck_distill.log"
tail -4 "$R/pytest_distill.log"
for f in "$R"/tt_*.log; do
  echo "$(basename "$f" .log) $(python3 -c "import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(d['ms'], d['loss'])" "$f" 2>&1 | tail -1)"
done
for f in "$R"/bench_*.log; do
  echo "== $(basename "$f")"
  grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -12
done
