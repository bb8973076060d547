#!/usr/bin/env bash
# CLI test of `spanhead layout`: hand-worked layouts, key order, --help, and error exits.
# usage: test_layout.sh PATH_TO_SPANHEAD
set -u
cli=${1:?usage: test_layout.sh PATH_TO_SPANHEAD}
. "$(dirname "$0")/lib.sh"

expect_json tp2cp2 '{"sequence_align":8,"total_align":8,"padded_lengths":[1200,880,1808,96],"cu_seqlens_padded":[0,1200,2080,3888,3984]}' \
    "$cli" layout --tp 2 --cp 2 1200 873 1801 95
expect_json mxfp8 '{"sequence_align":8,"total_align":128,"padded_lengths":[1200,880,1808,208],"cu_seqlens_padded":[0,1200,2080,3888,4096]}' \
    "$cli" layout --tp 2 --cp 2 --fp8 mxfp8 1200 873 1801 95
expect_json defaults '{"sequence_align":1,"total_align":1,"padded_lengths":[3,5],"cu_seqlens_padded":[0,3,8]}' \
    "$cli" layout 3 5
expect_json tp2 '{"sequence_align":1,"total_align":2,"padded_lengths":[3,5],"cu_seqlens_padded":[0,3,8]}' \
    "$cli" layout --tp=2 3 4
expect_json blockwise '{"sequence_align":1,"total_align":16,"padded_lengths":[16],"cu_seqlens_padded":[0,16]}' \
    "$cli" layout --fp8 blockwise 7

"$cli" layout --help >"$tmp/help" 2>&1 && grep -q "usage: spanhead layout" "$tmp/help" \
    || { echo "FAIL help"; fails=$((fails + 1)); }

expect_fail no-lengths 2 "at least one sequence length" "$cli" layout --tp 2
expect_fail bad-tp 2 "--tp 'x': expected an integer >= 1" "$cli" layout --tp x 5
expect_fail zero-cp 2 "--cp '0'" "$cli" layout --cp 0 5
expect_fail missing-value 2 "--cp needs a value" "$cli" layout 5 --cp
expect_fail bad-fp8 2 "--fp8 'fp4'" "$cli" layout --fp8 fp4 5
expect_fail bad-length 2 "length '12a' is not an integer" "$cli" layout 12a
expect_fail unknown-opt 2 "unknown option '--pp'" "$cli" layout --pp 2 5
expect_fail zero-length 1 "lengths[1]: 0, expected >= 1" "$cli" layout 5 0
expect_fail neg-length 1 "lengths[0]: -3" "$cli" layout -3
expect_fail overflow 1 "overflows int64" "$cli" layout 9223372036854775807 9223372036854775807
# issue 26 case 17: with cp = 1 there is no 2*tp*cp alignment, so tp = 2^62 gives alignments
# that fit (it used to say "2*tp*cp overflows int64"); cp = 2 does overflow
expect_json tp-2-62 '{"sequence_align":1,"total_align":4611686018427387904,"padded_lengths":[4611686018427387904],"cu_seqlens_padded":[0,4611686018427387904]}' \
    "$cli" layout --tp 4611686018427387904 --cp 1 5
expect_fail tp-2-61-cp2 1 "par: 2*tp*cp overflows int64 (tp=2305843009213693952, cp=2)" \
    "$cli" layout --tp 2305843009213693952 --cp 2 5

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "layout CLI: all checks passed"
