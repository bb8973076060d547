#!/usr/bin/env bash
# CLI test of `spanhead bench` and bench/ab_summary.py, CPU only: the seed matrix's 56 unique
# points (--list), a packed-RL run on a tiny custom shape with its JSON record checked (both
# floors: burst and sustained), a one-pass run's sustained floor, the --topk / --sum-p2 extras
# rows, error exits, and
# ab_summary.py on hand-made JSON Lines (wins, mean, unmatched, malformed input).
# usage: test_bench.sh PATH_TO_SPANHEAD
set -u
cli=${1:?usage: test_bench.sh PATH_TO_SPANHEAD}
. "$(dirname "$0")/lib.sh"
ab=$(cd "$(dirname "$0")/../.." && pwd)/bench/ab_summary.py
fail() { echo "FAIL $1"; fails=$((fails + 1)); }

# --- the seed matrix: 56 unique (shape, H, V_loc, N, tp, cp, tokens), every layout derived
"$cli" bench --matrix seed --list --mask response,packed-rl >"$tmp/list" 2>"$tmp/err" \
    || fail "matrix-list: $(cat "$tmp/err")"
grep -q '^# matrix seed: 56 unique points' "$tmp/list" || fail "matrix-list: no count line"
python3 - "$tmp/list" <<'PY' || fail "matrix-list points"
import sys
rows = [[c.strip() for c in l.strip().strip("|").split("|")]
        for l in open(sys.argv[1]) if l.startswith("| ") and not l.startswith("| shape")]
pts = {tuple(r[:7]) for r in rows}
assert len(pts) == 56, len(pts)
full = {"A": 4 * 62080, "B": 4 * 37984, "C": 4 * 37984, "D": 4 * 151936}
lay = set()
for shape, H, V, N, tp, cp, T in pts:
    H, V, N, tp, cp, T = map(int, (H, V, N, tp, cp, T))
    assert V == full[shape] // tp and N * cp == T, (shape, V, N, tp, cp, T)
    lay.add((tp, cp, T))
want = {(4, 2, 16384 << k) for k in range(5)}
want |= {(t, c, 16384) for t in (1, 2, 4, 8) for c in (1, 2, 4, 8) if t * c <= 8}
assert lay == want, sorted(lay ^ want)
# each point: dense + 3 response fractions + 1 packed-rl, in both modes
assert len(rows) == 56 * 2 * 5, len(rows)
for r in rows:
    a = float(r[7])
    assert (0 < a < 1) if r[8] == "packed-rl" else a in (1.0, 0.5, 0.25), r
PY

# --- packed-rl on CPU: one run, its own active fraction, a complete JSON record
# check_floors(rec, k): both floors are positive finite numbers, each ratio is ms / its floor
# and each floor is k N_active H V / its rate, within the rounding of the printed digits (4
# decimals for ms, floors and ratios, 6 significant digits for the rates).
cat >"$tmp/floors.py" <<'PY'
import math


def _num(r, k):
    v = r[k]
    assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, (k, v)
    return v


def check_floors(r, k):
    ms, h = _num(r, "ms"), 5e-5
    for floor, ratio, rate in (("floor_ms", "ratio", "rate_tflops"),
                               ("floor_sustained_ms", "ratio_sustained", "rate_sustained_tflops")):
        f, q, t = _num(r, floor), _num(r, ratio), _num(r, rate)
        lo, hi = (ms - h) / (f + h), (ms + h) / (f - h)
        assert lo - h <= q <= hi + h, (ratio, q, ms, f)
        want = k * r["n_active"] * r["H"] * r["V_local"] / (t * 1e12) * 1e3
        assert abs(f - want) <= h + 1e-5 * want, (floor, f, want)
PY
"$cli" bench --device cpu --H 64 --V 520 --N 4096 --repeats 1 --warmup 0 --mode general \
    --mask packed-rl --commit abc123 --json "$tmp/rl.jsonl" >"$tmp/rl.md" 2>"$tmp/err" \
    || fail "packed-rl run: $(cat "$tmp/err")"
python3 - "$tmp/rl.jsonl" "$tmp/rl.md" "$tmp" <<'PY' || fail "packed-rl record"
import json, math, sys
sys.path.insert(0, sys.argv[3])
from floors import check_floors
recs = [json.loads(l) for l in open(sys.argv[1])]
assert [r["mask"] for r in recs] == ["none", "packed-rl"], recs
need = ("gpu date commit shape H V_local N active mask mode impl ms floor_ms ratio "
        "floor_sustained_ms ratio_sustained rate_tflops rate_sustained_tflops "
        "peak_extra_bytes tp cp tokens n_active first_call_ms").split()
