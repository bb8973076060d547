#!/usr/bin/env bash
# test_outputs.sh - `--outputs DIR` survives signals and neighbours (issue 26 cases 5, 6, 12):
#   - SIGTERM / SIGINT while the files are written (or computed) leave no hidden staging files
#     and no directory the run created; into an existing directory, nothing changes;
#   - two concurrent runs on one target never mix: the second fails before computing (the
#     directory's lock), the final set is the first run's, byte for byte;
#   - an output name that is a link (to /dev/stderr) or a FIFO is refused before any work,
#     naming the path, and nothing is written (a FIFO used to block the run forever).
# usage: test_outputs.sh PATH_TO_SPANHEAD
set -u
cli=${1:?usage: test_outputs.sh PATH_TO_SPANHEAD}
. "$(dirname "$0")/lib.sh"
set -m # background jobs get their own process group and keep SIGINT (not ignored)
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
snapshot() { (cd "$1" && find . -printf '%p %y %l\n' | sort && find . -type f -exec md5sum {} + | sort); }

# a run whose dweight (128 MiB) takes a while to write; the signal tests also pause 0.5 s after
# each staged file (SPH_CLI_TEST_WRITE_DELAY_MS, src/cli/outset.c), so the signal sent once the
# first file shows lands while the set is written on any machine (a fast write raced the poll)
big=(run --N 8 --H 1024 --V 32768 --repeats 1)
small=(run --N 64 --H 32 --V 512 --entropy)
# long enough (about 2 s here) that the second run surely starts while the first computes, and
# that computing at all would show in the second run's time
slow=(run --N 256 --H 64 --V 2048 --entropy --repeats 300)

# wait_for TEST...: polls (10 ms) up to 20 s until the test holds; 1 on timeout
wait_for() {
    for _ in $(seq 2000); do "$@" && return 0; sleep 0.01; done
    return 1
}
# complete_set DIR: every output of "big" is there as a whole .npy, and no staging is left
complete_set() {
    local f
    for f in logprob lse logit_mean dhidden dweight; do
        python3 -c "import numpy, sys; numpy.load(sys.argv[1])" "$1/$f.npy" 2>/dev/null || return 1
    done
    [ -z "$(find "$1" -maxdepth 1 -name '.spanhead.*' 2>/dev/null)" ]
}
has_data() { [ -n "$(find "$1" -mindepth 2 -type f -size +0 2>/dev/null | head -1)" ]; }

# ---- signals while writing, into a new directory and into an existing one ------------------
for sig in TERM INT; do
    par=$tmp/sig-$sig
    mkdir -p "$par"
    SPH_CLI_TEST_WRITE_DELAY_MS=500 "$cli" "${big[@]}" --outputs "$par/out" >/dev/null 2>"$tmp/err" &
    pid=$!
    wait_for has_data "$par" || bad "sig-$sig: no staged data appeared"
    kill -s "$sig" "$pid"
    wait "$pid"
    rc=$?
    left=$(ls -A "$par")
    # the signal may land after the publishing step began (it is blocked there, then delivered):
    # then the whole set is there, from this run, and no staging; anything else is a failure
    if [ "$rc" -gt 128 ] && [ -z "$left" ]; then
        ok "SIG$sig while writing a new directory: nothing left (exit $rc)"
    elif [ "$rc" -gt 128 ] && [ "$left" = out ] && complete_set "$par/out"; then
        ok "SIG$sig while writing a new directory: it came during the publish, the whole set is there (exit $rc)"
    else
        bad "SIG$sig new directory: exit $rc, left '$left' ($(cat "$tmp/err"))"
    fi

    ex=$tmp/sig-ex-$sig
    mkdir -p "$ex"
    echo keep >"$ex/logprob.npy"
    echo mine >"$ex/notes.txt"
    before=$(snapshot "$ex")
    SPH_CLI_TEST_WRITE_DELAY_MS=500 "$cli" "${big[@]}" --outputs "$ex" >/dev/null 2>"$tmp/err" &
    pid=$!
    wait_for has_data "$ex" || bad "sig-ex-$sig: no staged data appeared"
    kill -s "$sig" "$pid"
    wait "$pid"
    rc=$?
    if [ "$rc" -gt 128 ] && [ "$(snapshot "$ex")" = "$before" ]; then
        ok "SIG$sig while writing into an existing directory: unchanged (exit $rc)"
    elif [ "$rc" -gt 128 ] && complete_set "$ex" && [ "$(cat "$ex/notes.txt")" = mine ] &&
        ! cmp -s "$ex/logprob.npy" <(echo keep); then
        ok "SIG$sig while writing into an existing directory: it came during the publish, the whole new set is there, notes.txt kept (exit $rc)"
    else
        bad "SIG$sig existing directory: exit $rc, changed:"; ls -la "$ex"
    fi
done

# during the computation (the staging is made before any work): nothing left either
par=$tmp/sig-compute
mkdir -p "$par"
"$cli" run --N 2048 --H 256 --V 8192 --repeats 50 --outputs "$par/out" >/dev/null 2>&1 &
pid=$!
wait_for test -d "$par/out" || bad "sig-compute: the target's placeholder never appeared"
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -gt 128 ] && [ -z "$(ls -A "$par")" ] && ok "SIGTERM while computing: nothing left" \
    || bad "SIGTERM while computing: exit $rc, left '$(ls -A "$par")'"

# between the placeholder's mkdir and the handlers' arming (a pause there, test hook): the
# signal waits until begin is done, so nothing is left either (before, the default action
# killed the run with the placeholder in place, which the check above hit on a loaded machine)
par=$tmp/sig-begin
mkdir -p "$par"
SPH_CLI_TEST_BEGIN_DELAY_MS=600 "$cli" run --N 64 --H 16 --V 128 --outputs "$par/out" \
    >/dev/null 2>&1 &
