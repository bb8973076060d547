#!/usr/bin/env bash
# policy_check.sh - one device call that checks the fused RL policy loss (issue 14) on the GPU
# machine and measures it:
#   1. gpu_test_policy_cuda (every loss x KL x aggregation on both one-pass paths, awkward
#      masks, determinism) by default, with SPH_CUDA_FUSED=0 and SPH_CUDA_GATHER=0, and under
#      compute-sanitizer memcheck;
#   2. `spanhead run --device cuda --policy-loss ...` on .npy inputs it generates (ppo + k3 +
#      seq-mean-token-mean, gspo, cispo; f32 and bf16) with --check against the float64
#      reference, writing loss.json and the gradients;
#   3. the Python binding on the GPU: python/tests/test_policy_cuda.py (every combination
#      against verl's formulation in torch on top of spanhead.torch.logprobs) and
#      examples/grpo_step.py --device cuda (f32 and bf16);
#   4. `spanhead bench --mode policy` (the fused policy loss next to the one-pass weighted loss
#      and the general path + the loss on the host, same run) at shapes A-D, 16K rows, the
#      response mask at 0.35 active: the record for bench/results.
# Every step's output and one line per step in steps.txt (name, exit code, seconds) land in
# $OUT/policy_check.tgz; steps.txt and the bench table are also printed; PASS/FAIL at the end.
#   here:   scripts/device/bundle.sh && make python/spanhead/_spanhead.abi3.so
#   device: bash scripts/device/policy_check.sh     carry [".devbundle.txz",
#           "python/spanhead/_spanhead.abi3.so"]    (the bundle is unpacked first when absent)
#   SKIP_PYTHON=1, SKIP_BENCH=1, SKIP_MEMCHECK=1 shorten it; BENCH_ARGS replaces the bench
#   arguments (default "--mode policy --shape A,B,C,D --N 16K --mask response --active 0.35").
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
# 1. the GPU test program
step test 200 "$B/bin/gpu_test_policy_cuda"
SPH_CUDA_FUSED=0 step test_nofused 150 "$B/bin/gpu_test_policy_cuda"
SPH_CUDA_GATHER=0 step test_nogather 150 "$B/bin/gpu_test_policy_cuda"
[ -n "${SKIP_MEMCHECK:-}" ] || step memcheck 300 /usr/local/cuda/bin/compute-sanitizer \
    --tool memcheck --error-exitcode 9 "$B/bin/gpu_test_policy_cuda"
# 2. the CLI on generated inputs
PY=${PYTHON:-python3}
gen=$res/inputs
if $PY - "$gen" <<'EOF' >"$res/gen.txt" 2>&1; then
import os, sys
import numpy as np
d = sys.argv[1]
rng = np.random.default_rng(7)
N, H, V = 3000, 256, 5003
for sub, bf16 in (("f32", False), ("bf16", True)):
    p = os.path.join(d, sub); os.makedirs(p, exist_ok=True)
    h = rng.standard_normal((N, H)).astype(np.float32)
    w = (rng.standard_normal((V, H)) * 2.0 / H ** 0.5).astype(np.float32)
    if bf16:  # raw bf16 bits as uint16 (round to nearest even)
        to = lambda x: ((x.view(np.uint32) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) >> 16).astype(np.uint16)
        h, w = to(h), to(w)
    np.save(f"{p}/hidden.npy", h); np.save(f"{p}/weight.npy", w)
    t = rng.integers(0, V, N); t[::11] = -100
    np.save(f"{p}/targets.npy", t.astype(np.int64))
    np.save(f"{p}/mask.npy", (rng.random(N) < 0.7).astype(np.uint8))
    np.save(f"{p}/advantages.npy", rng.standard_normal(N).astype(np.float32))
    np.save(f"{p}/old_logprob.npy", (-8.5 + 0.3 * rng.standard_normal(N)).astype(np.float32))
    np.save(f"{p}/ref_logprob.npy", (-8.5 + 0.3 * rng.standard_normal(N)).astype(np.float32))
    np.save(f"{p}/seq_id.npy", np.repeat(np.arange(N), 40)[:N].astype(np.int64))
print("inputs written")
EOF
    S="$B/bin/spanhead"
    step run_ppo 120 "$S" run --device cuda --inputs "$gen/f32" --outputs "$res/out_ppo" \
        --policy-loss ppo --clip-low 0.2 --clip-high 0.28 --clip-ratio-c 3 --kl k3 \
        --kl-coef 0.01 --entropy-coef 0.001 --agg seq-mean-token-mean --check
    step run_gspo 120 "$S" run --device cuda --inputs "$gen/f32" --outputs "$res/out_gspo" \
        --policy-loss gspo --clip-low 0.0003 --clip-high 0.0004 --kl none --kl-coef 0 \
        --entropy-coef 0 --agg seq-mean-token-mean --check
    step run_cispo_bf16 120 "$S" run --device cuda --dtype bf16 --inputs "$gen/bf16" \
        --outputs "$res/out_cispo" --policy-loss cispo --clip-low 0 --clip-high 4 --kl k1 \
        --kl-coef 0.05 --entropy-coef 0 --agg token-mean --num-tokens 5000 --check
    step run_dapo_bf16 120 "$S" run --device cuda --dtype bf16 --inputs "$gen/bf16" \
        --outputs "$res/out_dapo" --policy-loss ppo --clip-low 0.2 --clip-high 0.28 --kl none \
        --kl-coef 0 --entropy-coef 0 --agg seq-mean-token-sum-norm --norm-length 4096 --check
    cp "$res"/out_*/loss.json "$res/" 2>/dev/null || true
    rm -rf "$gen" "$res"/out_*/*.npy
else
    echo "inputs: numpy missing? (see gen.txt)" | tee -a "$res/steps.txt"
    fail=1
fi
# 3. Python on the GPU
if [ -z "${SKIP_PYTHON:-}" ]; then
    export PYTHONPATH=$root/python
    step pytest_policy_cuda 300 $PY -m pytest -q -x python/tests/test_policy_cuda.py \
        python/tests/test_policy.py
    step grpo_f32 120 $PY examples/grpo_step.py --device cuda
    step grpo_bf16 120 $PY examples/grpo_step.py --device cuda --dtype bfloat16
fi
# 4. the benchmark
if [ -z "${SKIP_BENCH:-}" ]; then
    args=${BENCH_ARGS:-"--mode policy --shape A,B,C,D --N 16K --mask response --active 0.35"}
    step bench 420 "$B/bin/spanhead" bench $args --json "$res/bench_policy.jsonl"
fi
tar czf "$OUT/policy_check.tgz" -C "$res" .
cat "$res/steps.txt"
[ -f "$res/bench.txt" ] && grep -E '^\|' "$res/bench.txt"
if [ $fail -eq 0 ]; then echo "policy_check: PASS"; else echo "policy_check: FAIL"; fi
exit $fail
