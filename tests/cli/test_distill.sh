#!/usr/bin/env bash
# test_distill.sh - `spanhead run --distill forward-kl|reverse-kl|jsd --inputs DIR --outputs DIR`
# (issue 25 item 4): every kind (jsd at 0.3 and its special cases), dense and sparse teachers,
# every reduction, a teacher temperature, against an independent NumPy float64 oracle
# (distill_oracle.py: loss.json, dhidden.npy, dweight.npy); --check and --json on f32 and bf16;
# bad input fails with its message and exit code and leaves the outputs directory as it was.
set -uo pipefail
cli=${1:?usage: test_distill.sh path/to/spanhead}
here=$(cd "$(dirname "$0")" && pwd)
. "$(dirname "$0")/lib.sh" # tmp, fails, ok, bad, expect_rc
if ! python3 -c 'import numpy' 2>/dev/null; then
    echo "skipped: numpy is not installed"
    exit 77
fi
oracle() { python3 "$here/distill_oracle.py" "$@"; }
seed=${SPH_TEST_SEED:-$RANDOM}
echo "test_distill: seed $seed"
for t in dense sparse; do
    mkdir -p "$tmp/$t" "$tmp/${t}16" "$tmp/${t}T"
    oracle gen "$tmp/$t" "$seed" $t || exit 1
    oracle gen "$tmp/${t}16" "$seed" $t --bf16 || exit 1
    oracle gen "$tmp/${t}T" "$seed" $t --trows || exit 1
done
mkdir -p "$tmp/denseTT" "$tmp/denseTTT"
oracle gen "$tmp/denseTT" "$seed" dense --ttrows || exit 1          # the teacher's alone
oracle gen "$tmp/denseTTT" "$seed" dense --trows --ttrows || exit 1 # with the student's
# temperature.npy: one temperature per row; teacher_temperature.npy: the dense teacher's
for t in denseT sparseT denseTT denseTTT; do
    if "$cli" run --distill jsd --beta 0.3 --inputs "$tmp/$t" --outputs "$tmp/o$t" --check \
        > "$tmp/log" 2>&1 && oracle check "$tmp/$t" "$tmp/o$t" jsd 0.3 mean; then
        ok "$t: temperature.npy / teacher_temperature.npy"
    else
        bad "$t: temperature.npy / teacher_temperature.npy"; tail -3 "$tmp/log"
    fi
done

n=0
for t in dense sparse; do
    for kb in "forward-kl 0.5" "reverse-kl 0.5" "jsd 0.3" "jsd 0" "jsd 1"; do
        set -- $kb
        red=$([[ $((n % 3)) == 0 ]] && echo mean || ([[ $((n % 3)) == 1 ]] && echo sum || echo none))
        tt=$([[ $t == dense && $n == 1 ]] && echo 1.7 || echo 0)
        ttflag=$([[ $tt != 0 ]] && echo "--teacher-temperature $tt" || true)
        out="$tmp/out$n"
        if "$cli" run --distill "$1" --beta "$2" --reduction $red $ttflag --inputs "$tmp/$t" \
            --outputs "$out" > "$tmp/log" 2>&1 && oracle check "$tmp/$t" "$out" "$1" "$2" $red $tt; then
            ok "$t $1 beta=$2 $red tt=$tt"
        else
            bad "$t $1 beta=$2 $red tt=$tt"; tail -3 "$tmp/log"
        fi
        n=$((n + 1))
    done
done

# --num-tokens: reduction mean over a global batch's T (larger than the active rows here)
for t in dense sparse; do
    if "$cli" run --distill reverse-kl --num-tokens 41 --inputs "$tmp/$t" --outputs "$tmp/nt$t" \
        --check > "$tmp/log" 2>&1 && oracle check "$tmp/$t" "$tmp/nt$t" reverse-kl 0.5 mean 0 41; then
        ok "$t --num-tokens 41"
    else
        bad "$t --num-tokens 41"; tail -3 "$tmp/log"
    fi
done
out=$("$cli" run --distill jsd --num-tokens 0 --inputs "$tmp/dense" 2>&1)
rc=$?
if [[ $rc == 2 && $out == *"--num-tokens"* ]]; then
    ok "--num-tokens 0 (exit 2, the option named)"
else
    bad "--num-tokens 0: exit $rc: $out"
fi

