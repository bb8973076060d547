#!/usr/bin/env bash
# Installs what spanhead needs to build and test on a fresh Debian machine:
# compilers and CMake come with the image; this adds cmocka (C unit tests), cJSON (JSON in the
# CLI), OpenBLAS (CPU tile products, OpenMP flavour so it runs serially inside our own OpenMP
# regions), Open MPI (communicator), clang's libFuzzer runtime (fuzz target) and the Python test
# tools. Idempotent: does nothing when everything is present.
set -euo pipefail

pkgs=(cmake pkg-config libcmocka-dev libcjson-dev libopenblas-openmp-dev liblapack-dev
      libopenmpi-dev openmpi-bin clang libclang-rt-14-dev python3-dev)
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
if ! $py -c 'import numpy, pytest' >/dev/null 2>&1; then
    echo "setup: installing numpy and pytest"
    $py -m pip install -q numpy pytest
fi
