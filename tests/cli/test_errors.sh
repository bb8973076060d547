#!/usr/bin/env bash
# test_errors.sh - hostile but realistic input to the CLI (issue 18): every case must end with
# exit 1 (or 2 for a malformed option), one stderr line naming the argument or file and the
# value, nothing half-written, and never a crash or a hang (each command runs under a
# timeout; a signal or a timeout fails the case).
#   .npy: a header whose byte count wraps 2^64, a header cut after 'descr': ', a Fortran-ordered
#     array (one message, the right one), a structured dtype, duplicate keys, a truncated file,
#     trailing bytes, NaN and inf in hidden / weight / an upstream gradient; temperature.npy of
#     the wrong dtype or length, with a NaN or a 0, beside --temperature
#   options: N*H overflowing int64, more memory than the machine has, thread counts beyond the
#     machine (and beyond int), a support larger than the vocabulary, a shard start near
#     INT64_MAX (no overflowed number in the message), softcap and temperature that do not
#     survive float
#   JSON and text: trailing data after the document, duplicate keys, a NUL byte in a
#     one-per-line file
#   outputs: a failed write (an output linked to /dev/full) or a failed --check leaves the
#     outputs directory exactly as it was; stdout on a full device is an error
# usage: test_errors.sh PATH_TO_SPANHEAD
set -u
cli=${1:?usage: test_errors.sh PATH_TO_SPANHEAD}
. "$(dirname "$0")/lib.sh"

# expect_err NAME CODE NEEDLE CMD...: like expect_fail, under a 60 s timeout, and the message
# must not contain a negative number that only overflow could produce
expect_err() {
    local name=$1 code=$2 needle=$3
    shift 3
    timeout -s KILL 60 "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    if [ "$rc" != "$code" ]; then
        echo "FAIL $name: exit $rc, expected $code ($(head -c 300 "$tmp/err"))"; fails=$((fails + 1)); return
    fi
    if [ "$(wc -l <"$tmp/err")" != 1 ] || ! grep -qF -- "$needle" "$tmp/err"; then
        echo "FAIL $name: stderr '$(head -c 300 "$tmp/err")' is not one line containing '$needle'"
        fails=$((fails + 1)); return
    fi
    if grep -qE -- '-9223372036854775[0-9]+' "$tmp/err"; then
        echo "FAIL $name: overflowed number in '$(cat "$tmp/err")'"; fails=$((fails + 1)); return
    fi
    echo "ok   $name"
}

if ! python3 -c 'import numpy' 2>/dev/null; then
    echo "skipped: numpy is not installed (scripts/setup.sh installs it)"
    exit 77
fi

# ---- .npy files ------------------------------------------------------------------------------
python3 - "$tmp" <<'PY'
import os, struct, sys
import numpy as np
d = sys.argv[1]
r = np.random.default_rng(3)
N, H, V = 8, 4, 16
def good(name):
    p = f"{d}/{name}"
    os.makedirs(p)
    np.save(f"{p}/hidden.npy", r.standard_normal((N, H)).astype(np.float32))
    np.save(f"{p}/weight.npy", r.standard_normal((V, H)).astype(np.float32))
    np.save(f"{p}/targets.npy", r.integers(0, V, N).astype(np.int64))
    np.save(f"{p}/dlogprob.npy", r.standard_normal(N).astype(np.float32))
    return p
