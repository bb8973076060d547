#!/usr/bin/env bash
# sass_epi.sh - the sm_90a statistics epilogue's SASS, per variant, on a machine without a GPU.
#
# Compiles bench/cuda/sass_epi.cu (one kernel per epilogue variant: plain, sum_p2, top-k under
# the SPH_TEST_TOPK_VARIANT bits it names) for sm_90a and prints, per kernel, its static
# instruction count, its spills and its loops (the top-k's emission: instructions per
# candidate). On the H200 the fused statistics kernel's time follows its executed
# instructions at H 2048 (run 33 call 2, ~4 ms per G at A 16K): this is the count to check
# before a device call. Extra arguments go to scripts/sass_lines.py (e.g. --lines, a kernel
# name). Needs nvcc and nvdisasm + cuobjdump: the CUDA toolkit's, or the ones in the Triton
# wheel of the test environment (make test makes build-venv), or `pip install
# nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${SASS_OUT:-$root/build/sass}
mkdir -p "$out"
find_tool() {
    local t=$1 c
    for c in "$(command -v "$t" 2>/dev/null || true)" "/usr/local/cuda/bin/$t" \
        "$root"/build-venv/lib/python3*/site-packages/triton/backends/nvidia/bin/"$t" \
        "$root"/build-venv/lib/python3*/site-packages/nvidia/cuda_nvdisasm/bin/"$t" \
        "$root"/build-venv/lib/python3*/site-packages/nvidia/cuda_cuobjdump/bin/"$t"; do
        [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
    done
    return 1
}
command -v nvcc >/dev/null || { echo "sass_epi: nvcc not found (the CUDA toolkit)" >&2; exit 1; }
dis=$(find_tool nvdisasm) || { echo "sass_epi: nvdisasm not found (see the header)" >&2; exit 1; }
res=$(find_tool cuobjdump) || res=
# SASS_EPI_QUICK=1: the epilogue kernels only (seconds), not the statistics kernel's two
# instantiations (minutes: its registers and stack)
nvcc -cubin -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr \
    ${SASS_EPI_QUICK:+-DSASS_EPI_QUICK} -lineinfo -I"$root/include" -I"$root/src" "$root/bench/cuda/sass_epi.cu" \
    -o "$out/sass_epi.cubin"
"$dis" -g -c "$out/sass_epi.cubin" >"$out/sass_epi.sass"
if [ -n "$res" ]; then
    echo "# registers and stack per kernel (ptxas; __launch_bounds__(384, 1): 168 at most)"
    "$res" -res-usage "$out/sass_epi.cubin" 2>/dev/null | grep -A1 "Function" |
        sed -n 's/.*Function \(.*\):/\1/p; s/^ *\(REG:[0-9]* STACK:[0-9]*\).*/   \1/p' | paste - -
fi
python3 "$root/scripts/sass_lines.py" "$out/sass_epi.sass" "${@:-sass_epi}"
