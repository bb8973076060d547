#!/usr/bin/env bash
# test_run_oracle.sh - `spanhead run --inputs DIR --outputs DIR` against an independent NumPy
# float64 oracle that reads the input files itself (tests/cli/run_oracle.py; --check
# recomputes through the runner's own plumbing, so it cannot see a file or an option the
# runner drops): every input file (mask, dlogprob, dentropy, dlse, dlogit_mean, candidates)
# given in one run and absent in another, --temperature, --softcap and --gap, the two-pass and
# the one-pass (--one-pass) modes; per-row temperatures (temperature.npy, issue 25), with
# --temperature alongside refused; and the fused policy loss with --temperature / --softcap,
# temperature.npy, and without its optional files (tests/cli/policy_oracle.py).
set -uo pipefail
cli=${1:?usage: test_run_oracle.sh path/to/spanhead}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
if ! python3 -c 'import numpy' 2>/dev/null; then
    if [[ -n ${CI:-} ]]; then echo "FAIL numpy is not installed (CI=$CI)"; exit 1; fi
    echo "skipped: numpy is not installed"
    exit 77
fi
seed=${SPH_TEST_SEED:-$RANDOM}
echo "test_run_oracle: seed $seed"
oracle() { python3 "$here/run_oracle.py" "$@"; }
oracle gen "$tmp/all" "$seed" || exit 1                       # every file
oracle gen "$tmp/bare" "$seed" --no-mask --no-ups || exit 1   # the required three only
oracle gen "$tmp/cand" "$seed" --candidates 9 || exit 1       # a sample support
oracle gen "$tmp/trow" "$seed" --temperature-rows || exit 1   # every file + temperature.npy
oracle gen "$tmp/tcand" "$seed" --candidates 7 --temperature-rows || exit 1
mkdir -p "$tmp/some"                                          # some upstreams, no mask
cp "$tmp/all/hidden.npy" "$tmp/all/weight.npy" "$tmp/all/targets.npy" "$tmp/all/dentropy.npy" \
    "$tmp/all/dlogit_mean.npy" "$tmp/some/"

n=0
# case NAME INPUT-DIR -- run options...: run, then the oracle on the same options
case_() {
    local name=$1 in=$2
    shift 3
    n=$((n + 1))
    local out=$tmp/out$n
    if ! "$cli" run --inputs "$in" --outputs "$out" "$@" >"$tmp/log" 2>&1; then
        bad "$name: run failed"; tail -5 "$tmp/log"; return
    fi
    local o=()
    while [[ $# -gt 0 ]]; do
        case $1 in --temperature|--softcap) o+=("$1" "$2"); shift 2 ;; *) shift ;; esac
    done
    if oracle check "$in" "$out" "${o[@]}" >"$tmp/olog" 2>&1; then ok "$name"
    else bad "$name: oracle"; cat "$tmp/olog"; fi
}
case_ "every input file" "$tmp/all" --
case_ "every input file, temperature + softcap" "$tmp/all" -- --temperature 0.7 --softcap 2.5
case_ "every input file, one-pass" "$tmp/all" -- --one-pass --temperature 1.3
case_ "one-pass, softcap" "$tmp/all" -- --one-pass --softcap 4
case_ "no mask, dentropy + dlogit_mean only" "$tmp/some" -- --temperature 0.9
case_ "required files only (forward)" "$tmp/bare" -- --softcap 3
case_ "candidates" "$tmp/cand" -- --temperature 0.8
case_ "candidates, one-pass, softcap" "$tmp/cand" -- --one-pass --softcap 2
case_ "reference kernels, everything" "$tmp/all" -- --kernel ref --temperature 0.6 --softcap 5
case_ "coalesced spans (--gap 4): the mask still rules" "$tmp/all" -- --gap 4 --one-pass
case_ "temperature.npy" "$tmp/trow" --
case_ "temperature.npy, one-pass, softcap" "$tmp/trow" -- --one-pass --softcap 3
case_ "temperature.npy, reference kernels" "$tmp/trow" -- --kernel ref
case_ "temperature.npy, candidates, one-pass" "$tmp/tcand" -- --one-pass
# temperature.npy with --temperature: refused (exit 2), nothing written
n=$((n + 1))
if "$cli" run --inputs "$tmp/trow" --outputs "$tmp/out$n" --temperature 0.5 >"$tmp/log" 2>&1; then
    bad "temperature.npy with --temperature: accepted"
