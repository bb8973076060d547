#!/usr/bin/env bash
# peers_run.sh - on the H200 (device tool), from the repository root: spanhead against QuACK,
# liger-kernel (Triton and CuTe DSL), and the other peers of bench/cuda/peers.py, in one
# process per mode, results packed into $OUT. Prepared here by scripts/device/peers_wheels.sh
# (fetches and packs the peers), scripts/device/bundle.sh (the CUDA library) and
# `make python/spanhead/_spanhead.abi3.so` (the binding's extension).
#
#   bash scripts/device/peers_run.sh stage
#       carry [".peers/stage1"] (47.5 MB; or name it in the carry list of the call before, and
#       start that call's command with this): unpacks the DSL's 193 MB compiler extension into
#       /tmp/peers/site-packages, outside the work tree, where it stays while the machine is
#       warm (30 s after a call ends). About 10 s. The run call must follow at once.
#   bash scripts/device/peers_run.sh run
#       carry [".devbundle.txz", ".whl", ".peers/stage2", "python/spanhead/_spanhead.abi3.so"]
#       (about 40 MB with the tree): unpacks the rest of the CuTe DSL peers there, installs
#       .whl, runs peers.py (--mode logprob, then --mode policy), packs everything into
#       $OUT/peers.tgz and copies the tables and plots next to it. Without stage 1 (a machine
#       that went cold between the calls) it stops at once with exit code 3 and says so
#       (PEERS_REQUIRE_CUTE=0: the CuTe peers are skipped with that reason and the others
#       still run).
#
# Parameters (environment; defaults in brackets):
#   PEERS_BUDGET_S [420]       seconds for both modes together (imports included); the policy
#                              mode gets PEERS_POLICY_SHARE [0.25] of it, 0 turns it off
#   PEERS_SHAPES [A,B,C,D,E]   PEERS_N [16384,65536]   PEERS_FRACTIONS [1.0,0.5,0.25]
#   PEERS_MASKS [response,packed-rl,fragmented]
#   PEERS_IMPLS [spanhead,spanhead-onepass,quack,quack-compact,liger-cute,liger-cute-compact,
#                liger-sum]   (add torch-eager,liger-none,cce,cce-exact,verl for the rest)
#   PEERS_ARGS []              more peers.py arguments for the logprob mode (e.g.
#                              --liger-cute-pad, --quack-tuned, --quack-scaled-exp off)
#   POLICY_SHAPES [A,D,E]  POLICY_N [16384]  POLICY_FRACTIONS [0.5]  POLICY_MASKS [response]
#   POLICY_IMPLS [spanhead+torch,spanhead-policy,spanhead-onepass,liger-grpo]
#   POLICY_ARGS []
#   PEERS_SITE [/tmp/peers/site-packages]   (the path must hold /site-packages/)
# Expected: install ~15 s, imports ~20-40 s per mode, then the grid until the budget; the
# command ends within PEERS_BUDGET_S + ~90 s (each mode is also killed by `timeout` at its
# budget + 45 s; peers.py writes its files after every point, so a killed run keeps them).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
SITE=${PEERS_SITE:-/tmp/peers/site-packages}
BIG=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
t0=$(date +%s)
el() { echo "$(($(date +%s) - t0)) s"; }

stage1_ok() { # the extension is there and intact
    [ -f "$SITE/$BIG" ] || return 1
    local want
    want=$(cut -d' ' -f1 "$1" 2>/dev/null) || return 1
    [ -n "$want" ] && [ "$(sha256sum "$SITE/$BIG" | cut -d' ' -f1)" = "$want" ]
}

case "${1:-}" in
stage)
    a=.peers/stage1/cutlass_ir.tar.xz
    [ -f "$a" ] || { echo "peers_run stage: $a missing (carry .peers/stage1)"; exit 1; }
    mkdir -p "$SITE"
    xz -dc "$a" | tar -x -C "$SITE" || { echo "peers_run stage: unpacking $a failed"; exit 1; }
    if stage1_ok .peers/stage1/cutlass_ir.sha256; then
        echo "peers_run stage: $SITE/$BIG unpacked and verified ($(el))"
    else
        echo "peers_run stage: $SITE/$BIG does not match its sha256"; exit 1
    fi
    exit 0 ;;
run) ;;
*)  echo "usage: peers_run.sh stage | run   (see the header)"; exit 2 ;;
esac

OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
R=$(mktemp -d)
LOG=$R/run.log
exec > >(tee "$LOG") 2>&1
echo "# peers_run $(date -u +%FT%TZ) tree $(git rev-parse --short HEAD 2>/dev/null || echo ?)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit \
    --format=csv,noheader

# the CuTe DSL peers: stage 2 now, stage 1 from the call before
mkdir -p "$SITE"
cute=1
if [ -f .peers/stage2/site.tar.xz ]; then
    xz -dc .peers/stage2/site.tar.xz | tar -x -C "$SITE" || cute=0
    grep -h '^pins:' .peers/stage2/MANIFEST 2>/dev/null | sed 's/^/# cute /'
else
    echo "# .peers/stage2 not carried: the CuTe DSL peers (quack, liger-cute) are skipped"
    cute=0
