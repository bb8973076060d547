#!/usr/bin/env bash
# final_run.sh - one device call that checks the merged tree on the H200: the GPU tests (with
# compute-sanitizer memcheck), the single-GPU NCCL communicator, `spanhead run --device cuda
# --check` on several configurations, the Python binding's GPU tests, and the peers benchmark.
# Everything lands in one tarball under $OUT (the device tool returns at most 8 files).
#   here:   scripts/device/bundle.sh (stages gpu_nccl_single too) &&
#           make python/spanhead/_spanhead.abi3.so && scripts/device/peers_wheels.sh
#   device: bash scripts/device/final_run.sh     carry [".devbundle.txz", ".whl",
#           "python/spanhead/_spanhead.abi3.so"]   (the bundle is unpacked first when absent)
#   QUICK=1 (fewer test variants), SKIP_PYTHON=1, PEERS_BUDGET=<s> shorten it.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/../.." && pwd)
B=$root/.devbundle
[ -d "$B/bin" ] || { mkdir -p "$B" && tar xJf "$root/.devbundle.txz" -C "$B"; } || exit 1
OUT=${OUT:-/tmp/out}
res=$(mktemp -d)
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export SPANHEAD_LIB=$B/lib/libspanhead.so.0 SPH_COMMIT=$(cat "$B/COMMIT")
step() { # name timeout cmd...
    local name=$1 to=$2 t0=$(date +%s); shift 2
    timeout "$to" "$@" >"$res/$name.txt" 2>&1
    local rc=$?
    echo "$name rc=$rc ($(($(date +%s) - t0)) s)" | tee -a "$res/steps.txt"
}
cd "$root"
# QUICK=1: the default and SPH_CUDA_FUSED=0 test runs, memcheck on the fused-path tests only
if [ -n "${QUICK:-}" ]; then
    OUT=$res/tests QUICK=1 step gpu_tests 300 bash "$B/run_tests.sh"
    SPH_GPU_TESTS=test_fused,test_sweep,test_pingpong step memcheck 100 \
        /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$B/bin/gpu_test_head_cuda"
else
    OUT=$res/tests SANITIZE=1 step gpu_tests 150 bash "$B/run_tests.sh"
fi
OUT=$res step nccl 60 bash "$B/nccl_gpu.sh"
step run_default 60 "$B/bin/spanhead" run --device cuda --check
step run_bf16 60 "$B/bin/spanhead" run --device cuda --dtype bf16 --entropy --softcap 30 \
    --temperature 0.7 --check
step run_onepass 60 "$B/bin/spanhead" run --device cuda --dtype bf16 --one-pass --check
step run_support 60 "$B/bin/spanhead" run --device cuda --dtype bf16 --support 16 --check
[ -z "${SKIP_PYTHON:-}" ] && OUT=$res step python 120 bash scripts/device/python_gpu.sh
if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl; then
    PYTHONPATH=/tmp/site:$root/python step peers 250 python3 bench/cuda/peers.py \
        --budget-s ${PEERS_BUDGET:-200} --out "$res/peers"
fi
tar czf "$OUT/final_run.tgz" -C "$res" .
cat "$res/steps.txt"
[ -f "$res/peers/peers.md" ] && cat "$res/peers/peers.md"
exit 0