def raw(path, header, data=b"\0" * 16):
    h = header.encode()
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h + data)
# 1. byte counts that wrap 2^64: hidden (2^61, 2) <f4, targets (2^61,) <i8, a few data bytes
p = good("wrap")
raw(f"{p}/hidden.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2305843009213693952, 2), }\n")
raw(f"{p}/targets.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (2305843009213693952,), }\n")
# 2. the header ends right after 'descr': '
p = good("cut")
raw(f"{p}/hidden.npy", "{'descr': '", b"")
# a header whose shape overflows int64, a structured dtype, duplicate keys, unknown key
p = good("big"); raw(f"{p}/weight.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, 2), }\n")
p = good("struct"); raw(f"{p}/hidden.npy", "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (8, 4), }\n")
p = good("dupkey"); raw(f"{p}/hidden.npy", "{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (8, 4), }\n")
p = good("unknown"); raw(f"{p}/hidden.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (8, 4), 'x': 1}\n")
# truncated data and trailing bytes
p = good("trunc"); raw(f"{p}/hidden.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (8, 4), }\n", b"\0" * 100)
p = good("trail"); raw(f"{p}/hidden.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (8, 4), }\n", b"\0" * 130)
# a Fortran-ordered hidden.npy
p = good("fortran"); np.save(f"{p}/hidden.npy", np.asfortranarray(r.standard_normal((N, H)).astype(np.float32)))
# non-finite inputs
for name, key, val in (("nan_h", "hidden", np.nan), ("inf_w", "weight", np.inf), ("nan_g", "dlogprob", np.nan)):
    p = good(name)
    a = np.load(f"{p}/{key}.npy")
    a.flat[5] = val
    np.save(f"{p}/{key}.npy", a)
# per-row temperatures (temperature.npy, issue 25): the wrong dtype, length, NaN, 0
for name, t in (("temp_f8", np.full(N, 0.9)), ("temp_len", np.full(N - 1, 0.9, np.float32)),
                ("temp_nan", np.array([0.9] * 5 + [np.nan] + [0.9] * (N - 6), np.float32)),
                ("temp_zero", np.array([0.9] * 6 + [0.0] + [0.9] * (N - 7), np.float32))):
    p = good(name)
    np.save(f"{p}/temperature.npy", t)
# no upstream gradient
p = good("nograd"); os.remove(f"{p}/dlogprob.npy")
# ill-conditioned inputs (logits ~1e3): their f32 entropy is as far from the float64 reference
# as fp32 logits allow; the check's budget of the logits' rounding accepts it (issue 26 case 9)
p = good("illcond")
np.save(f"{p}/hidden.npy", (r.standard_normal((64, 32)) * 1000).astype(np.float32))
np.save(f"{p}/weight.npy", r.standard_normal((512, 32)).astype(np.float32))
np.save(f"{p}/targets.npy", r.integers(0, 512, 64).astype(np.int64))
np.save(f"{p}/dlogprob.npy", r.standard_normal(64).astype(np.float32))
np.save(f"{p}/dentropy.npy", r.standard_normal(64).astype(np.float32))
# dlogit_mean with candidates (sample support, where logit_mean is not defined): issue 26
# case 11, it used to be dropped without a word; alone (the only gradient) and beside dlogprob
for name, keep in (("dlm_cand", False), ("dlm_cand_g", True)):
    p = good(name)
    if not keep: os.remove(f"{p}/dlogprob.npy")
    t = np.load(f"{p}/targets.npy")  # each row's support: its target and 4 other ids
    np.save(f"{p}/candidates.npy", np.stack([np.r_[t[i], r.permutation(np.delete(np.arange(V), t[i]))[:4]]
                                             for i in range(N)]).astype(np.int64))
    np.save(f"{p}/dlogit_mean.npy", r.standard_normal(N).astype(np.float32))
PY
for c in dlm_cand dlm_cand_g; do
    expect_err $c 1 "dlogit_mean: given in sample-support mode, where logit_mean is not defined" \
        "$cli" run --inputs "$tmp/$c" --outputs "$tmp/$c-out"
    [ ! -e "$tmp/$c-out" ] || { echo "FAIL $c: wrote $tmp/$c-out"; fails=$((fails + 1)); }
done
expect_err npy-wrap 1 "hidden.npy: header: 'shape' describes more bytes than memory can address" \
    "$cli" run --inputs "$tmp/wrap"
expect_err npy-cut 1 "hidden.npy: header: 'descr' is not a simple dtype string" "$cli" run --inputs "$tmp/cut"
expect_err npy-big 1 "weight.npy: header: 'shape' holds something other than non-negative integers" \
    "$cli" run --inputs "$tmp/big"
