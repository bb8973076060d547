#!/usr/bin/env bash
# issue23.sh - on the device machine, inside the carried bundle (scripts/device/bundle.sh): issue
# 23's second device call (after run 25), at most ~LIMIT s (default 290):
#   1. correctness, bounded: gpu_test_head_cuda's test_issue23 (E_TWO_CHUNKS now declined with
#      accumulate, DW32_BETA0 on NaN-poisoned workspaces, DH_SPLITK, E2D_OVERLAP; each forced
#      on, its path checked taken; ~15 s of host reference), test_sweep under
#      SPH_CUDA_DW32BZ=1 (the row-outer sweep's fp32 dW accumulator over several chunks), the
#      policy-loss tests under SPH_CUDA_DW32BZ=1 and SPH_CUDA_E2CHUNK=1;
#   2. a same-run A/B (spanhead bench, back to back) of DW32_BETA0 (SPH_CUDA_DW32BZ=1): D, E
#      16K one-pass (the points with the fp32 dW accumulator), then A, B x 1K, 4K, 16K x both
#      modes (a control: one chunk or vocabulary-outer there, predicted unchanged), the default
#      run right before each;
#   3. bench/cuda/torch_overhead.py (B 1K 0.25, A 1K 1.0: the torch path's per-call time against
#      the plain binding, with torch.profiler tables); needs the tree's python/, the carried
#      python/spanhead/_spanhead.abi3.so and torch (python3, or PYTHON=...);
#   4. Nsight Compute per-kernel times (ncu --clock-control none) of A one-pass 1K.
# Every step has its own limit, cut to what is left of LIMIT; a step that cannot get 15 s is
# skipped (said in steps.txt). Output: $OUT/issue23.tgz (machine.txt, steps.txt, tests/*.log,
# bench_*.md/.jsonl, ab.md, torch_overhead.md/.log, ncu_*.csv/.md) and, printed, steps.txt,
# ab.md, torch_overhead.md and the ncu table.
# DRY=1: print the commands instead of running them (every step "runs" in 0 s), for checking
# the script's logic on a machine without a GPU:  DRY=1 OUT=/tmp/x bash scripts/device/issue23.sh
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
export SPH_COMMIT=$(cat COMMIT 2>/dev/null || echo unknown)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
R=$(mktemp -d)
mkdir -p "$R/tests"
LIMIT=${LIMIT:-290}
START=$(date +%s)
status=0
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
# run NAME LIMIT_S LOGFILE ENV... -- CMD...: one step, its limit cut to the time left
run() {
  local name=$1 lim=$2 log=$3; shift 3
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local l; l=$(left)
  [ "$lim" -gt $(( l - 5 )) ] && lim=$(( l - 5 ))
  if [ "$lim" -lt 15 ]; then
    echo "SKIP $name: $l s left" >> "$R/steps.txt"
    return 0
  fi
  local t0; t0=$(date +%s)
  if [ -n "${DRY:-}" ]; then
    echo "[dry] env ${envs[*]} timeout $lim $* > $log" >> "$R/steps.txt"
    : > "$log"
    return 0
  fi
  env "${envs[@]}" timeout "$lim" "$@" > "$log" 2>&1
  local rc=$?
  local tail_line=""
  case "$name" in test*) tail_line=$(grep -E 'PASSED|FAILED|SKIP' "$log" | tail -1) ;; esac
  echo "$name rc=$rc $(( $(date +%s) - t0 )) s (t=$(( $(date +%s) - START ))) $tail_line" >> "$R/steps.txt"
  return $rc
}
{
  echo "commit $SPH_COMMIT"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  nvcc --version 2>/dev/null | tail -1
} > "$R/machine.txt" 2>&1

# ---- 1. correctness ------------------------------------------------------------------------
T=./bin/gpu_test_head_cuda
run test_issue23 60 "$R/tests/issue23.log" SPH_TEST_SKIP_HUGE=1 SPH_GPU_TESTS=test_issue23 \
  -- "$T" || status=1
run test_sweep_dw32bz 45 "$R/tests/sweep_dw32bz.log" SPH_TEST_SKIP_HUGE=1 \
  SPH_GPU_TESTS=test_sweep SPH_CUDA_DW32BZ=1 -- "$T" || status=1
for sw in SPH_CUDA_DW32BZ=1 SPH_CUDA_E2CHUNK=1; do
  run "test_policies_${sw%%=*}" 20 "$R/tests/policies_${sw%%=*}.log" "$sw" \
    -- ./bin/gpu_test_head_cuda_policies || status=1
done

