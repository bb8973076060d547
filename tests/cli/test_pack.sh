#!/usr/bin/env bash
# CLI test of `spanhead pack`: hand-worked packings for each algorithm, both input formats,
# bin-count targets, a large random input checked in Python, --help, and error exits.
# usage: test_pack.sh PATH_TO_SPANHEAD
set -u
cli=${1:?usage: test_pack.sh PATH_TO_SPANHEAD}
. "$(dirname "$0")/lib.sh"

echo '[6,5,4,3,2]' >"$tmp/a.json"
printf '6\n5\n\n  4\n3\n2' >"$tmp/a.txt"
expect_json ffd '{"bins":[[0,2],[1,3,4]],"bin_lengths":[[6,4],[5,3,2]],"bin_tokens":[10,10],"utilization":1}' \
    "$cli" pack --capacity 10 "$tmp/a.json"
expect_json ffd-lines '{"bins":[[0,2],[1,3,4]],"bin_lengths":[[6,4],[5,3,2]],"bin_tokens":[10,10],"utilization":1}' \
    "$cli" pack --capacity 10 --algorithm ffd "$tmp/a.txt"
expect_json stdin '{"bins":[[0,2],[1,3,4]],"bin_lengths":[[6,4],[5,3,2]],"bin_tokens":[10,10],"utilization":1}' \
    bash -c "\"$cli\" pack --capacity=10 - <\"$tmp/a.json\""
expect_json min-bins '{"bins":[[2],[1,3,4],[0]],"bin_lengths":[[4],[5,3,2],[6]],"bin_tokens":[4,10,6],"utilization":0.666666667}' \
    "$cli" pack --capacity 10 --min-bins 3 "$tmp/a.json"
expect_json bin-multiple '{"bins":[[2],[3,4],[0],[1]],"bin_lengths":[[4],[3,2],[6],[5]],"bin_tokens":[4,5,6,5],"utilization":0.5}' \
    "$cli" pack --capacity 10 --min-bins 3 --bin-multiple 2 "$tmp/a.json"
expect_json balanced '{"bins":[[0,3],[1,2],[4]],"bin_lengths":[[6,3],[5,4],[2]],"bin_tokens":[9,9,2],"utilization":0.666666667}' \
    "$cli" pack --capacity 10 --algorithm balanced "$tmp/a.json"
echo '[11,5,4,4]' >"$tmp/m.json"
expect_json mffd '{"bins":[[0,1,3],[2]],"bin_lengths":[[11,5,4],[4]],"bin_tokens":[20,4],"utilization":0.6}' \
    "$cli" pack --capacity 20 --algorithm mffd "$tmp/m.json"
echo '[15,3,4]' >"$tmp/s.json"
expect_json soft-cap '{"bins":[[0],[1,2]],"bin_lengths":[[15],[3,4]],"bin_tokens":[15,7],"utilization":1.1}' \
    "$cli" pack --capacity 10 --algorithm balanced "$tmp/s.json"
echo '[5,9,3]' >"$tmp/p.json"
expect_json aligned '{"bins":[[1],[0,2]],"bin_lengths":[[9],[5,3]],"bin_tokens":[16,16],"utilization":0.8}' \
    "$cli" pack --capacity 20 --tp 2 --cp 2 "$tmp/p.json"
echo '[]' >"$tmp/e.json"
# issue 26 case 17: a tiny utilization is a number (%.9g), not 0.000000
echo '[1]' >"$tmp/one.json"
expect_json tiny-util '{"bins":[[0]],"bin_lengths":[[1]],"bin_tokens":[1],"utilization":5.42101086e-19}' \
    "$cli" pack --capacity 1844674407370955161 "$tmp/one.json"
expect_json empty '{"bins":[],"bin_lengths":[],"bin_tokens":[],"utilization":0}' "$cli" pack --capacity 10 "$tmp/e.json"

# a large random input: every index once, no bin over capacity, target bin count met
python3 -c '
import json, random
random.seed(7)
print(json.dumps([random.randint(1, 3000) for _ in range(100000)]))' >"$tmp/big.json"
for algo in ffd mffd balanced; do
    if ! "$cli" pack --capacity 8192 --algorithm $algo --tp 2 --cp 2 --bin-multiple 8 "$tmp/big.json" >"$tmp/big.out" 2>"$tmp/err"; then
        echo "FAIL big-$algo: $(cat "$tmp/err")"; fails=$((fails + 1)); continue
    fi
    python3 - "$tmp/big.json" "$tmp/big.out" $algo <<'PY' || { echo "FAIL big-$algo"; fails=$((fails + 1)); }
