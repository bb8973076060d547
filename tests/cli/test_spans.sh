#!/usr/bin/env bash
# CLI test of `spanhead spans`: hand-worked masks and spans for unpacked rows, packed rows,
# sub-sequences and attention masks under TP/CP, the demo batch checked in Python across CP
# ranks, --help, and error exits.
# usage: test_spans.sh PATH_TO_SPANHEAD
set -u
cli=${1:?usage: test_spans.sh PATH_TO_SPANHEAD}
. "$(dirname "$0")/lib.sh"


data=${SPH_TEST_DATA:-$(cd "$(dirname "$0")/.." && pwd)/data}
# B=2, S=6, A=3: rows 2..4 of each length-6 row carry the loss mask
echo '{"layout":"unpacked","sequence_length":6,"num_actions":3,"loss_mask":[[1,0,1],[0,1,1]]}' >"$tmp/u.json"
# the default gap is 0: exact spans
expect_json unpacked '{"active_mask":[0,0,1,0,1,0,0,0,0,1,1,0],"active_rows":4,"local_rows":12,"local_active_rows":4,"spans":[[2,3],[4,5],[9,11]]}' \
    "$cli" spans "$tmp/u.json"
expect_json unpacked-gap128 '{"active_mask":[0,0,1,0,1,0,0,0,0,1,1,0],"active_rows":4,"local_rows":12,"local_active_rows":4,"spans":[[2,11]]}' \
    "$cli" spans --gap 128 "$tmp/u.json"
expect_json unpacked-stdin '{"active_mask":[0,0,1,0,1,0,0,0,0,1,1,0],"active_rows":4,"local_rows":12,"local_active_rows":4,"spans":[[2,5],[9,11]]}' \
    bash -c "\"$cli\" spans --gap=1 - <\"$tmp/u.json\""
# packed rows under TP2 CP2: each row padded to 8, rank 1 holds segment rows 2..5
sed 's/"unpacked"/"packed"/' "$tmp/u.json" >"$tmp/p.json"
expect_json packed-cp-rank1 '{"active_mask":[0,0,1,0,1,0,0,0,0,0,0,1,1,0,0,0],"active_rows":4,"local_rows":8,"local_active_rows":4,"spans":[[0,1],[2,3],[5,7]]}' \
    "$cli" spans --tp 2 --cp 2 --cp-rank 1 --gap 0 "$tmp/p.json"
expect_json packed-cp-rank0 '{"active_mask":[0,0,1,0,1,0,0,0,0,0,0,1,1,0,0,0],"active_rows":4,"local_rows":8,"local_active_rows":0,"spans":[]}' \
    "$cli" spans --tp 2 --cp 2 --cp-rank 0 "$tmp/p.json"
# sub-sequences of 4 and 5 tokens in a row of 10, loss on offsets 1..4 of the second
echo '{"layout":"packed","sequence_length":10,"num_actions":6,"loss_mask":[[0,1,1,1,1,0]],"sub_seq_lengths":[[4,5]]}' >"$tmp/s.json"
expect_json subseq '{"active_mask":[0,0,0,0,1,1,1,1,0],"active_rows":4,"local_rows":9,"local_active_rows":4,"spans":[[4,8]]}' \
    "$cli" spans "$tmp/s.json"
expect_json subseq-cp2 '{"active_mask":[0,0,0,0,1,1,1,1,0,0,0,0],"active_rows":4,"local_rows":6,"local_active_rows":2,"spans":[[2,4]]}' \
    "$cli" spans --cp 2 --cp-rank 1 "$tmp/s.json"
# attention mask: attended columns 2..6; booleans accepted
echo '{"layout":"packed","sequence_length":8,"num_actions":4,"loss_mask":[[true,true,false,false]],"attention_mask":[[0,0,1,1,1,1,1,0]]}' >"$tmp/a.json"
expect_json attention '{"active_mask":[0,1,1,0,0],"active_rows":2,"local_rows":5,"local_active_rows":2,"spans":[[1,3]]}' \
    "$cli" spans "$tmp/a.json"