for r in recs:
    missing = [k for k in need if k not in r]
    assert not missing, missing
    # the cold first call (fresh context + workspace + the first step) is its own field: a
    # real time, finite, not the median of the warm ones copied
    assert math.isfinite(r["first_call_ms"]) and r["first_call_ms"] > 0, r
    assert r["first_call_ms"] != r["ms"], r
    assert r["shape"] == "custom" and (r["H"], r["V_local"], r["N"]) == (64, 520, 4096)
    assert r["mode"] == "general" and r["impl"] == "spanhead" and r["commit"] == "abc123"
    assert r["tp"] is None and r["cp"] is None and r["tokens"] is None
    assert r["ms"] > 0 and r["floor_ms"] > 0 and r["ratio"] > 0 and r["peak_extra_bytes"] >= 0
    check_floors(r, 8)
rl = recs[1]
assert 0 < rl["active"] < 1, rl["active"]
assert abs(rl["active"] - rl["n_active"] / 4096) < 1e-4, rl
md = open(sys.argv[2]).read()
assert f"| {rl['active']:.4f} | packed-rl | general |" in md
assert "| sustained floor ms | sustained ratio |" in md, md
assert "| extra MiB | path | first call ms |" in md, md
assert "# first context of the process" in md, md
assert "| GEMM TFLOP/s | floor ms | ratio | sustained TFLOP/s |" in md, md
assert "a chain of 4 products" in md and "dense GEMM rate" not in md, md
# one table: every row has the header's number of cells
rows = [l for l in md.splitlines() if l.startswith("|")]
assert len({l.count("|") for l in rows}) == 1, rows
PY
# one-pass: 6 N_active H V over the chain-3 rate
"$cli" bench --device cpu --H 64 --V 520 --N 4096 --repeats 1 --warmup 0 --mode one-pass \
    --active 0.5 --json "$tmp/op.jsonl" >"$tmp/op.md" 2>"$tmp/err" \
    || fail "one-pass run: $(cat "$tmp/err")"
python3 - "$tmp/op.jsonl" "$tmp/op.md" "$tmp" <<'PY' || fail "one-pass record"
import json, sys
sys.path.insert(0, sys.argv[3])
from floors import check_floors
recs = [json.loads(l) for l in open(sys.argv[1])]
assert [(r["mask"], r["mode"]) for r in recs] == [("none", "one-pass"), ("response", "one-pass")]
for r in recs:
    check_floors(r, 6)
md = open(sys.argv[2]).read()
assert "a chain of 3 products" in md and "chain of 4" not in md, md
PY
# --topk K --sum-p2: after each point's row, the same point with the extras (its mode names
# them and the share over the plain row); the two are timed alternately, the share the median
# of the repetitions' own ratios: one repetition gives exactly the rows' ratio, three a finite
# share that the table prints as the JSON says
for reps in 1 3; do
    "$cli" bench --device cpu --H 48 --V 300 --N 512 --repeats $reps --warmup 0 --mode both \
        --active 0.5 --topk 8 --sum-p2 --json "$tmp/x$reps.jsonl" >"$tmp/x$reps.md" 2>"$tmp/err" \
        || fail "extras run ($reps): $(cat "$tmp/err")"
    python3 - "$tmp/x$reps.jsonl" "$tmp/x$reps.md" "$tmp" $reps <<'PY' || fail "extras records ($reps)"
import json, math, re, sys
sys.path.insert(0, sys.argv[3])
from floors import check_floors
recs = [json.loads(l) for l in open(sys.argv[1])]
md = open(sys.argv[2]).read()
modes = [r["mode"].split(" ")[0] for r in recs]
assert modes == (["general", "general+topk8+sum_p2"] * 2 +
                 ["one-pass", "one-pass+topk8+sum_p2"] * 2), modes
for p, x in zip(recs[0::2], recs[1::2]):
    assert "extra_pct" not in p or p.get("topk") is None, p
    assert x["topk"] == 8 and x["sum_p2"] is True and math.isfinite(x["extra_pct"]), x
    assert (x["mask"], x["active"], x["n_active"]) == (p["mask"], p["active"], p["n_active"])
    check_floors(x, 6 if p["mode"] == "one-pass" else 8)
    # the table prints the share to 1 decimal from the unrounded value, the JSON to 3: they
    # agree within 0.05 + 0.0005 (an exact string compare failed in CI where the JSON's value
    # sat on a midpoint, -84.85: Python rounds its binary form down, the C side's -84.8503 up)
    shown = [float(v) for v in re.findall(re.escape(x["mode"].split(" ")[0]) +
                                          r" \(([+-]\d+\.\d) %\)", md)]
    assert any(abs(v - x["extra_pct"]) <= 0.0505 for v in shown), (x, md)
    if sys.argv[4] == "1":  # ms printed to 4 decimals
        want = 100 * (x["ms"] / p["ms"] - 1)
        assert abs(x["extra_pct"] - want) < 0.05 + 100 * 5e-5 * (x["ms"] + p["ms"]) / (
            p["ms"] - 5e-5) ** 2, (x, p)
