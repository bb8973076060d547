#!/usr/bin/env bash
# extras_check.sh - one device call that checks issue 25's extras on the GPU (sum_p2 and the
# top-k of the distribution, src/cuda/head_extras.cu) and measures their cost:
#   1. gpu_test_head_cuda_contract (every CUDA path with the extras against float64) by
#      default and with SPH_CUDA_GATHER=0, gpu_test_head_cuda_tp (their TP merge over 2 and 3
#      ranks in threads), and the contract test under compute-sanitizer memcheck and racecheck
#      (the shared-memory top-k list);
#   2. `spanhead run --device cuda --topk 64 --sum-p2 --check` (bf16 and f32, a random mask,
#      one-pass too), the CLI's comparison with the float64 reference;
#   3. `spanhead bench --topk 64` and `--sum-p2` at shapes A, B, D, 16K rows, dense and the
#      response mask, both modes: each point's plain row, then its extras row with the extra
#      time in % (issue 25's target: < 3 % at K = 64 from 16K rows; notes/cuda-notes.md has
#      the prediction for this staged version).
# Every step's output and one line per step in steps.txt land in $OUT/extras_check.tgz;
# steps.txt and the bench tables are printed; PASS/FAIL at the end.
#   here:   scripts/device/bundle.sh
#   device: bash scripts/device/extras_check.sh     carry [".devbundle.txz"]
#   SKIP_BENCH=1, SKIP_SANITIZE=1 shorten it; BENCH_ARGS replaces the bench arguments.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
root=$(cd "$(dirname "$0")/../.." && pwd)
B=$root/.devbundle
[ -d "$B/bin" ] || { mkdir -p "$B" && tar xJf "$root/.devbundle.txz" -C "$B"; } || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
res=$(mktemp -d)
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export SPH_COMMIT=$(cat "$B/COMMIT" 2>/dev/null || echo ?)
fail=0
step() { # name timeout cmd...: stdout + stderr to $res/name.txt, one line in steps.txt
    local name=$1 to=$2 t0=$(date +%s); shift 2
    timeout "$to" "$@" >"$res/$name.txt" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || fail=1
    echo "$name rc=$rc ($(($(date +%s) - t0)) s)" | tee -a "$res/steps.txt"
}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "commit $SPH_COMMIT"; } \
    >"$res/machine.txt" 2>&1
S=$B/bin/spanhead
step contract 200 "$B/bin/gpu_test_head_cuda_contract"
SPH_CUDA_GATHER=0 step contract_nogather 150 "$B/bin/gpu_test_head_cuda_contract"
step tp 200 "$B/bin/gpu_test_head_cuda_tp"
if [ -z "${SKIP_SANITIZE:-}" ]; then
    step memcheck 300 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$B/bin/gpu_test_head_cuda_contract"
    step racecheck 300 /usr/local/cuda/bin/compute-sanitizer --tool racecheck --error-exitcode 9 \
        "$B/bin/gpu_test_head_cuda_contract"
fi
step run_bf16 120 "$S" run --device cuda --N 4096 --H 1024 --V 32003 --dtype bf16 \
    --mask random --active 0.6 --temperature 0.7 --topk 64 --sum-p2 --check
step run_f32_onepass 120 "$S" run --device cuda --N 2048 --H 512 --V 20011 --dtype f32 \
    --one-pass --topk 256 --sum-p2 --softcap 20 --check
if [ -z "${SKIP_BENCH:-}" ]; then
    args=${BENCH_ARGS:---shape A,B,D --N 16K --active 1,0.5 --mask response --mode both}
    # shellcheck disable=SC2086
    step bench_topk 280 "$S" bench $args --topk 64 --json "$res/bench_topk.jsonl"
    # shellcheck disable=SC2086
    step bench_sum_p2 200 "$S" bench $args --sum-p2 --json "$res/bench_sum_p2.jsonl"
    grep -h '^|' "$res/bench_topk.txt" "$res/bench_sum_p2.txt" 2>/dev/null
fi
cp "$res/machine.txt" "$OUT/" 2>/dev/null
tar czf "$OUT/extras_check.tgz" -C "$res" .
cat "$res/steps.txt"
[ $fail -eq 0 ] && echo PASS || echo FAIL
exit $fail
