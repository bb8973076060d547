#!/usr/bin/env bash
# mpi_run_agree.sh - the distributed `spanhead run` under mpirun when the ranks disagree
# (issue 18 item 6): different arguments per rank (an MPMD command line), an unknown option,
# --help or --bench on one rank only, a usage error on every rank, single-process options
# under a multi-rank launch. Each must end every rank within the timeout with a non-zero exit
# and the message; none may hang. --help on every rank prints the usage once and exits 0.
# usage: mpi_run_agree.sh PATH_TO_SPANHEAD MPIRUN
set -u
cli=${1:?usage: mpi_run_agree.sh PATH_TO_SPANHEAD MPIRUN}
mpirun=${2:-}
. "$(dirname "$0")/lib.sh"
if [ -z "$mpirun" ] || ! command -v "$mpirun" >/dev/null; then
    echo "skipped: no mpirun"
    exit 77
fi
mr() { timeout -s KILL 90 "$mpirun" --oversubscribe --allow-run-as-root "$@"; }

# expect_mpi NAME NEEDLE mpirun-args...: non-zero exit, the needle in the combined output
expect_mpi() {
    local name=$1 needle=$2
    shift 2
    mr "$@" >"$tmp/out" 2>&1
    local rc=$?
    if [ "$rc" = 0 ] || [ "$rc" = 137 ]; then
        echo "FAIL $name: exit $rc (137: killed after the timeout, a hang)"; tail -5 "$tmp/out"
        fails=$((fails + 1)); return
    fi
    if ! grep -qF -- "$needle" "$tmp/out"; then
        echo "FAIL $name: output lacks '$needle':"; tail -5 "$tmp/out"; fails=$((fails + 1)); return
    fi
    echo "ok   $name (exit $rc)"
}

expect_mpi mpmd-tp "ranks were given different arguments: rank 0 '--tp 2', rank 1 '--tp 4'" \
    -np 1 "$cli" run --tp 2 : -np 1 "$cli" run --tp 4
expect_mpi mpmd-unknown "rank 1 '--tp 2 --bogus'" -np 1 "$cli" run --tp 2 : -np 1 "$cli" run --tp 2 --bogus
expect_mpi mpmd-help "rank 1 '--tp 2 --help'" -np 1 "$cli" run --tp 2 : -np 1 "$cli" run --tp 2 --help
expect_mpi mpmd-bench "rank 1 '--tp 2 --bench 3'" -np 1 "$cli" run --tp 2 : -np 1 "$cli" run --tp 2 --bench 3
expect_mpi mpmd-single "rank 1 '--check'" -np 1 "$cli" run --tp 2 : -np 1 "$cli" run --check
expect_mpi all-unknown "unknown option '--bogus'" -np 2 "$cli" run --tp 2 --bogus
expect_mpi all-bad-value "temperature: 0, expected finite and > 0" -np 2 "$cli" run --tp 2 --temperature 0
expect_mpi all-bad-kernel "force_kernel: 'nope' is unknown" -np 2 "$cli" run --tp 2 --kernel nope
expect_mpi single-opts "this is the distributed runner" -np 2 "$cli" run --check
expect_mpi world "needs 4 ranks, but mpirun started 2" -np 2 "$cli" run --tp 4
expect_mpi support "--support 300: more candidates than --vocab 203" -np 2 "$cli" run --tp 2 --support 300

# ---- every CLI path agrees (issue 26 case 3): the policy loss beside the head run, and on
# every argument of the policy loss, --outputs included; each rank prints the verdict
pol=$tmp/pol
python3 - "$pol" <<'PY' || { echo "FAIL policy inputs"; fails=$((fails + 1)); }
import os, sys, numpy as np
d = sys.argv[1]; os.makedirs(d); r = np.random.default_rng(7)
N, H, V = 32, 8, 40
np.save(f"{d}/hidden.npy", r.standard_normal((N, H)).astype(np.float32))
np.save(f"{d}/weight.npy", r.standard_normal((V, H)).astype(np.float32))
np.save(f"{d}/targets.npy", r.integers(0, V, N).astype(np.int64))
np.save(f"{d}/advantages.npy", r.standard_normal(N).astype(np.float32))
np.save(f"{d}/old_logprob.npy", (-r.random(N) * 3).astype(np.float32))
np.save(f"{d}/seq_id.npy", np.repeat(np.arange(4), N // 4).astype(np.int64))
PY
P=(run --dp 2 --inputs "$pol" --policy-loss ppo)
# expect_every NAME NEEDLE mpirun-args...: as expect_mpi, and both ranks print the needle
expect_every() {
    local name=$1 needle=$2
    expect_mpi "$@"
    for r in 0 1; do
        grep -F -- "[rank $r]" "$tmp/out" | grep -qF -- "$needle" \
            || { echo "FAIL $name: rank $r did not say it"; fails=$((fails + 1)); }
    done
}
expect_every policy-vs-head "--policy-loss differs: rank 0 runs the policy loss (--policy-loss), rank 1 the head run" \
    -np 1 "$cli" run --tp 2 --inputs "$pol" --policy-loss ppo : -np 1 "$cli" run --tp 2
expect_every head-vs-policy "--policy-loss differs: rank 0 runs the head run, rank 1 the policy loss" \
    -np 1 "$cli" run --dp 2 : -np 1 "$cli" "${P[@]}"
expect_every policy-clip-low "(--clip-low differs; every rank needs the same)" \
    -np 1 "$cli" "${P[@]}" --clip-low 0.2 : -np 1 "$cli" "${P[@]}" --clip-low 0.9
expect_every policy-outputs "(--outputs differs; every rank needs the same)" \
    -np 1 "$cli" "${P[@]}" --outputs "$tmp/o1" : -np 1 "$cli" "${P[@]}" --outputs "$tmp/o2"
[ ! -e "$tmp/o1" ] && [ ! -e "$tmp/o2" ] || { echo "FAIL policy-outputs wrote"; fails=$((fails + 1)); }
expect_every head-outputs "(--outputs differs; every rank needs the same)" \
    -np 1 "$cli" run --tp 2 --outputs "$tmp/o1" : -np 1 "$cli" run --tp 2
expect_every policy-usage "rank 1 '--dp 2 --inputs $pol --policy-loss ppo --kl-coef x': --kl-coef 'x'" \
    -np 1 "$cli" "${P[@]}" : -np 1 "$cli" "${P[@]}" --kl-coef x
expect_mpi policy-help-one "--help differs" -np 1 "$cli" "${P[@]}" : -np 1 "$cli" "${P[@]}" --help
# the same values spelt differently agree (the parsed values are compared)
if mr -np 1 "$cli" "${P[@]}" --clip-low=0.2 : -np 1 "$cli" "${P[@]}" --clip-low 0.20 >"$tmp/out" 2>&1; then
    echo "ok   policy-same-values"
else
    echo "FAIL policy-same-values: $(tail -3 "$tmp/out")"; fails=$((fails + 1))
fi

mr -np 2 "$cli" run --tp 2 --help >"$tmp/out" 2>&1
rc=$?
if [ $rc = 0 ] && [ "$(grep -c '^usage: mpirun' "$tmp/out")" = 1 ]; then
    echo "ok   all-help"
else
    echo "FAIL all-help: exit $rc, $(grep -c '^usage' "$tmp/out") usage lines"; fails=$((fails + 1))
fi

[ "$fails" -eq 0 ] && echo "all agreement cases passed" && exit 0
echo "$fails agreement case(s) failed"
exit 1
