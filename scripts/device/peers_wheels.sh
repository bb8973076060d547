#!/usr/bin/env bash
# Fetch, here (where PyPI is reachable), the peer packages that bench/cuda/peers.py measures
# against spanhead, as wheels for the GPU machine (CPython 3.12, x86-64, no registry there).
# They land in .whl/ at the repository root (git-ignored); the device call carries .whl and
# installs them with pip --no-index (bench/cuda/README-peers.md has the exact command).
#
#   bash scripts/device/peers_wheels.sh          # idempotent: keeps wheels already there
#
# Peers (pinned; each wheel is pure Python, its kernels are Triton):
#   liger-kernel       fused linear cross entropy (needs torch, triton: both on the device)
#   cut-cross-entropy  Apple's CCE, impls cce and cce_exact (needs torch, triton)
#   verl               only its Triton fused log-prob/entropy kernel, verl/utils/kernel/, is
#                      loaded, by path, with a stub for verl.utils.device; verl's own
#                      dependencies (ray, hydra, datasets, ...) are NOT fetched and not needed.
#                      (SkyRL's skyrl-train 0.3.1 ships no fused linear log-prob kernel: its
#                      torch_utils calls flash-attn's cross entropy over materialized logits.)
# Nothing else is fetched: every other requirement (torch, triton, packaging, numpy,
# matplotlib, nvidia-ml-py) is already in the device image (/work/.library/device/KINDS.md).
# No peer code is committed to the repository; only these wheels travel.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.whl
mkdir -p "$dest"
py=${PYTHON:-python3}
pins=(liger-kernel==0.8.5 cut-cross-entropy==25.1.1 verl==0.9.1)
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64)
for pin in "${pins[@]}"; do
    name=${pin%%==*}
    ver=${pin##*==}
    stem=${name//-/_}
    if compgen -G "$dest/${stem}-${ver}-*.whl" >/dev/null; then
        echo "peers_wheels: $pin already in $dest"
        continue
    fi
    # one version of each package only: an older wheel would stop the device's install
    rm -f "$dest/${stem}"-*.whl
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${plat[@]}" -d "$dest" "$pin"
done
echo "peers_wheels: $dest holds"
ls -l "$dest"/*.whl
du -sh "$dest"