# the demo batch: every CP rank's output is consistent, counts add up, spans cover the rows
for cfg in "1 1" "2 2" "4 2" "1 4"; do
    set -- $cfg
    tp=$1 cp=$2
    for ((r = 0; r < cp; r++)); do
        "$cli" spans --tp "$tp" --cp "$cp" --cp-rank "$r" --gap 16 "$data/demo/batch.json" >"$tmp/demo.$r" 2>"$tmp/err" \
            || { echo "FAIL demo tp=$tp cp=$cp rank=$r: $(cat "$tmp/err")"; fails=$((fails + 1)); }
    done
    python3 - "$tmp" "$cp" "$tp" "$data/demo/batch.json" <<'PY' || { echo "FAIL demo tp=$tp cp=$cp"; fails=$((fails + 1)); }
import json, sys
tmp, cp, tp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
batch = json.load(open(sys.argv[4]))
outs = [json.load(open(f"{tmp}/demo.{r}")) for r in range(cp)]
for o in outs:
    assert list(o) == ["active_mask", "active_rows", "local_rows", "local_active_rows", "spans"]
    assert o["active_mask"] == outs[0]["active_mask"] and o["active_rows"] == outs[0]["active_rows"]
mask = outs[0]["active_mask"]
assert sum(mask) == outs[0]["active_rows"] == sum(sum(r) for r in batch["loss_mask"])
assert len(mask) % (2 * tp * cp if cp > 1 else tp) == 0
assert sum(o["local_active_rows"] for o in outs) == outs[0]["active_rows"]
for o in outs:
    assert o["local_rows"] * cp == len(mask)
    prev = -1
    covered = 0
    for s, e in o["spans"]:
        assert prev < s < e <= o["local_rows"]
        covered += e - s
        prev = e
    assert covered >= o["local_active_rows"]
PY
done

"$cli" spans --help >"$tmp/help" 2>&1 && grep -q "usage: spanhead spans" "$tmp/help" \
    || { echo "FAIL help"; fails=$((fails + 1)); }