PY
done
# same seed, same batch; another seed, another batch
act() {
    "$cli" bench --list --device cpu --H 64 --V 520 --N 4096 --mode general --mask packed-rl "$@" \
        | awk -F'|' '/packed-rl/ {print $6}'
}
a1=$(act) a2=$(act --seed 1) a3=$(act --seed 7)
[ -n "$a1" ] && [ "$a1" = "$a2" ] && [ "$a1" != "$a3" ] || fail "packed-rl seeds: '$a1' '$a2' '$a3'"

# --- usage errors: exit 2, one line naming the option and the value, nothing on stdout
expect_fail bad-matrix 2 "--matrix 'foo': expected seed" "$cli" bench --matrix foo --list
expect_fail bad-mask 2 "--mask 'bogus'" "$cli" bench --mask bogus --list
expect_fail bad-mask-2 2 "--mask 'response,bogus'" "$cli" bench --mask response,bogus --list
expect_fail twice-mask 2 "--mask 'response,response': response given twice" "$cli" bench --mask response,response --list
expect_fail matrix-N 2 "--matrix seed" "$cli" bench --matrix seed --N 16K --list
expect_fail bad-H 2 "--H 'abc'" "$cli" bench --H abc --V 520 --list
expect_fail bad-seed 2 "--seed '-1'" "$cli" bench --seed -1 --list
expect_fail tiny-rl 2 "--N 40" "$cli" bench --device cpu --H 64 --V 520 --N 40 --mask packed-rl

# --- ab_summary.py: A faster at 2 of 3 matched points, one point only in B
rec() { # shape N active mask mode ms [tp cp]
    printf '{"gpu":"g","date":"d","commit":"c","shape":"%s","H":2048,"V_local":62080,"N":%s,' \
        "$1" "$2"
    printf '"tp":%s,"cp":%s,"active":%s,"mask":"%s","mode":"%s","impl":"spanhead","ms":%s,' \
        "${7:-null}" "${8:-null}" "$3" "$4" "$5" "$6"
    printf '"floor_ms":1,"ratio":1,"peak_extra_bytes":0}\n'
}
{ rec A 8192 1.0000 none general 8 4 2; rec A 8192 0.5000 response general 3 4 2
  rec A 16384 0.5000 response general 6; } >"$tmp/a.jsonl"
{ rec A 8192 1.0000 none general 10 4 2; rec A 8192 0.5000 response general 4 4 2
  rec A 16384 0.5000 response general 5; rec A 16384 0.2500 response general 3; } >"$tmp/b.jsonl"
python3 "$ab" "$tmp/a.jsonl" "$tmp/b.jsonl" --label-a new --label-b old >"$tmp/ab" 2>"$tmp/err" \
    || fail "ab_summary: exit $? ($(cat "$tmp/err"))"
# reductions 20%, 25%, -20%: mean +8.3%, median +20.0%
want="new faster at 2/3 points; reduction mean +8.3%, median +20.0%, range [-20.0%, +25.0%]"
grep -qF "new vs old: $want" "$tmp/ab" \
    || fail "ab_summary summary: $(tail -1 "$tmp/ab")"
row="| A | 2048 | 62080 | 8192 | 4 | 2 | 0.5000 | response | general | 3.0000 | 4.0000 | +25.0% |"
grep -qF "$row" "$tmp/ab" \
    || fail "ab_summary row"
grep -qF "only in old: A H=2048 V_local=62080 N=16384 active=0.2500 response general" "$tmp/ab" \
    || fail "ab_summary unmatched"
python3 "$ab" "$tmp/a.jsonl" "$tmp/b.jsonl" --mask none >"$tmp/ab" 2>&1 \
    && grep -qF "A faster at 1/1 points" "$tmp/ab" || fail "ab_summary --mask"
