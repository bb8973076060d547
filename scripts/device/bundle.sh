#!/usr/bin/env bash
# bundle.sh - build the CUDA binaries here and stage them, with the non-CUDA shared libraries
# they need (cmocka, cJSON, OpenBLAS and its Fortran runtime, libgomp), into a folder the
# device tool carries (default /work/main/.devbundle, git-ignored there), with the scripts
# that run inside it (run_tests.sh, bench_grid.sh, bench_ab.sh, sm90_check.sh,
# ncu_breakdown.sh, core_check.sh, issue23.sh, nccl_gpu.sh) and its commit (COMMIT). cudart, cuBLAS and NCCL are not copied: the device
# image has them. scripts/device/README.md lists what runs where.
#   usage: scripts/device/bundle.sh [build-dir] [bundle-dir]   (defaults build-dev, above)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-dev}
out=${2:-/work/main/.devbundle}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSPH_MPI=OFF -DSPH_WERROR=ON >/dev/null
cmake --build "$build" -j2
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp "$build"/tests/gpu_test_* "$build"/spanhead "$out/bin/"
[ -n "${SPH_BUNDLE_SM90BENCH:-}" ] && [ -x "$build"/bench/bench_sm90_logits ] && cp "$build"/bench/bench_sm90_logits "$out/bin/"
[ -x "$build"/bench/bench_sm90_epi ] && cp "$build"/bench/bench_sm90_epi "$out/bin/"
# the distillation loss over NCCL on 2+ GPUs of one process (distill_check.sh runs it)
[ -x "$build"/tests/mpi/gpu_distill_nccl ] && cp "$build"/tests/mpi/gpu_distill_nccl "$out/bin/"
cp -L "$build"/libspanhead.so.0 "$out/lib/"
for b in "$out"/bin/* "$out"/lib/libspanhead.so.0; do
  ldd "$b" | awk '/=>/ {print $3}' | grep -Ev 'cuda|cublas|nccl|libc\.so|libm\.so|libdl|libpthread|librt|ld-linux|libstdc|libgcc_s' || true
done | sort -u | while read -r lib; do cp -L "$lib" "$out/lib/"; done
# the scripts that run inside the bundle (scripts/device/README.md); nccl_gpu.sh comes below
for s in run_tests.sh bench_grid.sh bench_ab.sh sm90_check.sh ncu_breakdown.sh core_check.sh issue23.sh; do
  cp "$root/scripts/device/$s" "$out/"
done
git -C "$root" rev-parse --short HEAD > "$out/COMMIT"
"$root"/scripts/device/nccl_gpu.sh stage "$build" "$out" || echo "bundle: gpu_nccl_single not staged"
du -sh "$out"
# the statically linked test binaries and OpenBLAS pass the device tool's 64 MiB carry limit
# together with the tree: carry the xz archive (~21 MB) and unpack it there first:
#   carry [".devbundle.txz"]; mkdir -p .devbundle && tar xJf .devbundle.txz -C .devbundle
# xz -9: a 64 MiB dictionary spans several of the ~15 MB test programs, which share most of
# their bytes (the statically linked library): ~21 MB instead of ~95 MB with tar's default -6
tar cf - -C "$out" . | xz -9 -T2 > "$out.txz"
ls -la "$out.txz"
