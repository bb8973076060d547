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

# ---- the RL frameworks for the integration tests (python/tests/test_integrations_*.py) ----
# verl, SkyRL and TRL from PyPI, each WITHOUT its dependency tree (ray, vLLM, flash-attn,
# ... are gigabytes) into its own folder build-integrations/<framework> (pip --target), with
# only the small packages its tested modules import, pinned; the tests put that folder first
# on sys.path under the venv's python. Separate folders keep their pins apart (SkyRL's
# transformers pin, for one, is not installed at all: the venv's transformers serves).
# A folder whose stamp matches the list is left as it is. SPH_INTEGRATIONS=none skips it (the
# tests then skip, saying so). About 90 MB of wheels (mostly pyarrow and pandas), a minute.
integ=${SPH_INTEGRATIONS:-$(cd "$(dirname "$0")/.." && pwd)/build-integrations}
if [ "$venv" != none ] && [ "$integ" != none ]; then
    declare -A integ_reqs=(
        [verl]="verl==0.9.1 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 tensordict==0.10.0
                cloudpickle==3.1.3 orjson==3.13.0 importlib_metadata==10.2.0 zipp==4.1.2
                pyvers==0.1.0"
        [skyrl]="skyrl==0.3.0 megatron-core==0.16.1 omegaconf==2.3.0
                 antlr4-python3-runtime==4.9.3 loguru==0.7.3 jaxtyping==0.3.11
                 wadler_lindig==0.1.8 pandas==3.1.1 python-dateutil==4.0.0 pytz==2026.6
                 tzdata==2026.6 six==1.17.0 requests==2.34.2 urllib3==2.8.0 idna==3.20
                 certifi==2026.10.19.post1 charset_normalizer==3.5.3"
        [trl]="trl==1.16.0 accelerate==1.13.0 datasets==5.2.0 pyarrow==24.0.0 pandas==3.1.1
               python-dateutil==4.0.0 pytz==2026.6 tzdata==2026.6 six==1.17.0 dill==0.4.1
               multiprocess==0.70.19 xxhash==4.1.0 psutil==7.2.2 requests==2.34.2
               urllib3==2.8.0 idna==3.20 certifi==2026.10.19.post1 charset_normalizer==3.5.3"
    )
    for fw in verl skyrl trl; do
        reqs=$(echo ${integ_reqs[$fw]})
        dir=$integ/$fw
        if [ "$(cat "$dir/.spanhead-stamp" 2>/dev/null)" != "$reqs" ]; then
            echo "setup: installing $fw (no dependencies beyond: $reqs) into $dir"
            rm -rf "$dir" && mkdir -p "$dir"
            # shellcheck disable=SC2086
            "$venv/bin/python" -m pip install -q --no-deps --disable-pip-version-check \
                --target "$dir" $reqs
            echo "$reqs" > "$dir/.spanhead-stamp"
        fi
    done
fi
