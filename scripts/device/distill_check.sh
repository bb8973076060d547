#!/usr/bin/env bash
# distill_check.sh - one device call that checks the fused distillation loss's CUDA paths of
# issue 25's gaps (the global mean under CP / num_tokens, the distributed CLI over NCCL):
#   1. gpu_test_distill_cuda (every kind, dense / sparse, masks and spans, num_tokens on some
#      cases, TP 2-3 and CP 2-3 ranks in threads on one GPU over a device-buffer communicator)
#      by default and under compute-sanitizer memcheck; with >= 2 GPUs gpu_distill_nccl (real
#      NCCL communicators from ncclCommInitAll, one rank thread per GPU, no MPI: TP 2 and
#      CP 2; TP 2 x CP 2 with 4 GPUs) against the float64 reference;
#   2. `spanhead run --device cuda --distill ... --check` on generated inputs (f32 dense, bf16
#      sparse, --num-tokens), outputs checked by the NumPy float64 oracle
#      (tests/cli/distill_oracle.py);
#   3. with an MPI build of the CLI and mpirun (the device image has no Open MPI: carry one,
#      or skip): `mpirun -np 2 spanhead run --tp 2 --distill ... --device cuda --check` and
#      `--cp 2`, and with 4 GPUs `--tp 2 --cp 2`: NCCL communicators, one GPU per rank. NCCL
#      refuses two ranks of one communicator on one GPU, so this step needs >= 2 GPUs
#      (nvidia-h200-x2; 4 for the tp x cp case) and is skipped, said so, on fewer.
# Every step's output and one line per step (name, exit code, seconds) land in
# $OUT/distill_check.tgz; steps.txt is printed; PASS/FAIL at the end.
#   here:   scripts/device/bundle.sh
#   device: bash scripts/device/distill_check.sh           carry [".devbundle.txz"]
#   step 3: SPANHEAD_MPI=<a CLI built with CUDA + NCCL + MPI> MPIRUN=<mpirun> (defaults:
#           build/spanhead if it exists, mpirun on PATH)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none
root=$(cd "$(dirname "$0")/../.." && pwd)
B=$root/.devbundle
[ -d "$B/bin" ] || { mkdir -p "$B" && tar xJf "$root/.devbundle.txz" -C "$B"; } || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
res=$(mktemp -d)
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
S=$B/bin/spanhead
PY=${PYTHON:-python3}
ORACLE=$root/tests/cli/distill_oracle.py
fail=0
step() { # name timeout cmd...: stdout + stderr to $res/name.txt, one line in steps.txt
    local name=$1 to=$2 t0=$(date +%s); shift 2
    timeout "$to" "$@" >"$res/$name.txt" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || fail=1
    echo "$name rc=$rc ($(($(date +%s) - t0)) s)" | tee -a "$res/steps.txt"
}
skip() { echo "$1 skipped: $2" | tee -a "$res/steps.txt"; }
cd "$root"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat "$B/COMMIT" 2>/dev/null; } \
    >"$res/machine.txt" 2>&1
ngpu=${NGPU:-$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")}  # NGPU: a dry run's count
echo "gpus $ngpu" >>"$res/machine.txt"
# 1. the GPU test program
step test 300 "$B/bin/gpu_test_distill_cuda"
[ -n "${SKIP_MEMCHECK:-}" ] || step memcheck 400 /usr/local/cuda/bin/compute-sanitizer \
    --tool memcheck --error-exitcode 9 "$B/bin/gpu_test_distill_cuda"
# 1b. real NCCL communicators, 2 (4) GPUs of one process, no MPI: TP 2, CP 2 (TP 2 x CP 2)
if [ ! -x "$B/bin/gpu_distill_nccl" ]; then
    skip nccl "the bundle has no gpu_distill_nccl (a build without NCCL?)"
elif [ "$ngpu" -lt 2 ]; then
    skip nccl "$ngpu GPU(s): NCCL needs one GPU per rank (ask for nvidia-h200-x2 or -x4)"
else
    step nccl 300 "$B/bin/gpu_distill_nccl"
fi
# 2. inputs, then the one-process CLI on the GPU
gen=$res/inputs
mkdir -p "$gen/dense" "$gen/sparse16"
"$PY" "$ORACLE" gen "$gen/dense" 11 dense >"$res/gen.txt" 2>&1 &&
    "$PY" "$ORACLE" gen "$gen/sparse16" 12 sparse --bf16 >>"$res/gen.txt" 2>&1 || fail=1
export PY ORACLE
one() { # name in kind beta red nt [cli options...]
    local name=$1 in=$2 kind=$3 beta=$4 red=$5 nt=$6; shift 6
    export IN=$in OD=$res/o_$name K=$kind BE=$beta RD=$red NT=$nt
    step "$name" 240 bash -c '"$@" && "$PY" "$ORACLE" check "$IN" "$OD" "$K" "$BE" "$RD" 0 "$NT"' \
        _ "$@" --distill "$kind" --beta "$beta" --reduction "$red" --inputs "$in" \
            --outputs "$res/o_$name" --check
}
one cli_f32_dense "$gen/dense" jsd 0.3 mean 0 "$S" run --device cuda
one cli_f32_dense_nt "$gen/dense" forward-kl 0.5 mean 57 "$S" run --device cuda --num-tokens 57
# bf16 on the GPU: --check's own budget is 2e-2; the oracle's 1e-4 applies to f32 only, so
# the bf16 run is judged by --check alone
step cli_bf16_sparse 240 "$S" run --device cuda --dtype bf16 --distill reverse-kl \
    --inputs "$gen/sparse16" --check
# 3. the distributed CLI over NCCL
SM=${SPANHEAD_MPI:-$root/build/spanhead}
MR=${MPIRUN:-$(command -v mpirun || true)}
if [ -z "$MR" ] || [ ! -x "$SM" ]; then
    skip mpi "no mpirun ($MR) or no MPI build of the CLI ($SM): set MPIRUN and SPANHEAD_MPI"
elif [ "$ngpu" -lt 2 ]; then
    skip mpi "$ngpu GPU(s): NCCL needs one GPU per rank (ask for nvidia-h200-x2)"
else
    one mpi_tp2 "$gen/dense" jsd 0.3 mean 0 "$MR" -np 2 "$SM" run --tp 2 --device cuda
    one mpi_cp2 "$gen/dense" forward-kl 0.5 mean 0 "$MR" -np 2 "$SM" run --cp 2 --device cuda
    one mpi_cp2_none "$gen/dense" reverse-kl 0.5 none 0 "$MR" -np 2 "$SM" run --cp 2 --device cuda
    step mpi_tp2_bf16 240 "$MR" -np 2 "$SM" run --tp 2 --device cuda --dtype bf16 \
        --distill jsd --inputs "$gen/sparse16" --check
    if [ "$ngpu" -ge 4 ]; then
        one mpi_tp2_cp2 "$gen/dense" jsd 0.3 sum 0 "$MR" -np 4 "$SM" run --tp 2 --cp 2 --device cuda
    else
        skip mpi_tp2_cp2 "$ngpu GPUs: --tp 2 --cp 2 needs 4"
    fi
fi
cp "$res/steps.txt" "$OUT/" 2>/dev/null
tar czf "$OUT/distill_check.tgz" -C "$res" . 2>/dev/null
cat "$res/steps.txt"
[ $fail -eq 0 ] && echo "distill_check: PASS" || echo "distill_check: FAIL"
exit $fail