expect_err npy-struct 1 "structured dtypes are not supported" "$cli" run --inputs "$tmp/struct"
expect_err npy-dupkey 1 "hidden.npy: header: 'descr' given twice" "$cli" run --inputs "$tmp/dupkey"
expect_err npy-unknown 1 "hidden.npy: header: unknown key 'x'" "$cli" run --inputs "$tmp/unknown"
expect_err npy-trunc 1 "hidden.npy: truncated: the header's shape needs 128 data bytes, the file holds 100" \
    "$cli" run --inputs "$tmp/trunc"
expect_err npy-trail 1 "hidden.npy: trailing data: the header's shape needs 128 data bytes, the file holds 130" \
    "$cli" run --inputs "$tmp/trail"
expect_err npy-fortran 1 "hidden.npy: header: Fortran-ordered array (fortran_order True) is not supported" \
    "$cli" run --inputs "$tmp/fortran"
expect_err nan-hidden 1 "hidden.npy: non-finite value nan at [1, 1]" "$cli" run --inputs "$tmp/nan_h"
expect_err inf-weight 1 "weight.npy: non-finite value inf at [1, 1]" "$cli" run --inputs "$tmp/inf_w"
expect_err nan-dlogprob 1 "dlogprob.npy: non-finite value nan at [5]" "$cli" run --inputs "$tmp/nan_g"
expect_err temp-f8 1 "temperature.npy: dtype <f8, expected <f4" "$cli" run --inputs "$tmp/temp_f8"
expect_err temp-len 1 "temperature.npy: shape (7), expected (8)" "$cli" run --inputs "$tmp/temp_len"
expect_err temp-nan 1 "temperature.npy: non-finite value nan at [5]" "$cli" run --inputs "$tmp/temp_nan"
expect_err temp-zero 1 "temperature_rows[6]: 0, expected finite and > 0" \
    "$cli" run --inputs "$tmp/temp_zero"
expect_err temp-and-scalar 2 "has temperature.npy" "$cli" run --inputs "$tmp/temp_zero" \
    --temperature 0.5

# ---- options ---------------------------------------------------------------------------------
expect_err nh-overflow 1 "--H 4611686018427387904 --V 1: N*H = 4 x 4611686018427387904 overflows int64" \
    "$cli" run --N 4 --H 4611686018427387904 --V 1
expect_err memory 1 "GiB of host memory, this machine has" "$cli" run --N 1000000 --H 100000 --V 1000
cpus=$(getconf _NPROCESSORS_ONLN)
# ---- option values: the library's domains, judged by the library before any work (issue 26
# case 16): a usage error (exit 2) with the library's message naming the argument and value;
# malformed values are the parser's usage errors
expect_err threads-100000 2 "--threads: invalid argument: opts.num_threads is 100000, expected 0 (all processors) to" \
    "$cli" run --N 4 --H 4 --V 4 --threads 100000
for t in 4294967297 2147483648 99999999999999999999; do
    expect_err threads-$t 2 "--threads '$t': expected an integer in [0, 2147483647]" \
        "$cli" run --N 4 --H 4 --V 4 --threads $t
done
expect_err threads-abc 2 "--threads 'x': expected an integer" "$cli" run --N 4 --H 4 --V 4 --threads x
expect_err kernel-env 2 "SPH_KERNEL (environment): 'bogus' is unknown" \
    env SPH_KERNEL=bogus "$cli" run --N 4 --H 4 --V 4
expect_err kernel-bogus 2 "--kernel: invalid argument: force_kernel: 'bogus' is unknown" "$cli" run --N 4 --H 4 --V 4 --kernel bogus
for v in inf nan -1 0 1e-300 1e+300 -inf; do
    expect_err temperature-$v 2 "--temperature: invalid argument: temperature: $v, expected finite and > 0" \
        "$cli" run --N 4 --H 4 --V 4 --temperature $v
