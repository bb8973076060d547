#!/usr/bin/env bash
# nccl_gpu.sh - the NCCL communicator on the lent single-GPU H200 (issues 4 and 8).
#
# The device image has CUDA, cuBLAS and NCCL but not cmocka, cJSON or Open MPI, so (as with
# scripts/device/bundle.sh) binaries are built here and carried. Three modes:
#
#   here, after scripts/device/bundle.sh [build-dir] [bundle-dir]:
#       scripts/device/nccl_gpu.sh stage [build-dir] [bundle-dir]
#     builds tests/mpi/gpu_nccl_single in the bundle's build (same flags: CUDA + NCCL, no MPI)
#     and copies it, any library it needs that the bundle lacks, and this script into the
#     bundle (defaults: build-dev, /work/main/.devbundle).
#   on the device, from the carried bundle (device tool: carry .devbundle.txz, unpacked into
#   .devbundle first; bundle.sh stages this itself):
#       bash .devbundle/nccl_gpu.sh
#     1. gpu_nccl_single: sph_comm_create_nccl over an ncclComm_t from ncclCommInitAll on
#        GPU 0 (the config agreement over NCCL itself; tp = 2 on a 1-rank group and a short
#        shard rejected with SPH_ERR_MISMATCH; the caller's comm alive after destroy), a
#        device-buffer allgather (out of place and in place) and an f32 all-reduce on a stream;
#     2. when the bundle's spanhead was built with MPI and mpirun exists: spanhead run
#        --device cuda with one rank (NCCL communicator over MPI) against the CPU reference.
#   on a machine that can build everything (all dependencies and, ideally, Open MPI):
#       scripts/device/nccl_gpu.sh build
#     builds with CUDA + NCCL (+ MPI when mpirun exists) into build-device and runs the same
#     steps plus the CPU MPI tests (ctest -L mpi).
#
# Logs go to $OUT/nccl_gpu.log when OUT is set. Exit status 0 when every step that could run
# passed; steps that cannot run there are reported as skipped.
#
# NVLink multicast stays off: a program that uses it can take the host's shared GPUs out of
# service (see the device README), so NCCL_NVLS_ENABLE=0 is exported before anything runs.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none
here=$(cd "$(dirname "$0")" && pwd)
mode=${1:-run}

if [ "$mode" = stage ]; then
    set -e
    root=$(cd "$here/../.." && pwd)
    build=${2:-$root/build-dev}
    out=${3:-/work/main/.devbundle}
    [ -d "$out/bin" ] || { echo "nccl_gpu.sh stage: run scripts/device/bundle.sh first ($out/bin missing)"; exit 1; }
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSPH_MPI=OFF -DSPH_WERROR=ON >/dev/null
    cmake --build "$build" -j2 --target gpu_nccl_single
    grep -q 'SPH_HAVE_NCCL' "$build/CMakeFiles/spanhead_obj.dir/flags.make" ||
        { echo "nccl_gpu.sh stage: this build has no NCCL (nccl.h/libnccl not found)"; exit 1; }
    cp "$build/tests/mpi/gpu_nccl_single" "$out/bin/"
    ldd "$out/bin/gpu_nccl_single" | awk '/=>/ {print $3}' |
        grep -Ev 'cuda|cublas|nccl|libc\.so|libm\.so|libdl|libpthread|librt|ld-linux|libstdc|libgcc_s' |
        while read -r lib; do [ -e "$out/lib/$(basename "$lib")" ] || cp -L "$lib" "$out/lib/"; done ||
        true
    cp "$here/nccl_gpu.sh" "$out/"
    echo "staged gpu_nccl_single and nccl_gpu.sh into $out"
    exit 0
fi

log=${OUT:-/tmp}/nccl_gpu.log
mkdir -p "$(dirname "$log")"
: >"$log"
say() { echo "$*" | tee -a "$log"; }
fails=0
step() { # name cmd...: runs, logs, counts a failure (77 = skipped)
    local name=$1; shift
    say "## $name"
    "$@" 2>&1 | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 77 ]; then say "$name: skipped"
    elif [ "$rc" -ne 0 ]; then say "$name: FAIL (rc $rc)"; fails=$((fails + 1))
    else say "$name: ok"; fi
}

if [ "$mode" = build ]; then
    root=$(cd "$here/../.." && pwd)
    build=${BUILD:-$root/build-device}
    have_mpi=OFF
    command -v mpirun >/dev/null 2>&1 && have_mpi=ON
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSPH_CUDA=ON -DSPH_NCCL=ON \
        -DSPH_MPI=$have_mpi -DSPH_BUILD_BENCH=OFF ${CMAKE_ARGS:-} 2>&1 | tail -3 | tee -a "$log"
    cmake --build "$build" -j "$(nproc)" 2>&1 | tail -3 | tee -a "$log"
    bin=$build/tests/mpi/gpu_nccl_single
    cli=$build/spanhead
else
    export LD_LIBRARY_PATH=$here/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    bin=$here/bin/gpu_nccl_single
    cli=$here/bin/spanhead
fi

say "# nccl_gpu.sh ($mode) $(date -u '+%Y-%m-%d %H:%M UTC'), bundle commit $(cat "$here/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$log"
[ -x "$bin" ] || { say "FAIL: $bin is missing (stage it: scripts/device/nccl_gpu.sh stage)"; exit 1; }
ldd "$bin" | grep -i "not found" | tee -a "$log"

step "1. gpu_nccl_single (sph_comm_create_nccl on one GPU)" "$bin"

if command -v mpirun >/dev/null 2>&1 && [ -x "$cli" ] && ldd "$cli" | grep -q libmpi; then
    for args in "" "--mask dense" "--dtype bf16 --temperature 0.7" "--support 9" \
                "--seqs 12 --min-len 50 --max-len 150 --hidden 128 --vocab 4099 --dtype bf16" \
                "--reference device --bench 10 --seqs 32 --min-len 256 --max-len 2048 --hidden 2048 --vocab 32000 --dtype bf16"; do
        step "2. spanhead run --device cuda --tp 1 $args" mpirun -np 1 "$cli" run --tp 1 \
            --device cuda $args
    done
    if [ "$mode" = build ]; then
        step "3. ctest -L mpi (CPU)" bash -c "cd '$build' && ctest -L mpi --output-on-failure"
    fi
else
    say "## 2. skipped: no mpirun here or spanhead built without MPI (the distributed runner"
    say "##    and sph_comm_create_nccl_mpi need MPI; step 1 covered sph_comm_create_nccl)"
fi
say "nccl_gpu.sh: $([ $fails -eq 0 ] && echo PASS || echo "FAIL ($fails steps)")"
exit $((fails > 0))
