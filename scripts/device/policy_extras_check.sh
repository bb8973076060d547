#!/usr/bin/env bash
# policy_extras_check.sh - one device call that checks issue 25's extras through the policy
# loss and sum_p2 with candidates on the GPU, and measures the extras' cost in the policy call:
#   1. gpu_test_policy_cuda (test_extras among its cases: top-k and sum_p2 of the loss's rows on
#      the +extras paths against float64), gpu_test_head_cuda_contract (test_sum_p2_support:
#      sum_p2 over the candidates), gpu_test_head_cuda_tp (support cases with sum_p2 over 2 and
#      3 ranks in threads), and the contract test under compute-sanitizer memcheck;
#   2. `spanhead run --device cuda --policy-loss ... --topk 64 --sum-p2 --check` (ppo f32,
#      gspo bf16) on generated inputs, the CLI's comparison with the float64 reference;
#   3. the Python binding on the GPU: test_policy_cuda.py and test_policy_extras.py -k extras,
#      test_contract.py -k cuda (sum_p2 with candidates on CUDA);
#   4. `spanhead bench --mode policy --topk 64 --sum-p2` at shapes A, B, D, 16K rows (dense
#      and the response mask at 0.5): each point's policy row, then the same call with the
#      extras and its extra time in % (docs/policy.md, "The head's extras").
# Every step's output and one line per step in steps.txt land in $OUT/policy_extras.tgz;
# steps.txt and the bench table are printed; PASS/FAIL at the end.
#   here:   scripts/device/bundle.sh && make python/spanhead/_spanhead.abi3.so
#   device: bash scripts/device/policy_extras_check.sh   carry [".devbundle.txz",
#           "python/spanhead/_spanhead.abi3.so"]
#   SKIP_PYTHON=1, SKIP_BENCH=1, SKIP_MEMCHECK=1 shorten it; BENCH_ARGS replaces the bench
#   arguments (default "--shape A,B,D --N 16K --active 1,0.5 --mask response").
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/../.." && pwd)
B=$root/.devbundle
[ -d "$B/bin" ] || { mkdir -p "$B" && tar xJf "$root/.devbundle.txz" -C "$B"; } || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
res=$(mktemp -d)
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export SPANHEAD_LIB=$B/lib/libspanhead.so.0 SPH_COMMIT=$(cat "$B/COMMIT" 2>/dev/null || echo ?)
fail=0
step() { # name timeout cmd...: stdout + stderr to $res/name.txt, one line in steps.txt
    local name=$1 to=$2 t0=$(date +%s); shift 2
    timeout "$to" "$@" >"$res/$name.txt" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || fail=1
    echo "$name rc=$rc ($(($(date +%s) - t0)) s)" | tee -a "$res/steps.txt"
}
cd "$root"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "commit $SPH_COMMIT"; } \
    >"$res/machine.txt" 2>&1
S=$B/bin/spanhead
# 1. the GPU test programs
step test_policy 300 "$B/bin/gpu_test_policy_cuda"
step contract 200 "$B/bin/gpu_test_head_cuda_contract"
step tp 200 "$B/bin/gpu_test_head_cuda_tp"
[ -n "${SKIP_MEMCHECK:-}" ] || step memcheck 300 /usr/local/cuda/bin/compute-sanitizer \
    --tool memcheck --error-exitcode 9 "$B/bin/gpu_test_head_cuda_contract"
# 2. the CLI on generated inputs (the oracle of tests/cli/test_policy.sh's generator)
PY=${PYTHON:-python3}
gen=$res/inputs
if $PY tests/cli/policy_oracle.py gen "$gen/f32" 11 >"$res/gen.txt" 2>&1 &&
    $PY tests/cli/policy_oracle.py gen "$gen/bf16" 12 --bf16 >>"$res/gen.txt" 2>&1; then
    step run_ppo_extras 120 "$S" run --device cuda --inputs "$gen/f32" --outputs "$res/out_ppo" \
        --policy-loss ppo --clip-low 0.2 --clip-high 0.28 --kl k3 --kl-coef 0.01 \
        --entropy-coef 0.001 --agg seq-mean-token-mean --topk 64 --sum-p2 --check
    step run_gspo_extras_bf16 120 "$S" run --device cuda --dtype bf16 --inputs "$gen/bf16" \
        --outputs "$res/out_gspo" --policy-loss gspo --clip-low 0.0003 --clip-high 0.0004 \
        --agg seq-mean-token-mean --topk 97 --sum-p2 --check
    rm -rf "$gen" "$res"/out_*/*.npy
else
    echo "inputs: numpy missing? (see gen.txt)" | tee -a "$res/steps.txt"
    fail=1
fi
# 3. Python on the GPU
if [ -z "${SKIP_PYTHON:-}" ]; then
    export PYTHONPATH=$root/python
    step pytest_extras 300 $PY -m pytest -q -k extras python/tests/test_policy_cuda.py \
        python/tests/test_policy_extras.py
    step pytest_contract 200 $PY -m pytest -q -k cuda python/tests/test_contract.py
fi
# 4. the benchmark
if [ -z "${SKIP_BENCH:-}" ]; then
    args=${BENCH_ARGS:-"--shape A,B,D --N 16K --active 1,0.5 --mask response"}
    # shellcheck disable=SC2086
    step bench 420 "$S" bench --device cuda --mode policy $args --topk 64 --sum-p2 \
        --json "$res/bench_policy_extras.jsonl"
fi
tar czf "$OUT/policy_extras.tgz" -C "$res" .
cat "$res/steps.txt"
[ -f "$res/bench.txt" ] && grep -E '^\|' "$res/bench.txt"
if [ $fail -eq 0 ]; then echo "policy_extras_check: PASS"; else echo "policy_extras_check: FAIL"; fi
exit $fail