done
expect_err temperature-abc 2 "--temperature 'warm': expected a number" "$cli" run --N 4 --H 4 --V 4 --temperature warm
expect_err temperature-empty 2 "--temperature '': expected a number" "$cli" run --N 4 --H 4 --V 4 --temperature ''
for v in 1e+39 inf -2; do
    expect_err softcap-$v 2 "--softcap: invalid argument: softcap: $v, expected finite and > 0 (or 0 = off)" \
        "$cli" run --N 4 --H 4 --V 4 --softcap $v
done
expect_err support-gt-v 1 "--support 5: more candidates than the vocabulary (4 ids)" \
    "$cli" run --N 4 --H 4 --V 4 --support 5
# (the MPI runner as a singleton; Open MPI's own allocations outlive MPI_Finalize, so a
# sanitizer build checks this one for memory errors but not for leaks)
expect_err support-gt-v-dist 1 "--support 5: more candidates than --vocab 4" \
    env -u OMPI_COMM_WORLD_SIZE ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
    "$cli" run --tp 1 --support 5 --vocab 4 --no-check
# lengths.npy that sums to exactly one row more than hidden has (it said "more than 17")
python3 - "$tmp/lensum" <<'PY'
import os, sys, numpy as np
d = sys.argv[1]; os.makedirs(d); r = np.random.default_rng(1)
np.save(f"{d}/hidden.npy", r.standard_normal((16, 4)).astype(np.float32))
np.save(f"{d}/weight.npy", r.standard_normal((8, 4)).astype(np.float32))
np.save(f"{d}/targets.npy", r.integers(0, 8, 16).astype(np.int64))
np.save(f"{d}/lengths.npy", np.array([9, 8], np.int64))
PY
expect_err lengths-sum-dist 1 "lengths.npy sums to 17, but hidden has R = 16 rows" \
    env -u OMPI_COMM_WORLD_SIZE ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
    "$cli" run --tp 1 --inputs "$tmp/lensum" --no-check
expect_err vocab-start 1 "--vocab-start 9223372036854775807: the shard of V_loc = 8 rows starting there ends past --vocab-total 9223372036854775807" \
    "$cli" run --N 4 --H 4 --V 8 --vocab-start 9223372036854775807 --vocab-total 9223372036854775807
expect_err softcap 2 "softcap: 3.5e+38, expected finite and > 0 (or 0 = off)" "$cli" run --N 4 --H 4 --V 4 --softcap 3.5e38
expect_err temperature 2 "temperature: 1e-50, expected finite and > 0" \
    "$cli" run --N 4 --H 4 --V 4 --temperature 1e-50
expect_err temperature-sub 2 "temperature: 1e-40, expected finite and > 0" \
    "$cli" run --N 4 --H 4 --V 4 --temperature 1e-40
# a value the float can hold but not its inverse: the library's rule, not the CLI's old one
expect_err temperature-tiny-inverse 2 "temperature: 1e-38, expected finite and > 0" \
    "$cli" run --N 4 --H 4 --V 4 --temperature 1e-38
expect_err unknown 2 "unknown option '--bogus'" "$cli" run --bogus
expect_err flag-value 2 "--check takes no value (got 'yes')" "$cli" run --check=yes
expect_err missing-value 2 "--seed needs a value" "$cli" run --seed
expect_err repeats 2 "--repeats '0': expected an integer in [1, 1000]" "$cli" run --repeats 0
expect_err one-pass-no-grad 1 "--one-pass computes the gradients in the forward, but no upstream gradient" \
    "$cli" run --inputs "$tmp/nograd" --one-pass

