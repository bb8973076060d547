#!/usr/bin/env bash
# policy_io.sh - `spanhead run --policy-loss ...` under mpirun: rank 0 reads the .npy inputs,
# the ranks split them (TP vocabulary shards, CP rows of the sequences through the library's
# sequence group, DP whole sequences with the global token and sequence counts), rank 0
# gathers and checks against one process (--check) and writes what one process writes; the
# independent NumPy float64 oracle (tests/cli/policy_oracle.py) checks those files, for
# (T,C,D) = (2,1,1), (1,2,1), (1,1,2) on 2 ranks and (2,2,1), (1,2,2) on 4, over ppo, gspo
# and cispo. Every TP rank must hold bitwise the same metrics (the runner checks it). Then
# --topk / --sum-p2 under --tp, --cp and --dp against one process's extras.
# usage: policy_io.sh SPANHEAD MPIRUN PYTHON
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
echo "policy_io: seed $seed"
"$py" "$here/../cli/policy_oracle.py" gen "$tmp/in" "$seed" || exit 1
fails=0
n=0
run() { # np, then the distribution flags, then -- and the policy flags
    local np=$1 dist=()
    shift
    while [[ $1 != -- ]]; do dist+=("$1"); shift; done
    shift
    n=$((n + 1))
    local out=$tmp/out$n
    if ! timeout 100 "$mpirun" --oversubscribe --allow-run-as-root -np "$np" "$cli" run \
        --inputs "$tmp/in" --outputs "$out" "${dist[@]}" "$@" --check >"$tmp/log" 2>&1; then
        echo "FAIL np=$np ${dist[*]} $*"; tail -5 "$tmp/log"; fails=$((fails + 1)); return
    fi
    if "$py" "$here/../cli/policy_oracle.py" check "$tmp/in" "$out" "$@" >"$tmp/olog"; then
        echo "ok   np=$np ${dist[*]} $*"
    else
        echo "FAIL np=$np ${dist[*]} $* (oracle)"; cat "$tmp/olog"; fails=$((fails + 1))
    fi
}
PPO="--policy-loss ppo --clip-low 0.2 --clip-high 0.28 --clip-ratio-c 3 --kl k3 --kl-coef 0.05 --entropy-coef 0.01 --agg seq-mean-token-mean"
GSPO="--policy-loss gspo --clip-low 0.2 --clip-high 0.28 --kl k2 --kl-coef 0.02 --entropy-coef 0 --agg seq-mean-token-mean"
CISPO="--policy-loss cispo --clip-low 0 --clip-high 4 --kl none --kl-coef 0 --entropy-coef 0.01 --agg token-mean"
run 2 --tp 2 -- $PPO
run 2 --cp 2 -- $GSPO
run 2 --dp 2 -- $PPO
run 2 --dp 2 -- $CISPO
if [[ -z ${SPH_MPI_QUICK:-} ]]; then
    run 4 --tp 2 --cp 2 -- $GSPO
    run 4 --cp 2 --dp 2 -- $PPO
fi
# the head's extras through the distributed loss (issue 25): --topk / --sum-p2 gathered from
# every (cp, dp) group, checked by the runner against one float64 process (--check) and here
# against one spanhead process's files (ids equal where the log-probs are separated)
"$cli" run --inputs "$tmp/in" --outputs "$tmp/one" $PPO --topk 7 --sum-p2 >/dev/null 2>&1 \
    || { echo "FAIL the one-process extras run"; fails=$((fails + 1)); }
extras() { # np, then the distribution flags
    local np=$1
    shift
    n=$((n + 1))
    local out=$tmp/out$n
    if ! timeout 100 "$mpirun" --oversubscribe --allow-run-as-root -np "$np" "$cli" run \
        --inputs "$tmp/in" --outputs "$out" "$@" $PPO --topk 7 --sum-p2 --check >"$tmp/log" 2>&1 ||
        ! grep -q "check of the extras.*PASS" "$tmp/log"; then
        echo "FAIL np=$np $* extras"; tail -5 "$tmp/log"; fails=$((fails + 1)); return
    fi
    if "$py" - "$tmp/one" "$out" <<'PY' >"$tmp/olog" 2>&1; then
import numpy as np, sys
a, b = sys.argv[1], sys.argv[2]
ia, ib = np.load(f"{a}/topk_ids.npy"), np.load(f"{b}/topk_ids.npy")
la, lb = np.load(f"{a}/topk_logprobs.npy"), np.load(f"{b}/topk_logprobs.npy")
sa, sb = np.load(f"{a}/sum_p2.npy"), np.load(f"{b}/sum_p2.npy")
assert ia.shape == ib.shape == la.shape == lb.shape and sa.shape == sb.shape
assert np.abs(la - lb).max() <= 1e-5 * (1 + np.abs(la).max()), np.abs(la - lb).max()
assert np.abs(sa - sb).max() <= 1e-5 * max(np.abs(sa).max(), 1e-30)
assert ((ia == -1) == (ib == -1)).all() and (sb[ia[:, 0] == -1] == 0).all()
gap = np.minimum(np.abs(np.diff(la, axis=1, prepend=np.inf)), np.abs(np.diff(la, axis=1, append=-np.inf)))
sep = gap > 1e-4
assert (ia[sep] == ib[sep]).all()
PY
        echo "ok   np=$np $* extras"
    else
        echo "FAIL np=$np $* extras (against one process)"; cat "$tmp/olog"; fails=$((fails + 1))
    fi
}
extras 2 --tp 2
extras 2 --cp 2
if [[ -z ${SPH_MPI_QUICK:-} ]]; then
    extras 4 --tp 2 --dp 2
fi
# a usage error agreed by every rank: the world does not match T*C*D
if timeout 60 "$mpirun" --oversubscribe --allow-run-as-root -np 2 "$cli" run --inputs "$tmp/in" \
    --policy-loss ppo --tp 3 >"$tmp/log" 2>&1; then
    echo "FAIL --tp 3 on 2 ranks succeeded"; fails=$((fails + 1))
elif grep -q "needs 3 ranks, but mpirun started 2" "$tmp/log"; then
    echo "ok   --tp 3 on 2 ranks refused"
else
    echo "FAIL --tp 3 on 2 ranks: $(tail -3 "$tmp/log")"; fails=$((fails + 1))
fi
echo "policy_io: $fails failure(s)"
[[ $fails -eq 0 ]]
