#!/usr/bin/env bash
# issue23.sh - on the device machine, inside the carried bundle (scripts/device/bundle.sh): issue
# 23's kernel versions checked and timed in one call of at most ~520 s:
#   1. correctness first: gpu_test_head_cuda's test_issue23 (each new switch forced on against
#      the float64 reference, and its path checked taken), then test_pingpong,test_fused with
#      SPH_CUDA_DHSPLITK=1 (test_pingpong's 1100 x 264 x 7000 case takes 3 dH pieces, under both
#      schedules) and the policy-loss tests under each switch;
#   2. a same-run A/B (spanhead bench, back to back): the default at shapes A,B,D,E x N 1K,4K,
#      16K x active 1, 0.25 (response mask) x general and one-pass, then each switch at the
#      points its rule touches (E2CHUNK: D,E 16K one-pass; E2DOVL: A,B,D,E 16K one-pass;
#      DHSPLITK: A,B,D,E 1K both modes), with the default again at the same points right
#      before each, so every comparison is adjacent in time;
#   3. Nsight Compute per-kernel times (ncu --clock-control none) of the worst one-pass point
#      at 16K (highest ratio in step 2's default) and of E 1K one-pass.
# Every step has its own limit, cut to what is left of LIMIT (default 520 s); a step that
# cannot get 15 s is skipped (said in steps.txt). Output: $OUT/issue23.tgz (machine.txt,
# steps.txt, tests/*.log, bench_*.md/.jsonl, ab.md, ncu_*.csv/.md) and, printed, steps.txt,
# ab.md and the ncu tables.
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
LIMIT=${LIMIT:-520}
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
run test_issue23 100 "$R/tests/issue23.log" SPH_TEST_SKIP_HUGE=1 SPH_GPU_TESTS=test_issue23 \
  -- "$T" || status=1
run test_dhsplitk_suite 60 "$R/tests/dhsplitk_suite.log" SPH_TEST_SKIP_HUGE=1 \
  SPH_GPU_TESTS=test_pingpong,test_fused SPH_CUDA_DHSPLITK=1 -- "$T" || status=1
for sw in SPH_CUDA_DHSPLITK=1 SPH_CUDA_E2CHUNK=1 SPH_CUDA_E2DOVL=1; do
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
bench grid 150 -- --shape A,B,D,E --N 1K,4K,16K --mode both $B
bench e2chunk_default 30 -- --shape D,E --N 16K --mode one-pass $B
bench e2chunk 30 SPH_CUDA_E2CHUNK=1 -- --shape D,E --N 16K --mode one-pass $B
bench e2dovl_default 45 -- --shape A,B,D,E --N 16K --mode one-pass $B
bench e2dovl 45 SPH_CUDA_E2DOVL=1 -- --shape A,B,D,E --N 16K --mode one-pass $B
bench dhsplitk_default 30 -- --shape A,B,D,E --N 1K --mode both $B
bench dhsplitk 30 SPH_CUDA_DHSPLITK=1 -- --shape A,B,D,E --N 1K --mode both $B
# side by side (ab.md): each switch against the default run just before it
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
g = load("grid")
print("## default grid (ratio: / burst 8 or 6 N_active H V floor; first call: cold, ms)\n")
print("| shape | N | active | mask | mode | ms | ratio | sustained | first call ms | extra MiB | path |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for k, j in g.items():
    print("| %s | %d | %.2f | %s | %s | %.3f | %.3f | %.3f | %.1f | %.0f | %s |" % (
        k + (j["ms"], j["ratio"], j["ratio_sustained"], j.get("first_call_ms", -1),
             j["peak_extra_bytes"] / 2**20, j.get("path", "?"))))
for sw in ("e2chunk", "e2dovl", "dhsplitk"):
    a, b = load(sw + "_default"), load(sw)
    print("\n## %s against the default just before it\n" % sw)
    print("| shape | N | active | mask | mode | default ms | %s ms | change | default MiB | %s MiB |" % (sw, sw))
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k in a:
        if k not in b:
            continue
        x, y = a[k]["ms"], b[k]["ms"]
        print("| %s | %d | %.2f | %s | %s | %.3f | %.3f | %+.1f %% | %.0f | %.0f |" % (
            k + (x, y, 100 * (y / x - 1), a[k]["peak_extra_bytes"] / 2**20,
                 b[k]["peak_extra_bytes"] / 2**20)))
# the worst one-pass point at 16K of the default grid, for step 3
worst = max((j["ratio"], k) for k, j in g.items() if k[4] == "one-pass" and k[1] == 16384) \
    if any(k[4] == "one-pass" and k[1] == 16384 for k in g) else None
open(os.path.join(R, "worst.txt"), "w").write("%s\n" % (worst[1][0] if worst else "E"))
EOF

# ---- 3. Nsight Compute per-kernel breakdown --------------------------------------------------
ncu_point() { # ncu_point SHAPE N: one-pass, dense + response 1.0, one timed repeat
  local shape=$1 n=$2 csv="$R/ncu_${1}_onepass_${2}.csv"
  run "ncu_${shape}_${n}" 90 "$csv" -- ncu --clock-control none \
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
worst=$(cat "$R/worst.txt" 2>/dev/null || echo E)
case "$worst" in A|B|C|D|E) ;; *) worst=E ;; esac
ncu_point "$worst" 16K
ncu_point E 1K

tar czf "$OUT/issue23.tgz" -C "$R" .
cat "$R/steps.txt"
cat "$R/ab.md" 2>/dev/null
for f in "$R"/ncu_*.md; do [ -f "$f" ] && cat "$f"; done
for f in "$R"/tests/*.log; do
  grep -q "FAILED" "$f" 2>/dev/null && { echo "== $f"; tail -30 "$f"; }
done
exit $status