# the bench's own records (with the sustained floor's fields) read as well as the old ones
python3 "$ab" "$tmp/rl.jsonl" "$tmp/rl.jsonl" >"$tmp/ab" 2>&1 \
    && grep -qF "A faster at 0/2 points" "$tmp/ab" || fail "ab_summary on bench output"
{ cat "$tmp/a.jsonl"; echo '{"shape":"A","H":2048'; } >"$tmp/bad.jsonl"
expect_fail ab-malformed 2 "bad.jsonl:4: not JSON" python3 "$ab" "$tmp/bad.jsonl" "$tmp/b.jsonl"
rec A 8192 1.0000 none general -1 >"$tmp/neg.jsonl"
expect_fail ab-neg-ms 2 "neg.jsonl:1: ms = -1" python3 "$ab" "$tmp/neg.jsonl" "$tmp/b.jsonl"
: >"$tmp/empty.jsonl"
expect_fail ab-empty 2 "empty.jsonl: no points" python3 "$ab" "$tmp/a.jsonl" "$tmp/empty.jsonl"
cat "$tmp/a.jsonl" "$tmp/a.jsonl" >"$tmp/dup.jsonl"
expect_fail ab-dup 2 "dup.jsonl:4: point A" python3 "$ab" "$tmp/dup.jsonl" "$tmp/b.jsonl"
sed 's/"ms":[0-9]*,//' "$tmp/a.jsonl" >"$tmp/noms.jsonl"
expect_fail ab-missing 2 "missing field(s) ms" python3 "$ab" "$tmp/noms.jsonl" "$tmp/b.jsonl"

# --- --plot with the script named by SPH_PLOT_SCRIPT (a copy elsewhere: the path must be the
# one run; H200 run 23 ran an empty path). matplotlib comes with scripts/setup.sh.
if python3 -c 'import matplotlib' 2>/dev/null; then
    cp "$(dirname "$ab")/plot_bench.py" "$tmp/myplot.py"
    SPH_PLOT_SCRIPT=$tmp/myplot.py "$cli" bench --device cpu --H 64 --V 520 --N 1024 --repeats 1 \
        --warmup 0 --mode general --active 1,0.5 --plot "$tmp/p.png" >"$tmp/plot.out" 2>&1 \
        || fail "plot via SPH_PLOT_SCRIPT: $(tail -2 "$tmp/plot.out")"
    [ -s "$tmp/p.png" ] && [ "$(head -c 4 "$tmp/p.png" | tail -c 3)" = PNG ] \
        || fail "plot via SPH_PLOT_SCRIPT: no PNG"
    # a script that is not there: the run goes on, the plot is skipped and says why
    SPH_PLOT_SCRIPT=$tmp/none.py "$cli" bench --device cpu --H 64 --V 520 --N 1024 \
        --repeats 1 --warmup 0 --mode general --plot "$tmp/q.png" >"$tmp/plot.out" 2>"$tmp/plot.err" \
        && grep -q "skipped: .*SPH_PLOT_SCRIPT" "$tmp/plot.err" && [ ! -e "$tmp/q.png" ] \
        || fail "plot with a missing SPH_PLOT_SCRIPT: $(cat "$tmp/plot.err")"
else
    echo "SKIP plot checks: matplotlib is not installed"
fi

# ---- valid JSON always, every write checked (issue 26 cases 13, 14) ---------------------------
tiny=(bench --device cpu --H 32 --V 256 --N 64 --active 1 --repeats 1 --warmup 0)
"$cli" "${tiny[@]}" --commit 'x"y\z' --json "$tmp/q.jsonl" >/dev/null 2>"$tmp/err" \
    || fail "bench --commit with a quote: $(cat "$tmp/err")"
SPH_COMMIT=$'tab\there "q"' "$cli" "${tiny[@]}" --json "$tmp/q.jsonl" >/dev/null 2>"$tmp/err" \
    || fail "bench \$SPH_COMMIT with a quote: $(cat "$tmp/err")"
python3 - "$tmp/q.jsonl" <<'PY' || fail "bench JSON with quotes in the commit"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert len(recs) >= 2, recs
commits = {r["commit"] for r in recs}
assert commits == {'x"y\\z', 'tab\there "q"'}, commits
PY
if [ -w /dev/full ]; then
    for mode in both policy; do
        "$cli" "${tiny[@]}" --mode $mode --json /dev/full >/dev/null 2>"$tmp/err"; rc=$?
        [ $rc = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] \
            && grep -qF -- "--json /dev/full: write failed: No space left on device" "$tmp/err" \
            || fail "bench --mode $mode --json /dev/full: exit $rc, stderr '$(cat "$tmp/err")'"
    done
fi

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "bench CLI: all checks passed"
