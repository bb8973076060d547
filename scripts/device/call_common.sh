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
# extras_checks: the fused extras' standard checks (run 31 on, every call that changes them):
# the contract test and its memcheck, the TP program, the policy loss's CUDA test (the extras
# through the loss; from 2026-12-05 its metrics against the ones its written rows imply), the
# GPU pytest files of the extras, in parallel; then extras_report prints their verdicts
# (pytest's tail, memcheck's summary, any failing test program's lines).
extras_checks() {
  for t in $B/bin/gpu_test_head_cuda_contract $B/bin/gpu_test_head_cuda_tp \
           $B/bin/gpu_test_policy_cuda; do
    SPH_TEST_SKIP_HUGE=1 step "$(basename "$t")" $LIMIT "$t" &
  done
  step memcheck_contract $LIMIT /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
    --error-exitcode 9 "$B/bin/gpu_test_head_cuda_contract" &
  SPANHEAD_LIB=$B/lib/libspanhead.so.0 PYTHONPATH=$root/python SPANHEAD_CLI=$S \
    step pytest_gpu $LIMIT python3 -m pytest -rs -p no:cacheprovider --tb=short \
    python/tests/test_topk.py python/tests/test_policy_extras.py &
  wait
}
extras_report() {
  tail -3 "$R/pytest_gpu.log" 2>/dev/null
  grep -h "ERROR SUMMARY" "$R/memcheck_contract.log" 2>/dev/null
  for f in "$R"/gpu_test_*.log; do
    grep -q "FAILED\|status [1-9]" "$f" && { echo "== $(basename "$f")"; grep -m8 -iE "fail|status" "$f"; }
  done
}
# ncu_table <log> [substring...]: an Nsight Compute --csv log as one line per kernel and metric
# (kernel times in ms, other metrics as printed), only kernels whose name holds a substring
ncu_table() { python3 "$root/scripts/device/ncu_table.py" "$@"; }
# The fused top-k's A/B steps (run 34 call 2 on), each over SPH_TEST_TOPK_VARIANT values:
#   topk_ncu v...            Nsight kernel times and instructions of the A 16K general call
#                            with top-k 64 + sum_p2 (plain and top-k launches), ncu_v<v>.log
#   topk_bench MODE v...     bench rows at A, E 16K (response mask), bench_<MODE>_v<v>.*
#   topk_report v...         the ncu tables, then every bench log's rows
topk_ncu() {
  local v a="$S bench --shape A --N 16K --active 1 --mode general --repeats 1 --warmup 0"
  for v in "$@"; do
    SPH_TEST_TOPK_VARIANT=$v step ncu_v$v 120 /usr/local/cuda/bin/ncu --clock-control none \
      --metrics gpu__time_duration.sum,smsp__inst_executed.sum --csv $a --topk 64 --sum-p2
  done
}
topk_bench() {
  local mode=$1 v; shift
  for v in "$@"; do
    SPH_TEST_TOPK_VARIANT=$v step bench_${mode}_v$v 100 $S bench --shape A,E --N 16K --active 1 \
      --mask response --topk 64 --sum-p2 --mode $mode --json "$R/bench_${mode}_v$v.jsonl"
  done
}
topk_report() {
  local v f
  for v in "$@"; do
    echo "== variant $v"; ncu_table "$R/ncu_v$v.log" "2, 1>" topk_merge | tail -n 14
  done
  for f in "$R"/bench_*.log; do
    echo "== $(basename "$f")"
    grep -h "^|" "$f" | grep -v "^|---" | cut -d'|' -f2-9 | tail -n +2 | head -12
  done
}
