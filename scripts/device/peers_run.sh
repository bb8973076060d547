#!/usr/bin/env bash
# peers_run.sh - on the GPU machine, from the repository root: spanhead and its peers side by
# side (bench/cuda/peers.py; bench/cuda/README-peers.md says what it measures). Installs the
# carried peer wheels into a scratch site-packages (pip --no-index: the device has no
# registry), finds the library, and runs peers.py into $OUT/peers (peers.md, .jsonl, .png,
# .log). Runs 12 and 18 were taken this way (then inside final_run.sh, now check_all.sh).
#   here:   scripts/device/peers_wheels.sh (the wheels into .whl/),
#           make python/spanhead/_spanhead.abi3.so, and a CUDA library:
#           scripts/device/bundle.sh (or a CUDA build in build/)
#   device: bash scripts/device/peers_run.sh [peers.py options]
#           carry [".devbundle.txz", ".whl", "python/spanhead/_spanhead.abi3.so"] (or "build"
#           in place of ".devbundle.txz")
# The library: $SPANHEAD_LIB, else the bundle's (unpacked from .devbundle.txz when needed),
# else build/libspanhead.so. PEERS_BUDGET (seconds, default 200) is peers.py's --budget-s;
# further options (e.g. --masks response --shapes A,B) go to peers.py as they are.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=$root/.devbundle
if [ ! -d "$B/lib" ] && [ -f .devbundle.txz ]; then
    mkdir -p "$B" && tar xJf .devbundle.txz -C "$B" || exit 1
fi
lib=${SPANHEAD_LIB:-}
for c in "$B/lib/libspanhead.so.0" build/libspanhead.so; do
    [ -z "$lib" ] && [ -e "$c" ] && lib=$(cd "$(dirname "$c")" && pwd)/$(basename "$c")
done
[ -n "$lib" ] ||
    { echo "peers_run: no libspanhead (carry .devbundle.txz or build/, or set SPANHEAD_LIB)"; exit 1; }
[ -e python/spanhead/_spanhead.abi3.so ] ||
    { echo "peers_run: python/spanhead/_spanhead.abi3.so missing (make it here and carry it)"; exit 1; }
compgen -G ".whl/*.whl" >/dev/null ||
    { echo "peers_run: no wheels in .whl/ (run scripts/device/peers_wheels.sh here, carry .whl)"; exit 1; }
[ -d "$B/lib" ] && export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" .whl/*.whl || { echo "peers_run: installing the wheels failed"; exit 1; }
export SPANHEAD_LIB=$lib PYTHONPATH=$site:$root/python${PYTHONPATH:+:$PYTHONPATH}
commit=$(cat "$B/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
export SPH_COMMIT=${SPH_COMMIT:-$commit}
echo "# peers_run $(date -u +%FT%TZ), library $SPANHEAD_LIB, commit $SPH_COMMIT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
python3 bench/cuda/peers.py --budget-s "${PEERS_BUDGET:-200}" --out "$OUT/peers" "$@"
