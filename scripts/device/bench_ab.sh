#!/usr/bin/env bash
# bench_ab.sh - on the device machine, inside the carried bundle (scripts/device/bundle.sh):
# one `spanhead bench` argument list run once per variant, back to back in one call, so that
# kernel versions compare in the same run (the card is power-limited: only same-run ratios
# count). A variant is "default" or a comma-separated list of environment settings and extra
# bench options ("+name=value" adds "--name value"), e.g.
#   VARIANTS="default SPH_CUDA_STORE16=0 SPH_CUDA_ONEPASS=recompute" \
#   BENCH_ARGS="--shape A,E --N 16K --mode both" bash .devbundle/bench_ab.sh
# Knobs: VARIANTS, BENCH_ARGS (default: shapes A,B,D,E at 16K, dense and response 0.5, both
# modes), TIMEOUT (seconds per variant, default 150), TESTS="prog[:env,...] ..." (GPU test
# programs of the bundle to run first, each under its own settings, e.g.
# "gpu_test_bi_dhidden gpu_test_head_cuda:SPH_TEST_SKIP_HUGE=1"), TEST_TIMEOUT (120).
# Output: $OUT/bench_ab.tgz (machine.txt, steps.txt, tests/*.log, bench_<variant>.md/.jsonl);
# prints steps.txt and, per point, the ms of every variant side by side.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export SPH_COMMIT=$(cat COMMIT 2>/dev/null || echo unknown)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
R=$(mktemp -d)
mkdir -p "$R/tests"
{
  echo "commit $SPH_COMMIT"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  /usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1
} > "$R/machine.txt" 2>&1
status=0
for t in ${TESTS:-}; do
  prog=${t%%:*}
  envs=""
  [ "$prog" != "$t" ] && envs=$(echo "${t#*:}" | tr ',' ' ')
  name=$(echo "$t" | tr ':,=' '___')
  t0=$(date +%s)
  env $envs timeout "${TEST_TIMEOUT:-120}" "./bin/$prog" > "$R/tests/$name.log" 2>&1
  rc=$?
  echo "test $t rc=$rc $(( $(date +%s) - t0 )) s $(grep -E 'PASSED|FAILED|SKIP' "$R/tests/$name.log" | tail -1)" >> "$R/steps.txt"
  [ $rc -eq 0 ] || { status=1; tail -25 "$R/tests/$name.log"; }
done
args=${BENCH_ARGS:---shape A,B,D,E --N 16K --active 1,0.5 --mask response --mode both}
for v in ${VARIANTS:-default}; do
  n=$(echo "$v" | tr '=,+' '___')
  envs="" extra=""
  if [ "$v" != default ]; then
    for item in $(echo "$v" | tr ',' ' '); do
      case "$item" in
        +*) kv=${item#+}; extra="$extra --${kv%%=*} ${kv#*=}" ;;
        *) envs="$envs $item" ;;
      esac
    done
  fi
  t0=$(date +%s)
  env $envs timeout "${TIMEOUT:-150}" ./bin/spanhead bench $args $extra \
    --json "$R/bench_$n.jsonl" > "$R/bench_$n.md" 2>&1
  echo "bench $v rc=$? $(( $(date +%s) - t0 )) s" >> "$R/steps.txt"
done
tar czf "$OUT/bench_ab.tgz" -C "$R" .
cat "$R/steps.txt"
# side by side: one line per (shape, N, active, mask, mode), ms per variant
python3 - "$R" ${VARIANTS:-default} <<'EOF' || true
import json, sys, os
R, variants = sys.argv[1], sys.argv[2:]
rows, keys = {}, []
for v in variants:
    f = os.path.join(R, "bench_%s.jsonl" % v.replace("=", "_").replace(",", "_").replace("+", "_"))
    if not os.path.exists(f):
        continue
    for line in open(f):
        try:
            j = json.loads(line)
        except ValueError:
            continue
        k = (j["shape"], j["N"], j["active"], j["mask"], j["mode"])
        if k not in rows:
            rows[k] = {}
            keys.append(k)
        rows[k][v] = (j["ms"], j["ratio"], j.get("ratio_sustained"), j.get("path", "?"))
print("shape N active mask mode | " + " | ".join(variants))
for k in keys:
    cells = []
    for v in variants:
        r = rows[k].get(v)
        cells.append("-" if r is None else "%.2f ms %.3f/%.3f %s" % (r[0], r[1], r[2] or 0, r[3]))
    print("%s %d %.2f %s %s | %s" % (k[0], k[1], k[2], k[3], k[4], " | ".join(cells)))
EOF
exit $status
