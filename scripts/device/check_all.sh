#!/usr/bin/env bash
# check_all.sh - one device call that checks a tree on the GPU machine: the GPU tests (with
# compute-sanitizer memcheck), the single-GPU NCCL communicator, `spanhead run --device cuda
# --check` on four configurations, the Python binding's GPU tests, and the peers benchmark
# (peers_run.sh). Every step's output and one line per step in steps.txt (name, exit code,
# seconds) land in one tarball, $OUT/check_all.tgz (the device tool returns few files);
# steps.txt and the peers table are also printed. Runs 6, 7, 12 and 14 were taken this way.
#   here:   scripts/device/bundle.sh (stages gpu_nccl_single too) &&
#           bash scripts/device/python_gpu.sh prepare (the wheel in .pywhl) &&
#           make python/spanhead/_spanhead.abi3.so && scripts/device/peers_wheels.sh --no-cute
#   device: bash scripts/device/check_all.sh     carry [".devbundle.txz", ".pywhl", ".whl",
#           "python/spanhead/_spanhead.abi3.so"]   (the bundle is unpacked first when absent)
#   QUICK=1 (fewer test variants), SKIP_PYTHON=1, SKIP_PEERS=1, PEERS_BUDGET=<s> shorten it;
#   without carried wheels the peers step is skipped (said in steps.txt). The steps' limits add
#   up to more than the device tool's 600 s per call (the Python step alone may take 420 s):
#   skip a part, or run it as a call of its own (run_tests.sh, python_gpu.sh, peers_run.sh).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/../.." && pwd)
B=$root/.devbundle
[ -d "$B/bin" ] || { mkdir -p "$B" && tar xJf "$root/.devbundle.txz" -C "$B"; } || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
res=$(mktemp -d)
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export SPANHEAD_LIB=$B/lib/libspanhead.so.0 SPH_COMMIT=$(cat "$B/COMMIT")
step() { # name timeout cmd...: stdout + stderr to $res/name.txt, one line in steps.txt
    local name=$1 to=$2 t0=$(date +%s); shift 2
    timeout "$to" "$@" >"$res/$name.txt" 2>&1
    local rc=$?
    echo "$name rc=$rc ($(($(date +%s) - t0)) s)" | tee -a "$res/steps.txt"
}
# A step whose script tees everything into its own log under $res: keep one copy.
dedup() { cmp -s "$res/$1.txt" "$res/$2" && rm -f "$res/$1.txt"; }
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
dedup nccl nccl_gpu.log
step run_default 60 "$B/bin/spanhead" run --device cuda --check
step run_bf16 60 "$B/bin/spanhead" run --device cuda --dtype bf16 --entropy --softcap 30 \
    --temperature 0.7 --check
step run_onepass 60 "$B/bin/spanhead" run --device cuda --dtype bf16 --one-pass --check
step run_support 60 "$B/bin/spanhead" run --device cuda --dtype bf16 --support 16 --check
if [ -z "${SKIP_PYTHON:-}" ]; then
    OUT=$res step python 420 bash scripts/device/python_gpu.sh  # compile + HF on CUDA: minutes
    dedup python python_gpu.txt
fi
if [ -n "${SKIP_PEERS:-}" ]; then
    echo "peers skipped (SKIP_PEERS)" | tee -a "$res/steps.txt"
elif ! compgen -G ".whl/*.whl" >/dev/null; then
    echo "peers skipped: no wheels in .whl/ (scripts/device/peers_wheels.sh, carry .whl)" |
        tee -a "$res/steps.txt"
else
    OUT=$res step peers 250 bash scripts/device/peers_run.sh
fi
tar czf "$OUT/check_all.tgz" -C "$res" .
cat "$res/steps.txt"
[ -f "$res/peers/peers.md" ] && cat "$res/peers/peers.md"
exit 0