expect_fail no-file 2 "expected a FILE or -" "$cli" spans --tp 2
expect_fail extra-arg 2 "extra argument" "$cli" spans "$tmp/u.json" "$tmp/u.json"
expect_fail bad-rank 2 "--cp-rank 'one'" "$cli" spans --cp-rank one "$tmp/u.json"
expect_fail rank-range 2 "--cp-rank 2: expected < --cp = 2" "$cli" spans --cp 2 --cp-rank 2 "$tmp/p.json"
expect_fail bad-gap 2 "--gap '-1'" "$cli" spans --gap -1 "$tmp/u.json"
expect_fail bad-tp 2 "--tp '0'" "$cli" spans --tp 0 "$tmp/u.json"
expect_fail unknown-opt 2 "unknown option '--rank'" "$cli" spans --rank 1 "$tmp/u.json"
expect_fail missing-file 1 "cannot open" "$cli" spans "$tmp/nope.json"
bad() { echo "$1" >"$tmp/bad.json"; }
bad '{"layout":"packed","sequence_length":6,'
expect_fail malformed 1 "malformed JSON" "$cli" spans "$tmp/bad.json"
bad '[1,2]'
expect_fail not-object 1 "top level: is an array, expected an object" "$cli" spans "$tmp/bad.json"
bad '{"sequence_length":6,"num_actions":3,"loss_mask":[]}'
expect_fail no-layout 1 "layout: missing" "$cli" spans "$tmp/bad.json"
bad '{"layout":"pack","sequence_length":6,"num_actions":3,"loss_mask":[]}'
expect_fail bad-layout 1 "layout: \"pack\", expected \"packed\" or \"unpacked\"" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","num_actions":3,"loss_mask":[]}'
expect_fail no-seq-len 1 "sequence_length: missing, expected an integer >= 1" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":6.5,"num_actions":3,"loss_mask":[]}'
expect_fail frac-seq-len 1 "sequence_length: 6.5, not an integer" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":6,"num_actions":6,"loss_mask":[]}'
expect_fail actions 1 "num_actions: 6, expected <= sequence_length - 1 = 5" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":6,"num_actions":"3","loss_mask":[]}'
expect_fail actions-type 1 "num_actions: a string" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":6,"num_actions":3,"loss_mask":[[1,0,1],[0,1]]}'
expect_fail mask-shape 1 "loss_mask[1]: 2 entries, expected 3" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":6,"num_actions":3,"loss_mask":[[1,0,2]]}'
expect_fail mask-value 1 "loss_mask[0][2]: is a number, expected 0 or 1" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":6,"num_actions":3,"loss_mask":[[1,0,1]],"attention_mask":[[1,1,1,1,1,1],[1,1,1,1,1,1]]}'
expect_fail att-rows 1 "attention_mask: 2 rows, expected 1" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":6,"num_actions":3,"loss_mask":[[1,0,1]],"attention_mask":[[1,1,1,1,1]]}'
expect_fail att-shape 1 "attention_mask[0]: 5 entries, expected 6" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":6,"num_actions":3,"loss_mask":[[1,0,1]],"sub_seq_length":[[6]]}'
expect_fail unknown-key 1 "unknown key \"sub_seq_length\"" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":6,"num_actions":3,"loss_mask":[[1,0,1]],"sub_seq_lengths":[[4,3]]}'
expect_fail subseq-sum 1 "sub_seq_lengths[0]: sum of lengths exceeds seq_len = 6" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":6,"num_actions":3,"loss_mask":[[1,0,1]],"sub_seq_lengths":[[0,3]]}'
expect_fail subseq-zero 1 "sub_seq_lengths[0][0]: 0" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":6,"num_actions":3,"loss_mask":[[1,0,1]],"sub_seq_lengths":[[3,"2"]]}'
expect_fail subseq-type 1 "sub_seq_lengths[0][1]: is a string" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":6,"num_actions":3,"loss_mask":[[0,0,1]],"sub_seq_lengths":[[4]]}'
expect_fail loss-on-padding 1 "loss_mask[0][2]: is 1 but column 5 of row 0 is padding" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":6,"num_actions":3,"loss_mask":[[1,1,1]],"sub_seq_lengths":[[3,3]]}'
expect_fail loss-on-first 1 "the first token of its sequence" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":6,"num_actions":3,"loss_mask":[[1,0,1]],"sub_seq_lengths":[[6]],"attention_mask":[[1,1,1,1,1,1]]}'
expect_fail both 1 "both attention_mask and sub_seq_lengths" "$cli" spans "$tmp/bad.json"
expect_fail unpacked-cp 1 "unpacked spans: cp = 2" "$cli" spans --cp 2 "$tmp/u.json"
expect_fail unpacked-padding 1 "seq_len 6 is not a multiple of the unpacked alignment 4" "$cli" spans --tp 4 "$tmp/u.json"
expect_fail unpacked-fp8 1 "unpacked alignment 16" "$cli" spans --fp8 blockwise "$tmp/u.json"
# issue 26 case 17: integers past 2^53 say so (they used to be "out of range, expected >= 1")
bad '{"layout":"packed","sequence_length":1e16,"num_actions":3,"loss_mask":[[1,0,1]]}'
expect_fail seq-len-2-53 1 "sequence_length: 10000000000000000, outside +-(2^53 - 1) (past it a JSON number is no longer an exact integer), expected an integer >= 1" \
    "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":6.5,"num_actions":3,"loss_mask":[[1,0,1]]}'
expect_fail seq-len-frac 1 "sequence_length: 6.5, not an integer, expected an integer >= 1" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":0,"num_actions":3,"loss_mask":[[1,0,1]]}'
expect_fail seq-len-0 1 "sequence_length: 0, expected an integer >= 1" "$cli" spans "$tmp/bad.json"
bad '{"layout":"packed","sequence_length":6,"num_actions":-9007199254740993,"loss_mask":[[1,0,1]]}'
expect_fail num-actions-2-53 1 "num_actions: -9007199254740992, outside +-(2^53 - 1)" "$cli" spans "$tmp/bad.json"

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "spans CLI: all checks passed"
