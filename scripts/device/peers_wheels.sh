#!/usr/bin/env bash
# Fetch, here (where PyPI is reachable), the peer packages that bench/cuda/peers.py measures
# against spanhead, for the GPU machine (CPython 3.12, x86-64, CUDA 13 driver, no registry
# there), and pack them so that they pass the device tool's 64 MiB carry limit.
#
#   bash scripts/device/peers_wheels.sh            # idempotent: keeps what is already there
#   bash scripts/device/peers_wheels.sh --no-cute  # only the Triton peers (.whl, 2.6 MB)
#
# 1. The Triton peers, as wheels in .whl/ (git-ignored), carried as ".whl" and pip-installed
#    there with --no-index (each pure Python, kernels in Triton):
#      liger-kernel 0.8.5       fused linear cross entropy (Triton), its CuTe DSL SM90 kernel
#                               (liger_kernel/ops/cutedsl, needs the DSL below) and its
#                               chunked GRPO loss (pure torch)
#      cut-cross-entropy 25.1.1 Apple's CCE, impls cce and cce_exact
#      verl 0.9.1               only verl/utils/kernel/ is loaded, by path; verl's own
#                               dependencies (ray, hydra, ...) are not needed
# 2. The CuTe DSL peers, staged as a site-packages tree and packed in two archives:
#      quack-kernels 0.6.5, nvidia-cutlass-dsl 4.8.1 (+ libs-base, libs-core, libs-cu13; the
#      cu13 flavour: the H200's driver is CUDA 13.0), apache-tvm-ffi 0.1.15.post2, and
#      typing-extensions 4.15.0 (tvm_ffi imports typing_extensions.get_annotations, new in
#      4.13; torch 2.11 only asks >= 4.10 of the image's copy)
#    The cu13 libraries wheel is 92 MB (its _cutlass_ir extension alone is 193 MB unpacked):
#    too much for one call with the tree and the CUDA bundle. So:
#      .peers/stage1/cutlass_ir.tar.xz  that one extension, xz with the x86 BCJ filter
#                                       (~47.5 MB), unpacked by `peers_run.sh stage`
#      .peers/stage2/site.tar.xz        everything else (~21 MB), unpacked by `peers_run.sh run`
#    both into /tmp/peers/site-packages on the device, whose path holds "/site-packages/"
#    (quack's compile-cache key fails closed otherwise; bench/cuda/README-peers.md says why).
#    Stage 1 travels in its own call (or rides along the call before), stage 2 with the run;
#    files outside the work tree survive between calls while the machine stays warm.
# Every Requires-Dist of the carried wheels is checked against what is carried plus what the
# GPU image has (KINDS.md: torch 2.11.0, triton 3.6.0, numpy, einops, cuda-bindings, protobuf,
# typing-extensions, cloudpickle, packaging, ...): anything else stops the script.
# No peer code is committed to the repository; only these archives travel.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
py=${PYTHON:-python3}
cute=1
[ "${1:-}" = "--no-cute" ] && cute=0
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
dl=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
    --abi abi3 --abi none "${plat[@]}")

