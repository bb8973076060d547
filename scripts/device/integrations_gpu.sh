#!/usr/bin/env bash
# The framework adapters (issue 24, docs/integrations.md) on the GPU machine: verl's adapter
# against verl's own Triton linear_cross_entropy (values, gradients, time), SkyRL's against
# its Triton and torch backends, a TRL GRPOTrainer step patched and not, each with one timed
# training step at a realistic shape (bench/cuda/integrations_gpu.py), after the framework's
# CPU integration tests (python/tests/test_integrations_<framework>.py) on that machine.
#
# Here (PyPI reachable), once:
#   bash scripts/device/python_gpu.sh prepare           # the spanhead wheel, into .pywhl/
#   bash scripts/device/integrations_gpu.sh prepare     # the frameworks, into build-intwhl/
#     installs each framework's pinned list (the one scripts/setup.sh installs for CI) for
#     CPython 3.12 / x86-64 (the GPU image's), --no-deps, into build-intwhl/stage/<fw>, and
#     packs it as build-intwhl/<fw>.tar.xz (measured: verl 3.6 MB, SkyRL 21 MB, TRL 52 MB,
#     pyarrow most of it). The image's torch 2.11, triton 3.6 and transformers serve all three.
# Then through the device tool, one call per framework:
#   run:   bash scripts/device/integrations_gpu.sh verl     (or skyrl; several: "verl skyrl")
#   carry: [".pywhl", "build-intwhl/verl.tar.xz"]           (the tarball of each one named)
# TRL's tarball and .pywhl together pass the 64 MiB carry limit, so TRL takes two calls back
# to back (the unpacked tree in /tmp survives while the machine stays warm):
#   run: bash scripts/device/integrations_gpu.sh stage trl   carry: ["build-intwhl/trl.tar.xz"]
#   run: bash scripts/device/integrations_gpu.sh trl         carry: [".pywhl"]
# Results: $OUT/integrations_<fw>.md / .json (the tables: times, peak memory, agreement) and
# $OUT/integrations_gpu.txt (the whole log); PASS/FAIL per part, exit status 1 on a FAIL.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
fws=(verl skyrl trl)