pid=$!
wait_for test -d "$par/out" || bad "sig-begin: the target's placeholder never appeared"
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -gt 128 ] && [ -z "$(ls -A "$par")" ] && ok "SIGTERM before the handlers are armed: nothing left" \
    || bad "SIGTERM before the handlers are armed: exit $rc, left '$(ls -A "$par")'"

# ---- two runs on one target ----------------------------------------------------------------
# expected: what seed 1 alone writes
"$cli" "${slow[@]}" --repeats 1 --seed 1 --outputs "$tmp/want" >/dev/null || bad "reference run failed"
for kind in new existing; do
    tgt=$tmp/two-$kind
    [ $kind = existing ] && mkdir -p "$tgt" && echo mine >"$tgt/notes.txt"
    # A: slow (many repeats), seed 1; B: seed 2, started once A holds the target
    tA0=$(date +%s.%N)
    "$cli" "${slow[@]}" --seed 1 --outputs "$tgt" >/dev/null 2>"$tmp/errA" &
    pid=$!
    if [ $kind = new ]; then wait_for test -d "$tgt"; else wait_for compgen -G "$tgt/.spanhead.*" >/dev/null; fi \
        || bad "two-$kind: A never took the target"
    t0=$(date +%s.%N)
    "$cli" "${slow[@]}" --seed 2 --outputs "$tgt" >/dev/null 2>"$tmp/errB"
    rcB=$?
    tB=$(echo "$(date +%s.%N) - $t0" | bc)
    wait "$pid"
    rcA=$?
    tA=$(echo "$(date +%s.%N) - $tA0" | bc)
    grep -q "another spanhead run is writing there" "$tmp/errB" && [ "$rcB" = 1 ] \
        && ok "two-$kind: the second run fails ($(cat "$tmp/errB" | head -c 90)...)" \
        || bad "two-$kind: second run exit $rcB: $(cat "$tmp/errB")"
    # before computing: the refusal takes a fraction of the first run's time (relative, so a
    # loaded machine slows both alike; a fixed bound in seconds flaked under load)
    [ "$(echo "$tB * 2 < $tA" | bc)" = 1 ] && ok "two-$kind: refused before computing (${tB}s of A's ${tA}s)" \
        || bad "two-$kind: the second run took ${tB}s, the first ${tA}s"
    [ "$rcA" = 0 ] || bad "two-$kind: first run exit $rcA: $(cat "$tmp/errA")"
    same=1
    for f in logprob entropy lse logit_mean dhidden dweight; do
        cmp -s "$tmp/want/$f.npy" "$tgt/$f.npy" || same=0
    done
    hidden=$(cd "$tgt" && ls -A | grep '^\.' || true)
    [ $same = 1 ] && [ -z "$hidden" ] && ok "two-$kind: the final set is the first run's alone" \
        || bad "two-$kind: final set mixed or incomplete (same=$same hidden='$hidden')"
    [ $kind = new ] || grep -q mine "$tgt/notes.txt" || bad "two-$kind: a file of another name was lost"
done

# ---- outputs that are not regular files: refused up front, nothing written ------------------
lnk=$tmp/links
mkdir -p "$lnk"
ln -s /dev/stderr "$lnk/entropy.npy"
before=$(snapshot "$lnk")
expect_fail link-stderr 1 "$lnk/entropy.npy: a symbolic link, not a regular file: refused" \
    "$cli" "${small[@]}" --outputs "$lnk"
[ "$(snapshot "$lnk")" = "$before" ] && ok "a link to /dev/stderr: refused, nothing written" \
    || { bad "link-stderr changed the directory:"; ls -la "$lnk"; }
rm "$lnk/entropy.npy"
mkfifo "$lnk/dweight.npy"
before=$(snapshot "$lnk")
expect_fail fifo 1 "$lnk/dweight.npy: a FIFO, not a regular file: refused" \
    timeout -s KILL 60 "$cli" "${small[@]}" --outputs "$lnk"
[ "$(snapshot "$lnk")" = "$before" ] && ok "a FIFO: refused, nothing written" \
    || { bad "fifo changed the directory:"; ls -la "$lnk"; }
rm "$lnk/dweight.npy"
# the policy loss's names too (loss.json)
pol=$tmp/pol
python3 - "$pol" <<'PY' || bad "policy inputs"
import os, sys, numpy as np
d = sys.argv[1]; os.makedirs(d); r = np.random.default_rng(5)
N, H, V = 24, 8, 40
np.save(f"{d}/hidden.npy", r.standard_normal((N, H)).astype(np.float32))
np.save(f"{d}/weight.npy", r.standard_normal((V, H)).astype(np.float32))
np.save(f"{d}/targets.npy", r.integers(0, V, N).astype(np.int64))
np.save(f"{d}/advantages.npy", r.standard_normal(N).astype(np.float32))
np.save(f"{d}/old_logprob.npy", (-r.random(N) * 3).astype(np.float32))
PY
mkdir -p "$tmp/pout"
ln -s /dev/stdout "$tmp/pout/loss.json"
expect_fail policy-link 1 "$tmp/pout/loss.json: a symbolic link, not a regular file: refused" \
    "$cli" run --inputs "$pol" --policy-loss ppo --outputs "$tmp/pout"
[ "$(ls -A "$tmp/pout")" = "loss.json" ] && ok "policy: a link refused, nothing written" \
    || bad "policy link: left $(ls -A "$tmp/pout")"

[ "$fails" -eq 0 ] && echo "all output tests passed" && exit 0
echo "$fails output test(s) failed"
exit 1
