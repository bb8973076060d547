#!/usr/bin/env bash
# CLI test of `spanhead layout`: hand-worked layouts, key order, --help, and error exits.
# usage: test_layout.sh PATH_TO_SPANHEAD
set -u
cli=${1:?usage: test_layout.sh PATH_TO_SPANHEAD}
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# expect_json NAME EXPECTED_JSON CMD...: stdout must equal EXPECTED_JSON exactly (key order too)
expect_json() {
    local name=$1 want=$2
    shift 2
    local got
    if ! got=$("$@" 2>"$tmp/err"); then
        echo "FAIL $name: exit $? ($(cat "$tmp/err"))"; fails=$((fails + 1)); return
    fi
    if ! python3 -c 'import json,sys; json.loads(sys.argv[1])' "$got"; then
        echo "FAIL $name: output is not JSON: $got"; fails=$((fails + 1)); return
    fi
    if [ "$got" != "$want" ]; then
        echo "FAIL $name:"; echo "  got  $got"; echo "  want $want"; fails=$((fails + 1))
    fi
}

# expect_fail NAME CODE NEEDLE CMD...: exit status CODE, one stderr line containing NEEDLE
expect_fail() {
    local name=$1 code=$2 needle=$3
    shift 3
    "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    if [ "$rc" != "$code" ]; then
        echo "FAIL $name: exit $rc, expected $code ($(cat "$tmp/err"))"; fails=$((fails + 1)); return
    fi
    if [ "$(wc -l <"$tmp/err")" != 1 ] || ! grep -qF -- "$needle" "$tmp/err"; then
        echo "FAIL $name: stderr '$(cat "$tmp/err")' is not one line containing '$needle'"
        fails=$((fails + 1))
    fi
    if [ -s "$tmp/out" ]; then echo "FAIL $name: wrote to stdout on error"; fails=$((fails + 1)); fi
}

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
expect_fail bad-tp 2 "--tp: 'x' is not an integer >= 1" "$cli" layout --tp x 5
expect_fail zero-cp 2 "--cp: '0'" "$cli" layout --cp 0 5
expect_fail missing-value 2 "--cp: ''" "$cli" layout 5 --cp
expect_fail bad-fp8 2 "--fp8: 'fp4'" "$cli" layout --fp8 fp4 5
expect_fail bad-length 2 "length '12a' is not an integer" "$cli" layout 12a
expect_fail unknown-opt 2 "unknown option '--pp'" "$cli" layout --pp 2 5
expect_fail zero-length 1 "lengths[1]: 0, expected >= 1" "$cli" layout 5 0
expect_fail neg-length 1 "lengths[0]: -3" "$cli" layout -3
expect_fail overflow 1 "overflows int64" "$cli" layout 9223372036854775807 9223372036854775807

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "layout CLI: all checks passed"