import json, sys
lens = json.load(open(sys.argv[1])); out = json.load(open(sys.argv[2]))
assert list(out) == ["bins", "bin_lengths", "bin_tokens", "utilization"], list(out)
assert out["bin_lengths"] == [[lens[i] for i in b] for b in out["bins"]]
seen = sorted(i for b in out["bins"] for i in b)
assert seen == list(range(len(lens))), "every index exactly once"
assert len(out["bins"]) % 8 == 0
for b, t in zip(out["bins"], out["bin_tokens"]):
    assert b and t == sum((lens[i] + 7) // 8 * 8 for i in b) and t <= 8192, (b, t)
lower = -(-sum((l + 7) // 8 * 8 for l in lens) // 8192)
slack = 1.06 if sys.argv[3] == "balanced" else 1.01
assert len(out["bins"]) <= lower * slack + 8, (len(out["bins"]), lower)
PY
done

"$cli" pack --help >"$tmp/help" 2>&1 && grep -q "usage: spanhead pack" "$tmp/help" \
    || { echo "FAIL help"; fails=$((fails + 1)); }

expect_fail no-capacity 2 "--capacity is required" "$cli" pack "$tmp/a.json"
expect_fail bad-capacity 2 "--capacity 'abc': expected a count (like 4096 or 16K) >= 1" "$cli" pack --capacity abc "$tmp/a.json"
expect_fail zero-capacity 2 "--capacity '0'" "$cli" pack --capacity 0 "$tmp/a.json"
expect_fail bad-algo 2 "--algorithm 'bfd': expected ffd, mffd or balanced" "$cli" pack --capacity 10 --algorithm bfd "$tmp/a.json"
expect_fail bad-min-bins 2 "--min-bins '-1'" "$cli" pack --capacity 10 --min-bins -1 "$tmp/a.json"
expect_fail bad-multiple 2 "--bin-multiple '0'" "$cli" pack --capacity 10 --bin-multiple 0 "$tmp/a.json"
expect_fail bad-fp8 2 "--fp8 'e4m3'" "$cli" pack --capacity 10 --fp8 e4m3 "$tmp/a.json"
expect_fail no-file 2 "expected a FILE or -" "$cli" pack --capacity 10
expect_fail extra-arg 2 "extra argument" "$cli" pack --capacity 10 "$tmp/a.json" "$tmp/a.json"
expect_fail unknown-opt 2 "unknown option '--bins'" "$cli" pack --capacity 10 --bins 3 "$tmp/a.json"
expect_fail missing-file 1 "cannot open" "$cli" pack --capacity 10 "$tmp/nope.json"
echo '[6,5,' >"$tmp/bad.json"
expect_fail malformed 1 "malformed JSON" "$cli" pack --capacity 10 "$tmp/bad.json"
echo '[6,2.5]' >"$tmp/bad.json"
expect_fail fraction 1 "lengths[1]: 2.5, not an integer, expected an integer" "$cli" pack --capacity 10 "$tmp/bad.json"
echo '[6,"7"]' >"$tmp/bad.json"
expect_fail string 1 "lengths[1]: is a string" "$cli" pack --capacity 10 "$tmp/bad.json"
echo '{"lengths":[6]}' >"$tmp/bad.json"
expect_fail object 1 "line 1" "$cli" pack --capacity 10 "$tmp/bad.json"
printf '6\nseven\n' >"$tmp/bad.txt"
expect_fail bad-line 1 "line 2: 'seven' is not an integer" "$cli" pack --capacity 10 "$tmp/bad.txt"
echo '[6,0,3]' >"$tmp/bad.json"
expect_fail zero-length 1 "lengths[1]: 0, expected >= 1" "$cli" pack --capacity 10 "$tmp/bad.json"
echo '[6,-2,3]' >"$tmp/bad.json"
expect_fail neg-length 1 "lengths[1]: -2" "$cli" pack --capacity 10 "$tmp/bad.json"
echo '[6,11,3]' >"$tmp/bad.json"
expect_fail too-long 1 "lengths[1]: 11 (padded 11) exceeds the bin capacity 10" "$cli" pack --capacity 10 "$tmp/bad.json"
expect_fail too-long-mffd 1 "exceeds the bin capacity" "$cli" pack --capacity 10 --algorithm mffd "$tmp/bad.json"
expect_fail infeasible 1 "but only 5 sequences" "$cli" pack --capacity 10 --min-bins 6 "$tmp/a.json"
expect_fail infeasible-multiple 1 "only 5 sequences" "$cli" pack --capacity 10 --bin-multiple 7 "$tmp/a.json"
expect_fail below-alignment 1 "below the total alignment 8" "$cli" pack --capacity 7 --tp 2 --cp 2 "$tmp/a.json"
python3 -c 'print([9007199254740991] * 1025)' >"$tmp/huge.json"
expect_fail overflow 1 "overflows int64" "$cli" pack --capacity 10 --algorithm balanced "$tmp/huge.json"
echo '[9007199254740992]' >"$tmp/bad.json"
expect_fail beyond-2-53 1 "lengths[0]: 9007199254740992, outside +-(2^53 - 1)" "$cli" pack --capacity 10 "$tmp/bad.json"

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "pack CLI: all checks passed"
