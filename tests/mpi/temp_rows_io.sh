#!/usr/bin/env bash
# temp_rows_io.sh - per-row temperatures (temperature.npy, issue 25) through `spanhead run
# --inputs` under mpirun: rank 0 reads the file and broadcasts it with the batch; the head
# (--tp 2, --cp 2, --tp 2 --dp 2; the runner compares with one process itself) and the policy
# loss (--tp 2, --cp 2) write the files one process writes, and the independent NumPy float64
# oracles (tests/cli/run_oracle.py, tests/cli/policy_oracle.py, which read temperature.npy
# themselves) check them. --temperature alongside the file is refused on every rank.
# usage: temp_rows_io.sh SPANHEAD MPIRUN PYTHON
set -uo pipefail
cli=$1 mpirun=$2 py=$3
here=$(cd "$(dirname "$0")" && pwd)
if ! "$py" -c 'import numpy' 2>/dev/null; then
    echo "skipped: numpy is not installed"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
seed=${SPH_TEST_SEED:-$RANDOM}
echo "temp_rows_io: seed $seed"
"$py" "$here/../cli/run_oracle.py" gen "$tmp/in" "$seed" --temperature-rows || exit 1
"$py" "$here/../cli/policy_oracle.py" gen "$tmp/pin" "$seed" || exit 1
# sequences of the head's rows (lengths.npy: the distributed runner's DP packing needs them)
"$py" -c "import numpy as np; np.save('$tmp/in/lengths.npy', np.array([9, 14, 3, 11, 16], np.int64))" || exit 1
"$py" - "$tmp/pin" "$seed" <<'PY' || exit 1
import sys, numpy as np
d, seed = sys.argv[1], int(sys.argv[2])
n = np.load(f"{d}/targets.npy").shape[0]
r = np.random.default_rng(seed + 1)
np.save(f"{d}/temperature.npy", np.exp(r.uniform(-1.4, 1.4, n)).astype(np.float32))
PY
fails=0
n=0
head() {
    local np=$1
    shift
    n=$((n + 1))
    local out=$tmp/out$n
    if ! timeout 100 "$mpirun" --oversubscribe --allow-run-as-root -np "$np" "$cli" run \
        --inputs "$tmp/in" --outputs "$out" "$@" >"$tmp/log" 2>&1; then
        echo "FAIL head np=$np $*"; tail -5 "$tmp/log"; fails=$((fails + 1)); return
    fi
    if "$py" "$here/../cli/run_oracle.py" check "$tmp/in" "$out" --tol 1e-4 >"$tmp/olog"; then
        echo "ok   head np=$np $*"
    else
        echo "FAIL head np=$np $* (oracle)"; cat "$tmp/olog"; fails=$((fails + 1))
    fi
}
pol() { # np, then the distribution flags, then -- and the policy flags
    local np=$1 dist=()
    shift
    while [[ $1 != -- ]]; do dist+=("$1"); shift; done
    shift
    n=$((n + 1))
    local out=$tmp/out$n
    if ! timeout 100 "$mpirun" --oversubscribe --allow-run-as-root -np "$np" "$cli" run \
        --inputs "$tmp/pin" --outputs "$out" "${dist[@]}" "$@" --check >"$tmp/log" 2>&1; then
        echo "FAIL policy np=$np ${dist[*]} $*"; tail -5 "$tmp/log"; fails=$((fails + 1)); return
    fi
    if "$py" "$here/../cli/policy_oracle.py" check "$tmp/pin" "$out" "$@" >"$tmp/olog"; then
        echo "ok   policy np=$np ${dist[*]} $*"
    else
        echo "FAIL policy np=$np ${dist[*]} $* (oracle)"; cat "$tmp/olog"; fails=$((fails + 1))
    fi
}
head 2 --tp 2
head 2 --cp 2
head 4 --tp 2 --dp 2
head 2 --tp 2 --one-pass
P=(--policy-loss ppo --clip-low 0.2 --clip-high 0.28 --kl k3 --kl-coef 0.05 --entropy-coef 0.01
   --agg seq-mean-token-mean)
pol 2 --tp 2 -- "${P[@]}"
pol 2 --cp 2 -- "${P[@]}" --softcap 3
# the scalar alongside the file: refused, nothing written
if timeout 100 "$mpirun" --oversubscribe --allow-run-as-root -np 2 "$cli" run --inputs "$tmp/in" \
    --outputs "$tmp/refused" --tp 2 --temperature 0.5 >"$tmp/log" 2>&1; then
    echo "FAIL --temperature with temperature.npy accepted"; fails=$((fails + 1))
elif ! grep -q "temperature.npy" "$tmp/log" || [[ -e $tmp/refused ]]; then
    echo "FAIL --temperature with temperature.npy: no message naming the file, or outputs"
    cat "$tmp/log"; fails=$((fails + 1))
else echo "ok   --temperature with temperature.npy refused"; fi
[[ $fails -eq 0 ]] || { echo "$fails temp_rows_io case(s) failed"; exit 1; }
echo "all temp_rows_io cases passed"