fi
if [ "$cute" = 1 ] && ! stage1_ok <(grep '^stage1_sha256:' .peers/stage2/MANIFEST |
                                    sed 's/^stage1_sha256: //'); then
    echo "# stage 1 missing or damaged in $SITE (the machine went cold after"
    echo "#   'peers_run.sh stage', or it was not run): quack and liger-cute will be skipped"
    rm -rf "$SITE/nvidia_cutlass_dsl"     # a clear 'not importable' instead of a broken DSL
    cute=0
    if [ "${PEERS_REQUIRE_CUTE:-1}" = 1 ]; then
        echo "# stopping (PEERS_REQUIRE_CUTE=1): run 'peers_run.sh stage' and this call again,"
        echo "#   back to back; PEERS_REQUIRE_CUTE=0 runs the other peers anyway"
        exit 3
    fi
fi
# the Triton peers (and liger-kernel, whose CuTe kernel imports the DSL above)
if compgen -G ".whl/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl 2>&1 | grep -v "Running pip as the 'root' user" || true
else
    echo "# .whl not carried: liger-kernel, cut-cross-entropy and verl are skipped"
fi
# spanhead: the CUDA bundle (scripts/device/bundle.sh), else a build/ tree
B=$root/.devbundle
if [ ! -d "$B/lib" ] && [ -f .devbundle.txz ]; then
    mkdir -p "$B" && tar xJf .devbundle.txz -C "$B"
fi
if [ -z "${SPANHEAD_LIB:-}" ]; then
    if [ -e "$B/lib/libspanhead.so.0" ]; then
        export SPANHEAD_LIB=$B/lib/libspanhead.so.0
    elif [ -e build/libspanhead.so ]; then
        export SPANHEAD_LIB=$root/build/libspanhead.so
    fi
fi
[ -d "$B/lib" ] && export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -f "$B/COMMIT" ] && export SPH_COMMIT=${SPH_COMMIT:-$(cat "$B/COMMIT")}
echo "# spanhead library: ${SPANHEAD_LIB:-none}; extension:" \
     "$(ls python/spanhead/_spanhead*.so 2>/dev/null || echo 'missing (carry it)')"
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:$root/python${PYTHONPATH:+:$PYTHONPATH}
export QUACK_CACHE_DIR=${QUACK_CACHE_DIR:-/tmp/peers/quack-cache}
mkdir -p "$QUACK_CACHE_DIR"
echo "# installed ($(el)); versions:"
timeout 120 "$py" - <<'EOF' 2>&1 | sed 's/^/#   /'
import importlib, sys
from importlib import metadata
print("python", sys.version.split()[0])
for d in ("torch", "triton", "cuda-bindings", "typing-extensions", "protobuf", "einops",
          "nvidia-cutlass-dsl", "quack-kernels", "apache-tvm-ffi", "liger-kernel",
          "cut-cross-entropy", "verl"):
    try:
        print(d, metadata.version(d))
    except Exception as e:  # noqa: BLE001
        print(d, "absent")
EOF

budget=${PEERS_BUDGET_S:-420}
share=${PEERS_POLICY_SHARE:-0.25}
pol=$(awk -v b="$budget" -v s="$share" 'BEGIN { printf "%d", b * s }')
lp=$((budget - pol))
impls=${PEERS_IMPLS:-spanhead,spanhead-onepass,quack,quack-compact,liger-cute,liger-cute-compact,liger-sum}
[ "$cute" = 1 ] || echo "# (the CuTe peers in PEERS_IMPLS get 'not importable' rows)"
echo "# logprob mode: budget $lp s ($(el))"
# shellcheck disable=SC2086
timeout -s INT -k 20 $((lp + 45)) "$py" bench/cuda/peers.py --budget-s "$lp" \
    --shapes "${PEERS_SHAPES:-A,B,C,D,E}" --N "${PEERS_N:-16384,65536}" \
    --fractions "${PEERS_FRACTIONS:-1.0,0.5,0.25}" \
    --masks "${PEERS_MASKS:-response,packed-rl,fragmented}" --impls "$impls" \
    --out "$R/logprob" ${PEERS_ARGS:-}
echo "# logprob mode rc=$? ($(el))"
if [ "$pol" -gt 0 ]; then
    echo "# policy mode: budget $pol s"
    # shellcheck disable=SC2086
    timeout -s INT -k 20 $((pol + 45)) "$py" bench/cuda/peers.py --mode policy --budget-s "$pol" \
        --shapes "${POLICY_SHAPES:-A,D,E}" --N "${POLICY_N:-16384}" \
        --fractions "${POLICY_FRACTIONS:-0.5}" --masks "${POLICY_MASKS:-response}" \
        --impls "${POLICY_IMPLS:-spanhead+torch,spanhead-policy,spanhead-onepass,liger-grpo}" \
        --out "$R/policy" ${POLICY_ARGS:-}
    echo "# policy mode rc=$? ($(el))"
fi
# at most 8 files come back: the tarball, the tables and plots, the log
for m in logprob policy; do
    for f in peers.md peers.png; do
        [ -f "$R/$m/$f" ] && cp "$R/$m/$f" "$OUT/${m}_$f"
    done
done
tar czf "$OUT/peers.tgz" -C "$R" . && echo "# packed $OUT/peers.tgz ($(el))"
# the tails of both runs' final tables, last, where the device tool's 12,000 characters are
for m in logprob policy; do
    [ -f "$R/$m/peers.log" ] && sed -n '/^# final/,$p' "$R/$m/peers.log"
done
exit 0
