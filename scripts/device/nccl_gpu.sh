#!/usr/bin/env bash
# nccl_gpu.sh - the NCCL communicator on the lent single-GPU H200 machine (issue 4/8).
#
# Run from the repository root on the device machine, e.g. through the device tool:
#     bash scripts/device/nccl_gpu.sh
# It builds spanhead with CUDA + NCCL (MPI when the machine has it), then
#   1. gpu_nccl_single: sph_comm_create_nccl over an ncclComm_t from ncclCommInitAll (the
#      config agreement over NCCL itself, a mismatch rejected, the caller's comm left alive)
#      and, with MPI, sph_comm_create_nccl_mpi; device-buffer allgather (in and out of place)
#      and f32 all-reduce on a stream;
#   2. with mpirun: `spanhead run --device cuda` with one rank (TP=CP=DP=1, NCCL comm over the
#      GPU) against the CPU float64 reference, masked and dense, bf16 and f32, sample support;
#   3. with mpirun: the CPU MPI tests (ctest -L mpi) as a cross-check of the same build.
# Logs go to $OUT (when set) as nccl_gpu.log. Exit status: 0 when every step that could run
# passed; steps that cannot run here (no mpirun) are reported as skipped.
#
# NVLink multicast stays off: a program that uses it can take the host's shared GPUs out of
# service (see the device README), so NCCL_NVLS_ENABLE=0 is exported before anything runs.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none
build=${BUILD:-build-device}
log=${OUT:-/tmp}/nccl_gpu.log
: >"$log"
say() { echo "$*" | tee -a "$log"; }
fails=0

say "# nccl_gpu.sh $(date -u '+%Y-%m-%d %H:%M UTC') git $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo +dirty)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$log"
grep -h '#define NCCL_\(MAJOR\|MINOR\|PATCH\)' /usr/local/cuda/include/nccl.h 2>/dev/null | tee -a "$log"

have_mpi=OFF
command -v mpirun >/dev/null 2>&1 && have_mpi=ON
say "mpirun: $have_mpi"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSPH_CUDA=ON -DSPH_NCCL=ON \
    -DSPH_MPI=$have_mpi -DSPH_BUILD_BENCH=OFF ${CMAKE_ARGS:-} 2>&1 | tail -3 | tee -a "$log"
if ! cmake --build "$build" -j "$(nproc)" 2>&1 | tail -5 | tee -a "$log" ||
   [ ! -x "$build/tests/mpi/gpu_nccl_single" ]; then
    say "FAIL: build"
    exit 1
fi
grep -q 'SPH_HAVE_NCCL' "$build/CMakeFiles/spanhead_obj.dir/flags.make" 2>/dev/null &&
    say "build: NCCL on" || say "build: NCCL OFF (nccl.h or libnccl not found)"

say "## 1. gpu_nccl_single"
"$build/tests/mpi/gpu_nccl_single" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || fails=$((fails + 1))

if [ "$have_mpi" = ON ]; then
    say "## 2. spanhead run --device cuda, one rank, NCCL communicator"
    for args in "" "--mask dense" "--dtype bf16 --temperature 0.7" "--support 9" \
                "--seqs 12 --min-len 50 --max-len 150 --hidden 128 --vocab 4099 --dtype bf16" \
                "--no-check --bench 10 --seqs 32 --min-len 256 --max-len 2048 --hidden 2048 --vocab 32000 --dtype bf16"; do
        say "### run --device cuda $args"
        mpirun -np 1 "$build/spanhead" run --tp 1 --device cuda $args 2>&1 | tee -a "$log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || fails=$((fails + 1))
    done
    say "## 3. ctest -L mpi (CPU)"
    (cd "$build" && ctest -L mpi --output-on-failure 2>&1) | tail -15 | tee -a "$log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || fails=$((fails + 1))
else
    say "## 2-3. skipped: no mpirun on this machine (sph_comm_create_nccl_mpi and the"
    say "##      distributed runner need MPI; step 1 covered sph_comm_create_nccl)"
fi
say "nccl_gpu.sh: $([ $fails -eq 0 ] && echo PASS || echo "FAIL ($fails steps)")"
exit $((fails > 0))