fetch() { # dest pin...: one version of each package only (two stop the device's install)
    local dest=$1 pin name ver stem
    shift
    mkdir -p "$dest"
    for pin in "$@"; do
        name=${pin%%==*}
        ver=${pin##*==}
        stem=${name//-/_}
        if compgen -G "$dest/${stem}-${ver}-*.whl" >/dev/null; then
            echo "peers_wheels: $pin already in $dest"
            continue
        fi
        rm -f "$dest/${stem}"-*.whl
        "$py" -m pip download -q "${dl[@]}" -d "$dest" "$pin"
    done
}

triton_pins=(liger-kernel==0.8.5 cut-cross-entropy==25.1.1 verl==0.9.1)
cute_pins=(quack-kernels==0.6.5 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
           nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1
           apache-tvm-ffi==0.1.15.post2 typing-extensions==4.15.0)
fetch .whl "${triton_pins[@]}"
[ "$cute" = 1 ] && fetch .peers/wheels "${cute_pins[@]}"

# Requires-Dist of every carried wheel (markers for CPython 3.12 on Linux x86-64, no extras)
# against what is carried and what the GPU image has.
"$py" - "$cute" <<'EOF'
import glob, re, sys, zipfile
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "extra": ""}
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
# in the device image (KINDS.md, 'Python packages already there'); torch 2.11.0, triton 3.6.0
image = {"torch", "triton", "numpy", "packaging", "einops", "cuda-bindings", "cuda-core",
         "cuda-pathfinder", "protobuf", "typing-extensions", "cloudpickle", "matplotlib",
         "nvidia-ml-py", "filelock", "jinja2", "networkx", "sympy", "fsspec", "setuptools",
         "pyyaml", "psutil", "tqdm", "requests", "transformers", "safetensors"}
# needed by a wheel's metadata, not at run time here (why in bench/cuda/README-peers.md)
waived = {"torch-c-dlpack-ext": "torch 2.11 exports __dlpack_c_exchange_api__ itself: "
                                "tvm_ffi skips the addon",
          "nvidia-cutlass-dsl-libs-cu12": "the cu13 flavour is carried instead (CUDA 13 driver)"}
whls = glob.glob(".whl/*.whl") + (glob.glob(".peers/wheels/*.whl") if sys.argv[1] == "1" else [])
def metadata(w):
    z = zipfile.ZipFile(w)
    meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode().replace("\r", "")
    return norm(re.search(r"^Name: (.+)$", meta, re.M).group(1)), meta
metas = dict(metadata(w) for w in sorted(whls))
carried = set(metas)
bad = []
for name, meta in sorted(metas.items()):
    if name == "verl":      # only verl/utils/kernel is loaded, by path (see peers.py)
        continue
    for line in re.findall(r"^Requires-Dist: (.+)$", meta, re.M):
        line = line.strip()
        r = Requirement(line)
        if r.marker is not None and not r.marker.evaluate(env):
            continue
        dep = norm(r.name)
        if dep in carried:
            continue
        if dep in image:
            print(f"peers_wheels: {name} needs {line.strip()}: in the GPU image")
        elif dep in waived:
            print(f"peers_wheels: {name} needs {dep}: waived ({waived[dep]})")
        else:
            bad.append(f"{name} needs {line.strip()}: neither carried nor in the GPU image")
for b in bad:
    print(f"peers_wheels: ERROR {b}")
sys.exit(1 if bad else 0)
EOF

if [ "$cute" = 1 ]; then
    big=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
    stamp="${cute_pins[*]}"
    if [ -f .peers/STAMP ] && [ "$(cat .peers/STAMP)" = "$stamp" ] &&
       [ -f .peers/stage1/cutlass_ir.tar.xz ] && [ -f .peers/stage2/site.tar.xz ]; then
        echo "peers_wheels: .peers/stage1 and .peers/stage2 are up to date"
    else
        rm -rf .peers/build .peers/stage2 .peers/STAMP
        site=.peers/build/site-packages
        # install for CPython 3.12 on manylinux x86-64 whatever python runs here
        "$py" -m pip install -q --no-deps --no-index --no-compile --target "$site" \
            --python-version 3.12 --implementation cp --abi cp312 \
            --platform manylinux_2_28_x86_64 --only-binary=:all: .peers/wheels/*.whl
        [ -f "$site/$big" ] || { echo "peers_wheels: $site/$big missing"; exit 1; }
        rm -rf "$site/bin"     # console scripts (run-iket), not used
        mkdir -p .peers/stage1 .peers/stage2
        sha=$(sha256sum "$site/$big" | cut -d' ' -f1)
        if [ -f .peers/stage1/cutlass_ir.tar.xz ] &&
           [ "$(cut -d' ' -f1 .peers/stage1/cutlass_ir.sha256 2>/dev/null)" = "$sha" ]; then
            echo "peers_wheels: stage 1 holds this extension already (sha256 $sha)"
        else
            echo "peers_wheels: packing stage 1 (the 193 MB extension; xz -9e with the x86" \
                 "filter takes minutes)"
            rm -f .peers/stage1/*
            tar -C "$site" -cf - "$big" | xz -T1 --x86 --lzma2=preset=9e,dict=192MiB \
                > .peers/stage1/cutlass_ir.tar.xz.tmp
            mv .peers/stage1/cutlass_ir.tar.xz.tmp .peers/stage1/cutlass_ir.tar.xz
            echo "$sha  $big" > .peers/stage1/cutlass_ir.sha256
        fi
        echo "peers_wheels: packing stage 2"
        tar -C "$site" --exclude="./$big" -cf - . | xz -T1 --x86 --lzma2=preset=9e \
            > .peers/stage2/site.tar.xz.tmp
        mv .peers/stage2/site.tar.xz.tmp .peers/stage2/site.tar.xz
        {
            echo "# the CuTe DSL peers for the GPU machine (scripts/device/peers_wheels.sh)"
            echo "pins: $stamp"
            echo "stage1_sha256: $sha  $big"
            echo "built: $(date -u +%FT%TZ)"
        } > .peers/stage2/MANIFEST
        echo "$stamp" > .peers/STAMP
        rm -rf .peers/build
    fi
fi

echo "peers_wheels: what travels (the device tool carries at most 64 MiB = 67108864 bytes per"
echo "call, the tree (~5 MB) and .devbundle.txz included):"
for f in .whl/*.whl .peers/stage1/* .peers/stage2/*; do
    [ -e "$f" ] && printf '  %10d  %s\n' "$(stat -c %s "$f")" "$f"
done
sz() { du -cb "$@" 2>/dev/null | tail -1 | cut -f1; }
echo "  stage call carry [\".peers/stage1\"]: $(sz .peers/stage1) bytes + the tree"
echo "  run call carry [\".devbundle.txz\", \".whl\", \".peers/stage2\"," \
     "\"python/spanhead/_spanhead.abi3.so\"]: $(sz .devbundle.txz .whl .peers/stage2 \
     python/spanhead/_spanhead.abi3.so) bytes + the tree"
