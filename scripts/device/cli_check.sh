#!/usr/bin/env bash
# cli_check.sh - the CLI's GPU paths in one device call (issues 17 and 18, CLI side), from the
# tree with the bundle: run --device cuda --check --json (one JSON object, the check passed),
# a forward-only run from .npy inputs without upstream gradients (the check says what was not
# computed, no gradient files), the all-or-nothing --outputs (a link to /dev/full and a failed
# --check leave the directory as it was), NaN in hidden.npy refused, a clean table from
# `spanhead bench --device cuda` with --plot (matplotlib is on the GPU machine) and its JSON,
# and `spanhead tune` with progress off. One PASS/FAIL line per step, then a summary; every
# log lands in $OUT/cli_check.tgz.
#   here:   scripts/device/bundle.sh
#   device: bash scripts/device/cli_check.sh     carry [".devbundle.txz"]
#   BENCH_ARGS (default "--shape A --N 16K --mode general --repeats 3") sets the bench step.
set -u
export NCCL_NVLS_ENABLE=0
root=$(cd "$(dirname "$0")/../.." && pwd)
B=$root/.devbundle
[ -d "$B/bin" ] || { mkdir -p "$B" && tar xJf "$root/.devbundle.txz" -C "$B"; } || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
res=$(mktemp -d)
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export SPH_COMMIT=$(cat "$B/COMMIT" 2>/dev/null || echo unknown)
export SPH_PLOT_SCRIPT=$root/bench/plot_bench.py
cli=$B/bin/spanhead
fails=0
# step NAME TIMEOUT CHECK cmd...: runs cmd (output in $res/NAME.txt), then the shell test CHECK
step() {
    local name=$1 to=$2 check=$3 t0=$(date +%s)
    shift 3
    timeout "$to" "$@" >"$res/$name.out" 2>"$res/$name.err"
    local rc=$?
    if (eval "$check") >>"$res/$name.err" 2>&1; then
        echo "PASS $name (exit $rc, $(($(date +%s) - t0)) s)" | tee -a "$res/steps.txt"
    else
        echo "FAIL $name (exit $rc, $(($(date +%s) - t0)) s): $(tail -3 "$res/$name.err" | tr '\n' ' ')" |
            tee -a "$res/steps.txt"
        fails=$((fails + 1))
    fi
}
cd "$root"
nvidia-smi -L >"$res/machine.txt" 2>&1
echo "commit $SPH_COMMIT" >>"$res/machine.txt"

step run_json 120 '[ $rc = 0 ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
assert d[\"check\"][\"passed\"] and d[\"backward\"] and d[\"context\"].startswith(\"cuda\"), d" "$res/run_json.out"' \
    "$cli" run --device cuda --check --json
step run_bf16_json 120 '[ $rc = 0 ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
assert d[\"check\"][\"passed\"] and d[\"dtype\"] == \"bf16\", d" "$res/run_bf16_json.out"' \
    "$cli" run --device cuda --dtype bf16 --entropy --check --json

# .npy inputs: forward only (no upstream gradient), NaN refused, all-or-nothing outputs
python3 - "$res" <<'PY'
import os, sys
import numpy as np
d = sys.argv[1]
r = np.random.default_rng(4)
def make(name, scale=1.0, grads=False, nan=False):
    p = f"{d}/{name}"
    os.makedirs(p)
    h = (r.standard_normal((300, 128)) * scale).astype(np.float32)
    if nan:
        h[7, 3] = np.nan
    np.save(f"{p}/hidden.npy", h)
    np.save(f"{p}/weight.npy", r.standard_normal((2000, 128)).astype(np.float32) * 0.1)
    np.save(f"{p}/targets.npy", r.integers(0, 2000, 300).astype(np.int64))
    if grads:
        np.save(f"{p}/dlogprob.npy", r.standard_normal(300).astype(np.float32))
        np.save(f"{p}/dentropy.npy", r.standard_normal(300).astype(np.float32))
make("fwd")
make("nan", nan=True)
make("ill", scale=1000.0, grads=True)  # f32 entropy misses the float64 reference: --check fails
make("good", grads=True)
PY
step forward_only 120 '[ $rc = 0 ] && grep -q "not computed, not checked: entropy, dhidden, dweight" "$res/forward_only.out" \
&& [ -f "$res/fo/logprob.npy" ] && [ ! -e "$res/fo/dhidden.npy" ]' \
    "$cli" run --device cuda --inputs "$res/fwd" --check --outputs "$res/fo"
step nan_refused 60 '[ $rc = 1 ] && grep -q "hidden.npy: non-finite value nan at \[7, 3\]" "$res/nan_refused.err"' \
    "$cli" run --device cuda --inputs "$res/nan" --check
mkdir -p "$res/keep" && for f in logprob entropy lse logit_mean dhidden; do echo old >"$res/keep/$f.npy"; done
ln -s /dev/full "$res/keep/dweight.npy"
before=$(cd "$res/keep" && find . -type f -exec md5sum {} + | sort)
step outputs_full 120 '[ $rc = 1 ] && grep -q "No space left on device" "$res/outputs_full.err" \
&& [ "$(cd "$res/keep" && find . -type f -exec md5sum {} + | sort)" = "$before" ]' \
    "$cli" run --device cuda --inputs "$res/good" --entropy --outputs "$res/keep"
rm "$res/keep/dweight.npy" && echo old >"$res/keep/dweight.npy"
before=$(cd "$res/keep" && find . -type f -exec md5sum {} + | sort)
step outputs_check 120 '[ $rc = 1 ] && grep -q "no outputs written" "$res/outputs_check.err" \
&& [ "$(cd "$res/keep" && find . -type f -exec md5sum {} + | sort)" = "$before" ]' \
    "$cli" run --device cuda --inputs "$res/ill" --entropy --check --outputs "$res/keep"
step outputs_good 120 '[ $rc = 0 ] && python3 -c "import numpy as np,sys; \
assert np.load(sys.argv[1] + \"/dweight.npy\").shape == (2000, 128)" "$res/keep"' \
    "$cli" run --device cuda --inputs "$res/good" --entropy --check --outputs "$res/keep"

# bench: one table (every row as many cells as the header), the JSON records, the picture
step bench_plot 300 '[ $rc = 0 ] && [ -s "$res/bench.png" ] && python3 - "$res/bench_plot.out" "$res/bench.jsonl" <<"PY"
import json, sys
rows = [l for l in open(sys.argv[1]) if l.startswith("|")]
assert len({l.count("|") for l in rows}) == 1 and len(rows) > 3, rows
recs = [json.loads(l) for l in open(sys.argv[2])]
assert recs and all(r["ratio"] > 0 and r["rate_tflops"] > 0 for r in recs), recs
PY' \
    "$cli" bench --device cuda ${BENCH_ARGS:---shape A --N 16K --mode general --repeats 3} \
    --json "$res/bench.jsonl" --plot "$res/bench.png"
step tune 200 '[ $rc = 0 ] && [ -s "$res/tune.json" ] && grep -q "N_bucket" "$res/tune.json"' \
    "$cli" tune --H 2048 --V 8192 --N 4K --repeats 2 --quiet --cache "$res/tune.json"

cp "$res/bench.png" "$OUT/" 2>/dev/null
tar czf "$OUT/cli_check.tgz" -C "$res" .
echo
cat "$res/steps.txt"
[ "$fails" = 0 ] && echo "cli_check: PASS" && exit 0
echo "cli_check: FAIL ($fails step(s))"
exit 1
