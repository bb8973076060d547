# lib.sh - helpers shared by the CLI tests (sourced): a temp dir, a failure count, ok / bad,
# expect_rc, expect_json and expect_fail.
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }

# expect_rc CODE NEEDLE -- command...: exit code and a substring of stdout+stderr
expect_rc() {
    local want=$1 needle=$2
    shift 3
    local out rc
    out=$("$@" 2>&1)
    rc=$?
    if [[ $rc -ne $want ]]; then
        bad "$* -> exit $rc, expected $want"; echo "$out" | tail -5; return
    fi
    if [[ -n $needle && $out != *"$needle"* ]]; then
        bad "$* -> output lacks '$needle'"; echo "$out" | tail -5; return
    fi
    ok "$* (exit $rc)"
}

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
