#!/usr/bin/env bash
# The Python binding on a GPU machine (the lead runs this through the device tool; nothing is
# built there: no pip registry, and its Python is 3.12 while the build machine has 3.11).
#
# Build here first, then carry the results:
#   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j2   (CUDA on)
#   make python/spanhead/_spanhead.abi3.so                # the extension (stable ABI)
#   pip install --target python/.pydeps pytest           # only if the GPU machine lacks pytest
#   run: bash scripts/device/python_gpu.sh
#   carry: ["build", "python/spanhead/_spanhead.abi3.so", "python/.pydeps"]
# The extension is built against the CPython stable ABI (abi3, Py_LIMITED_API 3.9), so the
# file built by 3.11 here imports on 3.12 there; it dlopens the library named by SPANHEAD_LIB.
#
# What it runs: the whole pytest suite of python/tests (CPU parts included), with the GPU
# module test_torch_cuda.py (the adapter against torch's dense logits/log_softmax/gather/
# entropy in float32 and bf16, CUDA-graph capture of forward+backward, no host sync in the hot
# path), then a short timing against torch's dense path. The log goes to $OUT (or /tmp) as
# python_gpu.txt, to be kept under bench/results/ with the machine line it opens with.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}
log=$out/python_gpu.txt
lib=${SPANHEAD_LIB:-}
for c in build/libspanhead.so build/libspanhead.so.0 build/libspanhead.so.*.*.* \
         python/spanhead/libspanhead.so; do
    [ -z "$lib" ] && [ -e "$c" ] && lib=$PWD/$c
done
if [ -z "$lib" ]; then
    echo "python_gpu: no libspanhead.so (carry build/ or set SPANHEAD_LIB)" | tee "$log"
    exit 1
fi
if [ ! -e python/spanhead/_spanhead.abi3.so ]; then
    echo "python_gpu: python/spanhead/_spanhead.abi3.so missing (build it here and carry it)" \
        | tee "$log"
    exit 1
fi
export SPANHEAD_LIB=$lib PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
# pytest for a machine without a registry: `pip install --target python/.pydeps pytest` here
# (pure Python, works for 3.12 there) and carry python/.pydeps too.
[ -d python/.pydeps ] && PYTHONPATH=$PYTHONPATH:$PWD/python/.pydeps
[ -x build/spanhead ] && export SPANHEAD_CLI=$PWD/build/spanhead
py=${PYTHON:-python3}
{
    echo "# python_gpu $(date -u +%FT%TZ) git $(git rev-parse --short HEAD 2>/dev/null)$(
        git diff --quiet 2>/dev/null || echo +dirty)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    $py -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
            "cuda", torch.version.cuda)'
    echo "library: $SPANHEAD_LIB"
    rc=0
    if $py -c 'import pytest' 2>/dev/null; then
        $py -m pytest -q -rs -p no:cacheprovider python/tests || rc=$?
    else
        echo "pytest missing: running the GPU checks without it is not supported"; rc=1
    fi
    $py examples/policy_gradient.py --backend torch --device cuda --steps 20 || rc=$?
    $py python/tests/bench_torch_gpu.py || rc=$?
    echo "python_gpu: exit $rc"
    exit $rc
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