if [ "${1:-}" = prepare ]; then
    set -e
    py=${PYTHON:-python3}
    [ -x build-venv/bin/python ] && py=build-venv/bin/python
    # the pinned lists of scripts/setup.sh (one source)
    eval "$(sed -n '/^    declare -A integ_reqs=(/,/^    )/p' scripts/setup.sh)"
    plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
          --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --platform manylinux2010_x86_64
          --platform manylinux1_x86_64 --platform any)
    tgt=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
         --abi abi3 --abi none "${plat[@]}")
    mkdir -p build-intwhl/sdist
    sel=("${@:2}")
    [ ${#sel[@]} -eq 0 ] && sel=("${fws[@]}")
    for fw in "${sel[@]}"; do
        reqs=$(echo ${integ_reqs[$fw]})
        stage=build-intwhl/stage/$fw
        rm -rf "$stage" && mkdir -p "$stage"
        for r in $reqs; do
            # a package without a wheel on the index (antlr4-python3-runtime 4.9.3 is an sdist,
            # pure Python) is built into a wheel here first
            if ! "$py" -m pip install -q --disable-pip-version-check "${tgt[@]}" \
                    --target "$stage/$fw" "$r" 2>/dev/null; then
                "$py" -m pip wheel -q --no-deps -w build-intwhl/sdist "$r"
                whl=$(ls -t build-intwhl/sdist/"$(echo "${r%%==*}" | tr - _)"-*.whl | head -1)
                "$py" -m pip install -q --disable-pip-version-check "${tgt[@]}" \
                    --target "$stage/$fw" "$whl"
            fi
        done
        echo "$reqs" > "$stage/$fw/.spanhead-stamp"
        tar -C "$stage" -cf - "$fw" | xz -6 -T2 > "build-intwhl/$fw.tar.xz"
        du -h "build-intwhl/$fw.tar.xz"
    done
    exit 0
fi

fwdir=/tmp/spanhead-integrations
unpack() {  # unpack FW: build-intwhl/FW.tar.xz into $fwdir (0 when done or already there)
    if [ -f "build-intwhl/$1.tar.xz" ]; then
        mkdir -p "$fwdir" && rm -rf "${fwdir:?}/$1" &&
            xz -dc "build-intwhl/$1.tar.xz" | tar -C "$fwdir" -xf -
    else
        [ -f "$fwdir/$1/.spanhead-stamp" ]
    fi
}
if [ "${1:-}" = stage ]; then
    for fw in "${@:2}"; do
        if unpack "$fw"; then echo "stage: $fw in $fwdir/$fw"; else
            echo "stage: FAIL build-intwhl/$fw.tar.xz not carried"; exit 1; fi
    done
    exit 0
fi

out=${OUT:-/tmp}
mkdir -p "$out"
log=$out/integrations_gpu.txt
py=${PYTHON:-python3}
sel=("$@")
[ ${#sel[@]} -eq 0 ] && sel=("${fws[@]}")
whl=$(ls .pywhl/spanhead-*.whl 2>/dev/null | head -1)
# without a wheel: the tree's package (python/, its extension built here and carried) on the
# library $SPANHEAD_LIB names (a bundle's libspanhead.so.0): one device call fewer
tree_pkg=0
if [ -z "$whl" ] && [ -n "${SPANHEAD_LIB:-}" ] && [ -e python/spanhead/_spanhead.abi3.so ]; then
    tree_pkg=1
elif [ -z "$whl" ]; then
    echo "integrations_gpu: FAIL no .pywhl/spanhead-*.whl (python_gpu.sh prepare here, carry" \
        ".pywhl), and no SPANHEAD_LIB + python/spanhead/_spanhead.abi3.so" | tee "$log"
    exit 1
fi
site=$(mktemp -d)/site
[ "$tree_pkg" = 1 ] || unset LD_LIBRARY_PATH SPANHEAD_LIB SPANHEAD_BUILD_DIR
{
    echo "# integrations_gpu $(date -u +%FT%TZ) git $(git rev-parse --short HEAD 2>/dev/null)$(
        git diff --quiet 2>/dev/null || echo +dirty) $( [ "$tree_pkg" = 1 ] &&
        echo "tree package, library $SPANHEAD_LIB" || echo "wheel $(basename "$whl")")"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    if [ "$tree_pkg" = 1 ]; then
        export PYTHONPATH=$root/python
    else
        if ! $py -m pip install -q --no-deps --no-index --target "$site" "$whl" 2>/dev/null; then
            mkdir -p "$site" && $py -m zipfile -e "$whl" "$site"
        fi
        export PYTHONPATH=$site:$root/.pywhl/pydeps
    fi
    export SPANHEAD_INTEGRATIONS_DIR=$fwdir NCCL_NVLS_ENABLE=0
    $py -c 'import sys, torch, transformers, spanhead
print("python", sys.version.split()[0], "torch", torch.__version__, "transformers",
      transformers.__version__, "spanhead", spanhead.__version__)'
    rc=0
    for fw in "${sel[@]}"; do
        echo "== $fw"
        if ! unpack "$fw"; then
            echo "FAIL $fw: build-intwhl/$fw.tar.xz not carried and not staged (prepare here;"\
                "carry it, or run 'stage $fw' first)"
            rc=1
            continue
        fi
        if $py -m pytest -q -rs -p no:cacheprovider "python/tests/test_integrations_$fw.py"; then
            echo "PASS $fw CPU tests"
        else
            echo "FAIL $fw CPU tests"
            rc=1
        fi
        if $py bench/cuda/integrations_gpu.py "$fw" --out "$out"; then
            echo "PASS $fw GPU"
        else
            echo "FAIL $fw GPU"
            rc=1
        fi
    done
    echo "integrations_gpu: exit $rc"
    exit $rc
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
