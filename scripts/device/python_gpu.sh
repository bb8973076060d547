#!/usr/bin/env bash
# The Python package on the GPU machine, installed from its wheel (no build there: no registry,
# Python 3.12 with torch 2.11+cu130 and transformers preinstalled; the wheel is cp39-abi3).
#
# Here (the build machine), once:
#   bash scripts/device/python_gpu.sh prepare
#     builds libspanhead with CUDA and without MPI (build-pywheel/), the wheel with the
#     non-system libraries it needs beside it (OpenBLAS and its Fortran runtime, libgomp:
#     SPANHEAD_WHEEL_LIBS=auto), into .pywhl/, and pytest (pure Python) into .pywhl/pydeps.
# Then through the device tool:
#   run:   bash scripts/device/python_gpu.sh
#   carry: [".pywhl"] (the peers' wheels live in .whl; carry both for check_all.sh)
#
# What it runs, with LD_LIBRARY_PATH unset (the wheel needs none) and the package imported
# from the installed wheel (not the source tree), PASS/FAIL per part:
#   1. the whole pytest suite of python/tests: the CPU tests, test_torch_cuda.py (dense float64
#      references at the arithmetic's tolerances, torch.compile fullgraph on CUDA with device /
#      host masks and spans, autocast, cross-entropy, CUDA-graph capture, no host sync),
#      test_coexist.py on CUDA (both import orders; one libcublas and one libnccl in the
#      process, torch's; spanhead over a torch.distributed NCCL group);
#   2. test_hf.py once more with the models on the GPU (SPH_HF_DEVICE=cuda);
#   3. examples/policy_gradient.py --backend torch and examples/grpo_hf.py on cuda;
#   4. a short timing against torch's dense path (bench_torch_gpu.py).
# The log goes to $OUT/python_gpu.txt (keep it under bench/results/ with its machine line).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

if [ "${1:-}" = prepare ]; then
    set -e
    py=${PYTHON:-python3}
    [ -x build-venv/bin/python ] && py=build-venv/bin/python
    cmake -S . -B build-pywheel -DCMAKE_BUILD_TYPE=Release -DSPH_MPI=OFF -DSPH_BUILD_TESTS=OFF \
        -DSPH_BUILD_BENCH=OFF -DSPH_BUILD_CLI=OFF -DSPH_WERROR=ON >/dev/null
    rm -rf .pywhl && mkdir -p .pywhl
    # --no-build-isolation builds with this Python's own setuptools and wheel
    "$py" -c 'import setuptools, wheel' 2>/dev/null || "$py" -m pip install -q setuptools wheel
    SPANHEAD_BUILD_DIR=$root/build-pywheel SPANHEAD_WHEEL_LIBS=auto \
        "$py" -m pip wheel --no-build-isolation --no-deps -w .pywhl ./python
    "$py" -m pip install -q --no-deps --target .pywhl/pydeps pytest pluggy iniconfig packaging
    unzip -l .pywhl/spanhead-*.whl | grep -E "libspanhead|\.libs/" || true
    du -sh .pywhl
    exit 0
fi

out=${OUT:-/tmp}
log=$out/python_gpu.txt
py=${PYTHON:-python3}
whl=$(ls .pywhl/spanhead-*.whl 2>/dev/null | head -1)
if [ -z "$whl" ]; then
    echo "python_gpu: FAIL no .pywhl/spanhead-*.whl (run 'python_gpu.sh prepare' here and carry .pywhl)" \
        | tee "$log"
    exit 1
fi
site=$(mktemp -d)/site
unset LD_LIBRARY_PATH SPANHEAD_LIB SPANHEAD_BUILD_DIR
{
    echo "# python_gpu $(date -u +%FT%TZ) git $(git rev-parse --short HEAD 2>/dev/null)$(
        git diff --quiet 2>/dev/null || echo +dirty) wheel $(basename "$whl")"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    if ! $py -m pip install -q --no-deps --no-index --target "$site" "$whl" 2>/dev/null; then
        mkdir -p "$site" && $py -m zipfile -e "$whl" "$site"  # a Python without pip
    fi
    export PYTHONPATH=$site:$root/.pywhl/pydeps NCCL_NVLS_ENABLE=0
    $py -c 'import sys, torch, transformers, spanhead
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__)
print("spanhead", spanhead.__version__, "library", spanhead.LIBRARY_PATH,
      "devices", spanhead.cuda_device_count())'
    rc=0
    part() {  # part NAME COMMAND...: runs it, prints PASS/FAIL NAME
        local name=$1
        shift
        echo "== $name"
        if "$@"; then echo "PASS $name"; else echo "FAIL $name"; rc=1; fi
    }
    # PYTEST_TARGETS: a shorter list of test files for a tight device budget (the CPU tests
    # also run in CI), e.g. "python/tests/test_torch_cuda.py python/tests/test_coexist.py"
    part pytest $py -m pytest -q -rs -p no:cacheprovider ${PYTEST_TARGETS:-python/tests}
    # ONLY_PYTEST=1: the pytest part alone (a follow-up check of a few tests)
    if [ -z "${ONLY_PYTEST:-}" ]; then
        part pytest-hf-cuda env SPH_HF_DEVICE=cuda $py -m pytest -q -rs -p no:cacheprovider \
            python/tests/test_hf.py
        part example-policy-gradient $py examples/policy_gradient.py --backend torch \
            --device cuda --steps 20
        part example-grpo-hf $py examples/grpo_hf.py --device cuda
        [ -n "${SKIP_BENCH_TORCH:-}" ] || part bench-torch $py python/tests/bench_torch_gpu.py
    fi
    echo "python_gpu: $([ $rc = 0 ] && echo PASS || echo FAIL) (exit $rc)"
    exit $rc
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