# ---- every command's --help: exit 0, the usage first, the exit-status line last ----------------
for c in pack layout spans run bench tune "run --tp 1" "run --policy-loss ppo"; do
    if out=$(ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$cli" $c --help 2>&1) &&
        [[ $out == usage:* ]] && [[ $(tail -1 <<<"$out") == "Exit status: 0 ok, 1 bad input data or runtime failure, 2 usage error." ]]; then
        echo "ok   help-$c"
    else
        echo "FAIL help-$c: $(tail -2 <<<"$out")"; fails=$((fails + 1))
    fi
done

# ---- `spanhead run` picks its runner from the options as the parser reads them -------------
# (issue 27 item 5: the old sniffers looked for --policy-loss / --distill / --tp anywhere in
# argv, past "--" and inside other options' values, and disagreed with each other on "--")
for c in "run --distill jsd"; do
    if out=$("$cli" $c --help 2>&1) && [[ $out == "usage: spanhead run --inputs DIR [--outputs DIR] --distill"* ]]; then
        echo "ok   help-$c"
    else
        echo "FAIL help-$c: $(head -1 <<<"$out")"; fails=$((fails + 1))
    fi
done
# "--" ends the options for the choice too: --help before it is the head runner's help
if out=$("$cli" run --help -- --policy-loss ppo 2>&1) && [[ $(head -1 <<<"$out") == "usage: spanhead run [options]" ]]; then
    echo "ok   dispatch-dashdash-help"
else
    echo "FAIL dispatch-dashdash-help: $(head -1 <<<"$out")"; fails=$((fails + 1))
fi
# a value that looks like --tp is the value of --kernel: the one-process head runner judges it
expect_err dispatch-value-not-option 2 "spanhead run: --kernel: invalid argument: force_kernel: '--tp' is unknown" \
    "$cli" run --kernel --tp
if grep -qF "rank" "$tmp/err"; then
    echo "FAIL dispatch-value-not-option: the distributed runner took it ($(cat "$tmp/err"))"; fails=$((fails + 1))
fi
expect_err dispatch-two-losses 2 "--policy-loss and --distill: one loss per run" \
    "$cli" run --policy-loss ppo --distill jsd --inputs "$tmp"
expect_err dispatch-dashdash-loss 2 "unexpected argument '--policy-loss'" "$cli" run --N 4 --H 4 --V 4 -- --policy-loss ppo

# ---- JSON and text inputs --------------------------------------------------------------------
printf '[10,20] [30,40]' >"$tmp/trail.json"
expect_err json-trailing 1 "byte 8: data after the JSON document ('[30,40]')" "$cli" pack --capacity 64 "$tmp/trail.json"
printf '[10,20]\n\n  \n' >"$tmp/ws.json"
"$cli" pack --capacity 64 "$tmp/ws.json" >/dev/null 2>&1 && echo "ok   json-trailing-space" \
    || { echo "FAIL json-trailing-space: trailing white space refused"; fails=$((fails + 1)); }
printf '10\n2\0000\n30\n' >"$tmp/nul.txt"
expect_err lines-nul 1 "byte 4: NUL byte in the input" "$cli" pack --capacity 64 "$tmp/nul.txt"
printf '[10,\0000]' >"$tmp/nul.json"
expect_err json-nul 1 "byte 4: NUL byte in the input" "$cli" pack --capacity 64 "$tmp/nul.json"
echo '{"layout":"packed","sequence_length":6,"num_actions":3,"loss_mask":[[1,0,1]],"num_actions":2}' >"$tmp/dup.json"
expect_err json-dupkey 1 "key \"num_actions\" given twice" "$cli" spans "$tmp/dup.json"
echo '{"layout":"packed","sequence_length":6,"num_actions":3,"loss_mask":[[1,0,1]]} {}' >"$tmp/two.json"
expect_err json-two-docs 1 "data after the JSON document" "$cli" spans "$tmp/two.json"

# ---- standard output on a full device --------------------------------------------------------
if [ -w /dev/full ]; then
    expect_err stdout-full 1 "spanhead layout: writing standard output: No space left on device" \
        bash -c "\"$cli\" layout 5 >/dev/full"
    expect_err stdout-full-pack 1 "writing standard output" bash -c "\"$cli\" pack --capacity 64 \"$tmp/ws.json\" >/dev/full"
    expect_err stdout-full-help 1 "writing standard output" bash -c "\"$cli\" run --help >/dev/full"
else
    echo "skip stdout-full: no /dev/full"
fi

# ---- outputs: all or nothing -----------------------------------------------------------------
# names, types, link targets and the contents of the regular files (not through links)
snapshot() { (cd "$1" && find . -printf '%p %y %l\n' | sort && find . -type f -exec md5sum {} + | sort); }
out=$tmp/outs
mkdir -p "$out"
for f in logprob entropy lse logit_mean dhidden; do echo "old $f" >"$out/$f.npy"; done
echo "old dweight" >"$out/dweight.npy"
# a write that fails after five files were staged (a 1 KiB file-size limit: dweight is larger;
# SIGXFSZ ignored so the write returns EFBIG): the directory stays as it was, no hidden files
before=$(snapshot "$out")
expect_err outputs-full 1 "dweight.npy: write failed: File too large (nothing was written to $out)" \
    bash -c 'trap "" XFSZ; ulimit -f 1; exec "$@"' _ "$cli" run --N 16 --H 8 --V 32 --entropy --outputs "$out"
[ "$(snapshot "$out")" = "$before" ] && echo "ok   outputs-full leaves the directory as it was" \
    || { echo "FAIL outputs-full changed $out:"; ls -la "$out"; fails=$((fails + 1)); }
before=$(snapshot "$out")
expect_err outputs-check 1 "check failed: results differ from the reference (no outputs written)" \
    env SPH_CLI_TEST_CORRUPT=entropy "$cli" run --inputs "$tmp/illcond" --entropy --check --outputs "$out"
[ "$(snapshot "$out")" = "$before" ] && echo "ok   outputs-check leaves the directory as it was" \
    || { echo "FAIL outputs-check changed $out"; ls -la "$out"; fails=$((fails + 1)); }
# a missing directory is created only when the run succeeds
expect_err outputs-check-new 1 "check failed" env SPH_CLI_TEST_CORRUPT=dweight "$cli" run --inputs "$tmp/illcond" --entropy --check --outputs "$tmp/new"
[ ! -e "$tmp/new" ] && echo "ok   outputs-check-new left no directory" \
    || { echo "FAIL outputs-check-new created $tmp/new"; fails=$((fails + 1)); }
# a link among the outputs (even to a regular file) is refused before any work (issue 26
# case 12: a link to /dev/stderr was written while the rest were staged); test_outputs.sh has more
echo "linked" >"$tmp/target.npy"
rm "$out/lse.npy" && ln -s "$tmp/target.npy" "$out/lse.npy"
before=$(snapshot "$out")
expect_err outputs-link 1 "$out/lse.npy: a symbolic link, not a regular file: refused" \
    "$cli" run --N 16 --H 8 --V 32 --entropy --outputs "$out"
[ "$(snapshot "$out")" = "$before" ] && echo "ok   outputs-link leaves the directory as it was" \
    || { echo "FAIL outputs-link changed $out:"; ls -la "$out"; fails=$((fails + 1)); }
rm "$out/lse.npy"
# and a successful run replaces every file, with no temporaries
if "$cli" run --N 16 --H 8 --V 32 --entropy --outputs "$out" >/dev/null 2>"$tmp/err"; then
    python3 - "$out" "$tmp/target.npy" <<'PY' && echo "ok   outputs-replace" || { echo "FAIL outputs-replace"; fails=$((fails + 1)); }
import os, sys, numpy as np
d, target = sys.argv[1], sys.argv[2]
for n in ("logprob", "entropy", "lse", "logit_mean", "dhidden", "dweight"):
    a = np.load(f"{d}/{n}.npy")
    assert a.dtype == np.float32 and a.shape[0] in (16, 32), (n, a.shape)
assert not os.path.islink(f"{d}/lse.npy") and open(target).read() == "linked\n"
assert not [f for f in os.listdir(d) if f.startswith(".")], os.listdir(d)
PY
else
    echo "FAIL outputs-replace: $(cat "$tmp/err")"; fails=$((fails + 1))
fi

[ "$fails" -eq 0 ] && echo "all error cases passed" && exit 0
echo "$fails error case(s) failed"
exit 1
