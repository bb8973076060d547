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
expect_mpi all-bad-value "--temperature '0': expected a finite number in (0," -np 2 "$cli" run --tp 2 --temperature 0
expect_mpi single-opts "this is the distributed runner" -np 2 "$cli" run --check
expect_mpi world "needs 4 ranks, but mpirun started 2" -np 2 "$cli" run --tp 4
expect_mpi support "--support 300: more candidates than --vocab 203" -np 2 "$cli" run --tp 2 --support 300

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
