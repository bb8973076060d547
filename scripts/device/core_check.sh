#!/usr/bin/env bash
# core_check.sh - on the device machine, inside the carried bundle (scripts/device/bundle.sh):
# the GPU checks of the core engineer's work (issues 16 and 18, library side), PASS/FAIL per
# line and in summary_core.txt under $OUT:
#   - force_kernel "ref" on CUDA is the staged float64 reference (bitwise = the CPU reference)
#     and refuses bad device data before writing     gpu_test_head_cuda_ref
#   - the non-finite device counter and sph_ctx_nonfinite (also under graph capture), the
#     staged reference's refusal, aliasing / 2^62 strides / garbage contexts on CUDA
#                                                     gpu_test_head_cuda_policies
#   - the CUDA head after the backend-table refactor and the A/B switches as options: the
#     whole suite (test_fused, test_sweep, test_pingpong, test_bi_sm90 drive cuda_flags now)
#                                                     gpu_test_head_cuda, _tp, test_bi_dhidden
#   - the environment mapping still reaches the contexts (sph_ctx_opts_apply_env): the suite
#     once under SPH_CUDA_FUSED=0 and once under SPH_CUDA_PINGPONG=0 / SPH_CUDA_SM90=0
#   - compute-sanitizer memcheck on the policies test (device counter atomics)
#   usage: core_check.sh          (QUICK=1: skips the environment reruns)
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
sum=$OUT/summary_core.txt
: > "$sum"
echo "commit $(cat COMMIT 2>/dev/null || echo unknown); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)" | tee -a "$sum"
status=0
run() { # name timeout cmd...
  local name=$1 to=$2; shift 2; local t0=$(date +%s)
  timeout "$to" "$@" > "$OUT/core_$name.log" 2>&1; local rc=$?
  local verdict=PASS
  [ $rc -eq 77 ] && verdict=SKIP
  [ $rc -ne 0 ] && [ $rc -ne 77 ] && { verdict=FAIL; status=1; }
  echo "$verdict $name rc=$rc ($(( $(date +%s) - t0 )) s)" | tee -a "$sum"
  [ "$verdict" = FAIL ] && tail -25 "$OUT/core_$name.log"
  return 0
}
for t in gpu_test_head_cuda_ref gpu_test_head_cuda_policies gpu_test_head_cuda \
         gpu_test_head_cuda_tp gpu_test_bi_dhidden; do
  if [ -x "bin/$t" ]; then run "$t" 300 "bin/$t"; else echo "FAIL $t: not in the bundle" | tee -a "$sum"; status=1; fi
done
if [ -z "${QUICK:-}" ]; then
  SPH_CUDA_FUSED=0 SPH_TEST_SKIP_HUGE=1 run head_cuda_env_nofused 200 bin/gpu_test_head_cuda
  SPH_CUDA_PINGPONG=0 SPH_CUDA_SM90=0 SPH_TEST_SKIP_HUGE=1 run head_cuda_env_nosm90 200 \
    bin/gpu_test_head_cuda
  # a bad value of a switch is refused, naming it (the library never reads them itself)
  if SPH_CUDA_FUSED=maybe ./bin/spanhead bench --device cuda --N 256 --H 64 --V 512 \
       > "$OUT/core_env_bad.log" 2>&1; then
    echo "FAIL env_bad_value: accepted" | tee -a "$sum"; status=1
  elif grep -q "SPH_CUDA_FUSED: 'maybe'" "$OUT/core_env_bad.log"; then
    echo "PASS env_bad_value" | tee -a "$sum"
  else
    echo "FAIL env_bad_value: $(tail -1 "$OUT/core_env_bad.log")" | tee -a "$sum"; status=1
  fi
fi
if command -v compute-sanitizer > /dev/null; then
  run memcheck_policies 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
    bin/gpu_test_head_cuda_policies
fi
echo "core_check: $( [ $status -eq 0 ] && echo PASS || echo FAIL )" | tee -a "$sum"
tar czf "$OUT/core_logs.tar.gz" -C "$OUT" $(cd "$OUT" && ls core_*.log) 2>/dev/null && (cd "$OUT" && rm -f core_*.log)
exit $status
