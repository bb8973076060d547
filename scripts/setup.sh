#!/usr/bin/env bash
# Installs what spanhead needs to build and test on a fresh Debian machine:
# compilers and CMake come with the image; this adds cmocka (C unit tests), cJSON (JSON in the
# CLI), OpenBLAS (CPU tile products, OpenMP flavour so it runs serially inside our own OpenMP
# regions), Open MPI (communicator), clang's libFuzzer runtime (fuzz targets, also run briefly by
# make test), the Python test tools and matplotlib (spanhead bench --plot, bench/plot_bench.py).
# Idempotent: does nothing when everything is present.
set -euo pipefail

pkgs=(cmake pkg-config libcmocka-dev libcjson-dev libopenblas-openmp-dev liblapack-dev
      libopenmpi-dev openmpi-bin clang libclang-rt-14-dev libomp-dev python3-dev)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

py=${PYTHON:-python3}
if ! $py -c 'import numpy, pytest, matplotlib' >/dev/null 2>&1; then
    echo "setup: installing numpy, pytest and matplotlib"
    $py -m pip install -q numpy pytest matplotlib
fi

# The Python tests run in a virtual environment with PyPI's default torch wheel (the CUDA one,
# with its nvidia-* wheels: its own NCCL 2.30, cuBLAS and cudart beside the system's CUDA 13.0
# ones, which is the coexistence case of docs/python.md the import-order tests need) and
# transformers (tiny models built from configs, no hub). About 3 GB of wheels, 3-5 minutes.
# SPH_VENV=none skips it (the torch and Hugging Face tests then skip, saying so).
venv=${SPH_VENV:-$(cd "$(dirname "$0")/.." && pwd)/build-venv}
torch_req=${SPH_TORCH_REQ:-torch==2.15.*}
hf_req=${SPH_HF_REQ:-transformers==5.17.*}
if [ "$venv" != none ]; then
    if [ ! -x "$venv/bin/python" ]; then
        echo "setup: creating $venv"
        $py -m venv "$venv"
    fi
    if ! "$venv/bin/python" -c 'import numpy, pytest, torch, transformers, setuptools' >/dev/null 2>&1; then
        echo "setup: installing numpy, pytest, $torch_req, $hf_req into $venv (~3 GB)"
        "$venv/bin/python" -m pip install -q numpy pytest setuptools "$torch_req" "$hf_req"
    fi
fi