# ---- 2. same-run A/B -----------------------------------------------------------------------
B="--repeats 3 --warmup 1 --mask response --active 1,0.25"
bench() { # bench NAME LIMIT ENV... -- ARGS...
  local name=$1 lim=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  run "bench_$name" "$lim" "$R/bench_$name.md" "${envs[@]}" -- \
    ./bin/spanhead bench "$@" --json "$R/bench_$name.jsonl"
}
bench dw32bz_de_default 25 -- --shape D,E --N 16K --mode one-pass $B
bench dw32bz_de 25 SPH_CUDA_DW32BZ=1 -- --shape D,E --N 16K --mode one-pass $B
bench dw32bz_ab_default 30 -- --shape A,B --N 1K,4K,16K --mode both $B
bench dw32bz_ab 30 SPH_CUDA_DW32BZ=1 -- --shape A,B --N 1K,4K,16K --mode both $B
# side by side (ab.md): the switch against the default run just before it
python3 - "$R" > "$R/ab.md" 2>&1 <<'EOF' || true
import json, os, sys
R = sys.argv[1]
def load(n):
    f = os.path.join(R, "bench_%s.jsonl" % n)
    out = {}
    if os.path.exists(f):
        for line in open(f):
            try:
                j = json.loads(line)
            except ValueError:
                continue
            out[(j["shape"], j["N"], j["active"], j["mask"], j["mode"])] = j
    return out
for sw in ("dw32bz_de", "dw32bz_ab"):
    a, b = load(sw + "_default"), load(sw)
    print("\n## %s: SPH_CUDA_DW32BZ=1 against the default just before it (ratio: to the 6 / 8 "
          "N_active H V burst floor; first call: cold, ms)\n" % sw)
    print("| shape | N | active | mask | mode | default ms | switch ms | change | ratio | "
          "default MiB | switch MiB | first call ms | path |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for k in a:
        if k not in b:
            continue
        x, y = a[k]["ms"], b[k]["ms"]
        print("| %s | %d | %.2f | %s | %s | %.3f | %.3f | %+.1f %% | %.3f | %.0f | %.0f | %.1f | %s |"
              % (k + (x, y, 100 * (y / x - 1), a[k]["ratio"], a[k]["peak_extra_bytes"] / 2**20,
                      b[k]["peak_extra_bytes"] / 2**20, a[k].get("first_call_ms", -1),
                      a[k].get("path", "?"))))
EOF

# ---- 3. the torch path's per-call overhead ---------------------------------------------------
PY=${PYTHON:-python3}
run torch_overhead 75 "$R/torch_overhead.log" PYTHONPATH="$PWD/../python" \
  SPANHEAD_LIB="$PWD/lib/libspanhead.so.0" OUT="$R" -- \
  "$PY" ../bench/cuda/torch_overhead.py --out "$R/torch_overhead.md" || status=1

# ---- 4. Nsight Compute per-kernel breakdown --------------------------------------------------
ncu_point() { # ncu_point SHAPE N: one-pass, dense + response 1.0, one timed repeat
  local shape=$1 n=$2 csv="$R/ncu_${1}_onepass_${2}.csv"
  run "ncu_${shape}_${n}" 60 "$csv" -- ncu --clock-control none \
    --metrics gpu__time_duration.sum --csv ./bin/spanhead bench --shape "$shape" --N "$n" \
    --active 1 --mask response --mode one-pass --repeats 1 --warmup 0 || return 0
  [ -n "${DRY:-}" ] && return 0
  python3 - "$csv" "$shape" "$n" > "${csv%.csv}.md" 2>&1 <<'PY' || true
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]
ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}
agg = collections.OrderedDict()
for r in rows[1:]:
    a = agg.setdefault(r[ki][:80], [0, 0.0])
    a[0] += 1
    a[1] += float(r[vi].replace(",", "")) * scale.get(r[ui], 1e-6)
# two bench points (dense, response 1.0), each a cold first call + one timed repeat: 4 passes;
# the rate measurement's kernels (tune_fill, the TNT product) come once per (shape, N)
print(f"## {sys.argv[2]} one-pass N={sys.argv[3]}: GPU time per kernel, per pass (/ 4)")
print("| launches | ms | kernel |\n|---|---|---|")
tot = 0.0
for k, (n, t) in agg.items():
    print(f"| {n / 4:g} | {t / 4:.3f} | `{k}` |")
    tot += t / 4
print(f"| | {tot:.3f} | total (the rate kernels included) |")
PY
}
ncu_point A 1K

tar czf "$OUT/issue23.tgz" -C "$R" .
cat "$R/steps.txt"
cat "$R/ab.md" 2>/dev/null
cat "$R/torch_overhead.md" 2>/dev/null || tail -20 "$R/torch_overhead.log" 2>/dev/null
for f in "$R"/ncu_*.md; do [ -f "$f" ] && cat "$f"; done
for f in "$R"/tests/*.log; do
  grep -q "FAILED" "$f" 2>/dev/null && { echo "== $f"; tail -30 "$f"; }
done
exit $status
