# call_common.sh - sourced by the device call scripts under bench/results/ (run 31 on): the
# bundle unpacked (.devbundle.txz, carried), the environment (NCCL without NVLink multicast,
# the bundle's libraries), $R (the call's scratch folder, tarred into $OUT at the end by the
# caller), $S (the CLI), machine.txt (commit, GPU, driver, CUDA) and step, which runs one
# command under a timeout into $R/<name>.log and appends its verdict to $R/steps.txt:
#   step <name> <timeout s> <command...>     (PASS, FAIL, SKIP: exit 77, TIMEOUT)
# Expects root (the repository root) set and the working directory there.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
B=$root/.devbundle
[ -d "$B/bin" ] || { mkdir -p "$B" && tar xJf "$root/.devbundle.txz" -C "$B"; } || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$(mktemp -d)
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
S=$B/bin/spanhead
LIMIT=${LIMIT:-200}
t0=$(date +%s)
{ echo "commit $(cat "$B/COMMIT")"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  /usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1; } > "$R/machine.txt" 2>&1
step() { # name timeout cmd...
  local name=$1 to=$2 s=$(date +%s); shift 2
  timeout -s INT -k 10 "$to" "$@" > "$R/$name.log" 2>&1
  local rc=$? v=PASS
  [ $rc -eq 77 ] && v=SKIP
  [ $rc -eq 124 ] && v=TIMEOUT
  [ $rc -ne 0 ] && [ $rc -ne 77 ] && [ $rc -ne 124 ] && v=FAIL
  echo "$v $name rc=$rc $(( $(date +%s) - s )) s (t=$(( $(date +%s) - t0 )))" >> "$R/steps.txt"
}