# --check --json, f32 and bf16, the reference kernels
for d in dense sparse dense16 sparse16; do
    j=$("$cli" run --distill jsd --beta 0.4 --dtype bf16 --inputs "$tmp/$d" --check --json 2>&1)
    if [[ $? == 0 ]] && python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["check"]["passed"]' "$j"; then
        ok "--check --json $d"
    else
        bad "--check --json $d: $j"
    fi
done

mkdir -p "$tmp/keep" && echo old > "$tmp/keep/loss.json"
expect_rc 1 "distill.beta: 1.5" -- "$cli" run --distill jsd --beta 1.5 --inputs "$tmp/sparse" --outputs "$tmp/keep"
expect_rc 1 "teacher_temperature" -- "$cli" run --distill forward-kl --teacher-temperature -1 --inputs "$tmp/dense" --outputs "$tmp/keep"
# 0 is the C API's "unset": given on the command line it is a usage error, not the student's T
expect_rc 2 "--teacher-temperature: 0, expected T > 0" -- "$cli" run --distill forward-kl --teacher-temperature 0 --inputs "$tmp/dense" --outputs "$tmp/keep"
expect_rc 2 "needs --inputs" -- "$cli" run --distill jsd
expect_rc 2 "" -- "$cli" run --distill kl --inputs "$tmp/dense"
expect_rc 1 "give one" -- "$cli" run --distill jsd --temperature 2 --inputs "$tmp/denseT"
expect_rc 1 "teacher_temperature.npy and --teacher-temperature: give one" -- "$cli" run \
    --distill jsd --teacher-temperature 2 --inputs "$tmp/denseTT" --outputs "$tmp/keep"
cp -r "$tmp/denseTT" "$tmp/badtt"
python3 -c "import numpy as np; a=np.load('$tmp/badtt/teacher_temperature.npy'); a[5]=0; np.save('$tmp/badtt/teacher_temperature.npy', a)"
expect_rc 1 "teacher_temperature_rows[5]: 0" -- "$cli" run --distill jsd --inputs "$tmp/badtt" --outputs "$tmp/keep"
python3 -c "import numpy as np; np.save('$tmp/badtt/teacher_temperature.npy', np.ones((3, 2), np.float32))"
expect_rc 1 "teacher_temperature.npy: <f4 of 2 dims" -- "$cli" run --distill jsd --inputs "$tmp/badtt" --outputs "$tmp/keep"
cp -r "$tmp/sparse" "$tmp/sparsett" && cp "$tmp/denseTT/teacher_temperature.npy" "$tmp/sparsett/"
expect_rc 1 "teacher_temperature_rows: given with a sparse teacher" -- "$cli" run --distill jsd --inputs "$tmp/sparsett" --outputs "$tmp/keep"
expect_rc 1 "teacher_temperature: given with a sparse teacher" -- "$cli" run --distill jsd --teacher-temperature 1.5 --inputs "$tmp/sparse" --outputs "$tmp/keep"
# (the MPI runner as a singleton: Open MPI's allocations outlive MPI_Finalize, so a sanitizer
# build checks this one for memory errors but not for leaks, as test_errors.sh does)
expect_rc 2 "needs 2 ranks" -- env ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
    "$cli" run --distill jsd --tp 2 --inputs "$tmp/dense"
cp -r "$tmp/sparse" "$tmp/badids"
python3 -c "import numpy as np; a=np.load('$tmp/badids/teacher_topk_ids.npy'); a[0,1]=a[0,0]; np.save('$tmp/badids/teacher_topk_ids.npy', a)"
python3 -c "import numpy as np; m=np.load('$tmp/badids/mask.npy'); m[0]=1; np.save('$tmp/badids/mask.npy', m)"
expect_rc 1 "appears twice" -- "$cli" run --distill jsd --inputs "$tmp/badids" --outputs "$tmp/keep"
cp -r "$tmp/dense" "$tmp/both" && cp "$tmp/sparse/teacher_topk_ids.npy" "$tmp/sparse/teacher_topk_logprobs.npy" "$tmp/both/"
expect_rc 1 "exactly one pair" -- "$cli" run --distill jsd --inputs "$tmp/both" --outputs "$tmp/keep"
if [[ $(cat "$tmp/keep/loss.json") == old && $(ls "$tmp/keep") == loss.json ]]; then
    ok "outputs untouched by the failed runs"
else
    bad "a failed run changed $tmp/keep"
fi
[[ $fails == 0 ]] || { echo "$fails failed"; exit 1; }
echo "all passed"
