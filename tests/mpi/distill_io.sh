#!/usr/bin/env bash
# distill_io.sh - `spanhead run --tp T --distill ...` under mpirun: every rank reads the .npy
# inputs and holds its vocabulary shard of weight / teacher_weight, rank 0 gathers, checks
# against one process (--check: the float64 reference) and writes what one process writes;
# the independent NumPy float64 oracle (tests/cli/distill_oracle.py) checks those files.
# T = 2 and 3, dense and sparse teachers, every kind, every reduction, temperature.npy; CP
# (--cp 2 and 3, with --tp 2, --num-tokens) summed over the ranks. The runner itself
# checks that every rank holds bitwise the same loss. Then the disagreeing cases: --tp not
# matching the world, and ranks given different --beta (every rank fails with the option's
# name, exit 2).
# usage: distill_io.sh SPANHEAD MPIRUN PYTHON
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
echo "distill_io: seed $seed"
for t in dense sparse; do
    mkdir -p "$tmp/$t"
    "$py" "$here/../cli/distill_oracle.py" gen "$tmp/$t" "$seed" $t || exit 1
done
fails=0
n=0
for t in dense sparse; do
    for kb in "forward-kl 0.5 mean" "reverse-kl 0.5 sum" "jsd 0.3 none" "jsd 1 mean"; do
        set -- $kb
        np=$((2 + n % 2))
        n=$((n + 1))
        out=$tmp/out$n
        if "$mpirun" --oversubscribe --allow-run-as-root -np $np "$cli" run --tp $np --distill "$1" \
            --beta "$2" --reduction "$3" --inputs "$tmp/$t" --outputs "$out" --check \
            > "$tmp/log$n" 2>&1 && "$py" "$here/../cli/distill_oracle.py" check "$tmp/$t" "$out" "$1" "$2" "$3"; then
            echo "ok   np=$np $t $1 beta=$2 $3"
        else
            echo "FAIL np=$np $t $1 beta=$2 $3"; tail -5 "$tmp/log$n"; fails=$((fails + 1))
        fi
    done
done
# CP: the rows cut over a seq_comm group (--cp), alone and with TP (4 ranks), mean over all
# the rows' active rows (or --num-tokens), the ranks' losses and gradients summed on rank 0
for spec in "1 2 dense forward-kl mean 0" "1 3 sparse jsd mean 0" "2 2 dense jsd sum 0" \
            "2 2 sparse reverse-kl mean 0" "1 2 sparse forward-kl none 0" "2 2 dense jsd mean 37"; do
    set -- $spec
    tp=$1 cp=$2 t=$3 kind=$4 red=$5 nt=$6
    np=$((tp * cp))
    n=$((n + 1))
    out=$tmp/out$n
    ntflag=$([[ $nt != 0 ]] && echo "--num-tokens $nt" || true)
    if "$mpirun" --oversubscribe --allow-run-as-root -np $np "$cli" run --tp $tp --cp $cp \
        --distill $kind --beta 0.3 --reduction $red $ntflag --inputs "$tmp/$t" --outputs "$out" \
        --check > "$tmp/log$n" 2>&1 &&
        "$py" "$here/../cli/distill_oracle.py" check "$tmp/$t" "$out" $kind 0.3 $red 0 $nt; then
        echo "ok   np=$np tp=$tp cp=$cp $t $kind $red num_tokens=$nt"
    else
        echo "FAIL np=$np tp=$tp cp=$cp $t $kind $red num_tokens=$nt"; tail -5 "$tmp/log$n"
        fails=$((fails + 1))
    fi
done
# temperature.npy (one temperature per row) over 2 ranks
mkdir -p "$tmp/trows"
"$py" "$here/../cli/distill_oracle.py" gen "$tmp/trows" "$seed" dense --trows || exit 1
if "$mpirun" --oversubscribe --allow-run-as-root -np 2 "$cli" run --tp 2 --distill jsd --beta 0.4 \
    --inputs "$tmp/trows" --outputs "$tmp/otrows" --check > "$tmp/logT" 2>&1 &&
    "$py" "$here/../cli/distill_oracle.py" check "$tmp/trows" "$tmp/otrows" jsd 0.4 mean; then
    echo "ok   np=2 temperature.npy"
else
    echo "FAIL np=2 temperature.npy"; tail -5 "$tmp/logT"; fails=$((fails + 1))
fi
# --tp that is not the world
out=$("$mpirun" --oversubscribe --allow-run-as-root -np 2 "$cli" run --tp 3 --distill jsd \
      --inputs "$tmp/dense" 2>&1)
rc=$?
if [[ $rc == 2 && $out == *"needs 3 ranks, but mpirun started 2"* ]]; then
    echo "ok   --tp 3 on 2 ranks (exit 2)"
else
    echo "FAIL --tp 3 on 2 ranks: exit $rc: $out" | tail -3; fails=$((fails + 1))
fi
# ranks that disagree on an option: every rank fails before any work, naming it
cat > "$tmp/beta.sh" <<EOS
#!/usr/bin/env bash
b=0.3; [[ \${OMPI_COMM_WORLD_RANK:-0} == 1 ]] && b=0.4
exec "$cli" run --tp 2 --distill jsd --beta \$b --inputs "$tmp/dense"
EOS
chmod +x "$tmp/beta.sh"
out=$("$mpirun" --oversubscribe --allow-run-as-root -np 2 "$tmp/beta.sh" 2>&1)
rc=$?
if [[ $rc == 2 && $out == *"--beta"* ]]; then
    echo "ok   ranks with different --beta (exit 2, the option named)"
else
    echo "FAIL ranks with different --beta: exit $rc"; echo "$out" | tail -4; fails=$((fails + 1))
fi
[[ $fails == 0 ]] || { echo "$fails failed"; exit 1; }
echo "all passed"