elif [[ $? -ne 2 ]] || ! grep -q "temperature.npy" "$tmp/log" || [[ -e $tmp/out$n ]]; then
    bad "temperature.npy with --temperature: expected exit 2 naming temperature.npy, no outputs"
    cat "$tmp/log"
else ok "temperature.npy with --temperature: refused"; fi
# a temperature <= 0: the library's message naming the row, nothing written
mkdir -p "$tmp/tbad" && cp "$tmp/trow"/*.npy "$tmp/tbad/"
python3 -c "import numpy as np; t = np.load('$tmp/tbad/temperature.npy'); t[5] = -1; np.save('$tmp/tbad/temperature.npy', t)"
n=$((n + 1))
if "$cli" run --inputs "$tmp/tbad" --outputs "$tmp/out$n" >"$tmp/log" 2>&1; then
    bad "temperature.npy with a negative value: accepted"
elif ! grep -q "temperature_rows\[5\]" "$tmp/log" || [[ -e $tmp/out$n ]]; then
    bad "temperature.npy with a negative value: expected a message naming row 5, no outputs"
    cat "$tmp/log"
else ok "temperature.npy with a negative value: refused"; fi

# the policy loss: temperature and softcap forwarded, every optional file present / absent
pol() { python3 "$here/policy_oracle.py" "$@"; }
pol gen "$tmp/pin" "$seed" || exit 1
mkdir -p "$tmp/pbare"
for f in hidden weight targets advantages old_logprob; do cp "$tmp/pin/$f.npy" "$tmp/pbare/"; done
pcase() {
    local name=$1 in=$2
    shift 3
    n=$((n + 1))
    local out=$tmp/out$n
    if ! "$cli" run --inputs "$in" --outputs "$out" "$@" >"$tmp/log" 2>&1; then
        bad "$name: run failed"; tail -5 "$tmp/log"; return
    fi
    if pol check "$in" "$out" "$@" >"$tmp/olog" 2>&1; then ok "$name"
    else bad "$name: oracle"; cat "$tmp/olog"; fi
}
P=(--clip-low 0.2 --clip-high 0.28)
pcase "policy: every file, temperature + softcap" "$tmp/pin" -- --policy-loss ppo "${P[@]}" \
    --clip-ratio-c 3 --kl k3 --kl-coef 0.05 --entropy-coef 0.01 --agg seq-mean-token-mean \
    --temperature 0.7 --softcap 3
pcase "policy gspo: temperature" "$tmp/pin" -- --policy-loss gspo "${P[@]}" --kl k2 \
    --kl-coef 0.02 --agg seq-mean-token-sum --temperature 1.4
pcase "policy: required files only, softcap" "$tmp/pbare" -- --policy-loss cispo "${P[@]}" \
    --entropy-coef 0.02 --agg token-mean --softcap 2
pcase "policy: coalesced spans (--gap 3)" "$tmp/pin" -- --policy-loss ppo "${P[@]}" --kl k1 \
    --kl-coef 0.1 --agg seq-mean-token-sum-norm --norm-length 9 --gap 3
mkdir -p "$tmp/ptemp" && cp "$tmp/pin"/*.npy "$tmp/ptemp/"
python3 -c "import numpy as np; r = np.random.default_rng($seed); np.save('$tmp/ptemp/temperature.npy', np.exp(r.uniform(-1.5, 1.5, np.load('$tmp/pin/targets.npy').shape[0])).astype(np.float32))"
pcase "policy: temperature.npy, softcap" "$tmp/ptemp" -- --policy-loss ppo "${P[@]}" --kl k3 \
    --kl-coef 0.05 --entropy-coef 0.01 --agg seq-mean-token-mean --softcap 3
n=$((n + 1))
if "$cli" run --inputs "$tmp/ptemp" --outputs "$tmp/out$n" --policy-loss ppo "${P[@]}" \
    --temperature 2 >"$tmp/log" 2>&1; then
    bad "policy: temperature.npy with --temperature: accepted"
elif [[ $? -ne 2 ]] || ! grep -q "temperature.npy" "$tmp/log" || [[ -e $tmp/out$n ]]; then
    bad "policy: temperature.npy with --temperature: expected exit 2 naming temperature.npy"
    cat "$tmp/log"
else ok "policy: temperature.npy with --temperature: refused"; fi

[[ $fails -eq 0 ]] || { echo "$fails run_oracle case(s) failed"; exit 1; }
echo "all $n run_oracle cases passed"
