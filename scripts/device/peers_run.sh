#!/usr/bin/env bash
# peers_run.sh - on the GPU machine, from the repository root: spanhead and its peers side by
# side (bench/cuda/peers.py; bench/cuda/README-peers.md says what it measures and why the
# CuTe DSL peers travel in two calls). Prepared here by scripts/device/peers_wheels.sh (the
# peers: .whl/ and .peers/), scripts/device/bundle.sh (the CUDA library; or a CUDA build in
# build/) and `make python/spanhead/_spanhead.abi3.so`.
#
#   bash scripts/device/peers_run.sh stage
#       carry [".peers/stage1"] (47.5 MB; or add it to the carry list of the call just before
#       and start that call's command with this): unpacks the CuTe DSL's 193 MB compiler
#       extension into /tmp/peers/site-packages, outside the work tree, where it stays while
#       the machine is warm (30 s after a call returns). ~10 s. The run call must follow at
#       once.
#   bash scripts/device/peers_run.sh run
#       carry [".devbundle.txz", ".whl", ".peers/stage2", "python/spanhead/_spanhead.abi3.so"]
#       (~26 MB with the tree, plus the bundle): unpacks the rest of the CuTe DSL peers
#       (QuACK, the DSL, tvm-ffi) there, installs .whl (liger-kernel, cut-cross-entropy,
#       verl), runs peers.py --mode logprob then --mode policy, packs everything into
#       $OUT/peers.tgz and copies the tables and plots next to it; its output ends with both
#       final tables. Without stage 1 (the machine went cold between the calls) it stops at
#       once with exit code 3 (PEERS_REQUIRE_CUTE=0: the CuTe peers are skipped with that
#       reason and the others run).
#   bash scripts/device/peers_run.sh [peers.py options]
#       one peers.py run into $OUT/peers (peers.md, .jsonl, .png, .log) with PEERS_BUDGET
#       (default 200) as --budget-s, the options passed as they are; carry [".devbundle.txz",
#       ".whl", "python/spanhead/_spanhead.abi3.so"] (+ ".peers/stage2" after a stage call for
#       the CuTe peers). check_all.sh's peers step.
#
# Parameters of `run` (environment; defaults in brackets):
#   PEERS_BUDGET_S [420]       seconds for both modes together (imports included); the policy
#                              mode gets PEERS_POLICY_SHARE [0.25] of it, 0 turns it off
#   PEERS_SHAPES [A,B,C,D,E]   PEERS_N [16384,65536]   PEERS_FRACTIONS [1.0,0.5,0.25]
#   PEERS_MASKS [response,packed-rl,fragmented]
#   PEERS_IMPLS [spanhead,spanhead-onepass,quack,quack-compact,liger-cute,liger-cute-compact,
#                liger-sum]   (add torch-eager,liger-none,cce,cce-exact,verl for the rest)
#   PEERS_ARGS []              more peers.py arguments for the logprob mode (e.g.
#                              --liger-cute-pad, --quack-tuned, --quack-scaled-exp off)
#   POLICY_SHAPES [A,D,E]  POLICY_N [16384]  POLICY_FRACTIONS [0.5]  POLICY_MASKS [response]
#   POLICY_IMPLS [spanhead+torch,spanhead-policy,spanhead-onepass,liger-grpo]  POLICY_ARGS []
#   PEERS_SITE [/tmp/peers/site-packages]   (the path must hold /site-packages/: QuACK's
#                              compile-cache key treats only such files as installed code)
# `run` ends within PEERS_BUDGET_S + ~90 s: install ~15 s, then each mode (imports ~20-40 s
# inside its budget) is stopped by SIGINT at its budget + 45 s (peers.py writes its files
# after every point and on SIGINT), then packing.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
SITE=${PEERS_SITE:-/tmp/peers/site-packages}
BIG=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
py=${PYTHON:-python3}
t0=$(date +%s)
el() { echo "$(($(date +%s) - t0)) s"; }

stage1_ok() { # $1: a file whose first word is the extension's sha256
    [ -f "$SITE/$BIG" ] || return 1
    local want
    want=$(cut -d' ' -f1 "$1" 2>/dev/null)
    [ -n "$want" ] && [ "$(sha256sum "$SITE/$BIG" | cut -d' ' -f1)" = "$want" ]
}

if [ "${1:-}" = stage ]; then
    a=.peers/stage1/cutlass_ir.tar.xz
    [ -f "$a" ] || { echo "peers_run stage: $a missing (carry .peers/stage1)"; exit 1; }
    mkdir -p "$SITE"
    xz -dc "$a" | tar -x -C "$SITE" || { echo "peers_run stage: unpacking $a failed"; exit 1; }
    stage1_ok .peers/stage1/cutlass_ir.sha256 ||
        { echo "peers_run stage: $SITE/$BIG does not match its sha256"; exit 1; }
    echo "peers_run stage: $SITE/$BIG unpacked and verified ($(el))"
    exit 0
fi
full=0
if [ "${1:-}" = run ]; then
    full=1
    shift
fi

OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# the library: $SPANHEAD_LIB, else the bundle's (unpacked from .devbundle.txz when needed),
# else build/libspanhead.so; and the binding's extension
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
commit=$(cat "$B/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
export SPANHEAD_LIB=$lib SPH_COMMIT=${SPH_COMMIT:-$commit}

R=$OUT/peers
if [ "$full" = 1 ]; then
    R=$(mktemp -d)
    exec > >(tee "$R/run.log") 2>&1
fi
echo "# peers_run $(date -u +%FT%TZ), library $SPANHEAD_LIB, commit $SPH_COMMIT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit \
    --format=csv,noheader

# the CuTe DSL peers: stage 2 from this call, stage 1 from the call before
mkdir -p "$SITE"
cute=0
if [ -f .peers/stage2/site.tar.xz ]; then
    grep -h '^pins:' .peers/stage2/MANIFEST 2>/dev/null | sed 's/^/# cute /'
    if stage1_ok <(sed -n 's/^stage1_sha256: //p' .peers/stage2/MANIFEST); then
        xz -dc .peers/stage2/site.tar.xz | tar -x -C "$SITE" && cute=1
    else
        echo "# stage 1 missing or damaged in $SITE (the machine went cold after"
        echo "#   'peers_run.sh stage', or it was not run): quack and liger-cute are skipped"
        rm -rf "${SITE:?}/nvidia_cutlass_dsl"   # 'not importable', not a half-installed DSL
        if [ "$full" = 1 ] && [ "${PEERS_REQUIRE_CUTE:-1}" = 1 ]; then
            echo "# stopping (PEERS_REQUIRE_CUTE=1): run 'peers_run.sh stage' and this call"
            echo "#   again, back to back; PEERS_REQUIRE_CUTE=0 runs the other peers anyway"
            exit 3
        fi
    fi
elif [ "$full" = 1 ]; then
    echo "# .peers/stage2 not carried: the CuTe DSL peers (quack, liger-cute) are skipped"
fi
# the Triton peers (and liger-kernel, whose CuTe kernel imports the DSL above)
"$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl 2>&1 | grep -v "Running pip as the 'root' user"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "peers_run: installing the wheels failed"; exit 1; }
PYTHONPATH=$SITE:$root/python${PYTHONPATH:+:$PYTHONPATH}
[ "$cute" = 1 ] && PYTHONPATH=$SITE/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
export PYTHONPATH
export QUACK_CACHE_DIR=${QUACK_CACHE_DIR:-/tmp/peers/quack-cache}
mkdir -p "$QUACK_CACHE_DIR"
echo "# installed ($(el)); versions:"
timeout 120 "$py" - <<'EOF' 2>&1 | sed 's/^/#   /'
import sys
from importlib import metadata
print("python", sys.version.split()[0])
for d in ("torch", "triton", "cuda-bindings", "typing-extensions", "protobuf", "einops",
          "nvidia-cutlass-dsl", "quack-kernels", "apache-tvm-ffi", "liger-kernel",
          "cut-cross-entropy", "verl"):
    try:
        print(d, metadata.version(d))
    except Exception:  # noqa: BLE001
        print(d, "absent")
EOF

if [ "$full" = 0 ]; then    # one peers.py run, the options as given
    "$py" bench/cuda/peers.py --budget-s "${PEERS_BUDGET:-200}" --out "$R" "$@"
    exit $?
fi

budget=${PEERS_BUDGET_S:-420}
pol=$(awk -v b="$budget" -v s="${PEERS_POLICY_SHARE:-0.25}" 'BEGIN { printf "%d", b * s }')
lp=$((budget - pol))
echo "# logprob mode: budget $lp s ($(el))"
# shellcheck disable=SC2086
timeout -s INT -k 20 $((lp + 45)) "$py" bench/cuda/peers.py --budget-s "$lp" \
    --shapes "${PEERS_SHAPES:-A,B,C,D,E}" --N "${PEERS_N:-16384,65536}" \
    --fractions "${PEERS_FRACTIONS:-1.0,0.5,0.25}" \
    --masks "${PEERS_MASKS:-response,packed-rl,fragmented}" \
    --impls "${PEERS_IMPLS:-spanhead,spanhead-onepass,quack,quack-compact,liger-cute,liger-cute-compact,liger-sum}" \
    --out "$R/logprob" ${PEERS_ARGS:-}
echo "# logprob mode rc=$? ($(el))"
if [ "$pol" -gt 0 ]; then
    echo "# policy mode: budget $pol s"
    # shellcheck disable=SC2086
    timeout -s INT -k 20 $((pol + 45)) "$py" bench/cuda/peers.py --mode policy \
        --budget-s "$pol" --shapes "${POLICY_SHAPES:-A,D,E}" --N "${POLICY_N:-16384}" \
        --fractions "${POLICY_FRACTIONS:-0.5}" --masks "${POLICY_MASKS:-response}" \
        --impls "${POLICY_IMPLS:-spanhead+torch,spanhead-policy,spanhead-onepass,liger-grpo}" \
        --out "$R/policy" ${POLICY_ARGS:-}
    echo "# policy mode rc=$? ($(el))"
fi
# at most 8 files come back: the tarball, the tables and plots
for m in logprob policy; do
    for f in peers.md peers.png; do
        [ -f "$R/$m/$f" ] && cp "$R/$m/$f" "$OUT/${m}_$f"
    done
done
tar czf "$OUT/peers.tgz" -C "$R" . && echo "# packed $OUT/peers.tgz ($(el))"
# both final tables last, inside the device tool's 12,000 characters of output
for m in logprob policy; do
    [ -f "$R/$m/peers.log" ] && sed -n '/^# final/,$p' "$R/$m/peers.log"
done
exit 0
