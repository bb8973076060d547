#!/usr/bin/env bash
# Runs each libFuzzer target of a fuzz build for a bounded time.
# usage: scripts/fuzz.sh BUILD_DIR SECONDS_PER_TARGET   (make fuzz: build-fuzz, $FUZZ_SECONDS or 60)
# Corpora live in BUILD_DIR/fuzz-corpus/<target> (seeded from tests/data and small built-in
# examples: .npy files and headers, command lines of every subcommand); findings are written to BUILD_DIR/fuzz-findings/<target>/ and fail the run.
# Inputs that once failed live in tests/fuzz/regress/<target>/ and are replayed before fuzzing.
set -euo pipefail
build=${1:-build-fuzz}
secs=${2:-60}
here=$(cd "$(dirname "$0")/.." && pwd)
shopt -s nullglob
targets=("$build"/tests/fuzz_*)
if ((${#targets[@]} == 0)); then
    echo "fuzz.sh: no fuzz targets in $build/tests (configure with -DSPH_FUZZ=ON and clang)" >&2
    exit 1
fi
status=0
for t in "${targets[@]}"; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    corpus=$build/fuzz-corpus/$name
    findings=$build/fuzz-findings/$name
    mkdir -p "$corpus" "$findings"
    # seeds: 4 (spans) or 8 (pack) option bytes followed by a real input
    case $name in
    fuzz_spans_json)
        printf '\x01\x01\x00\x00' | cat - "$here/tests/data/demo/batch.json" >"$corpus/seed-demo"
        printf '\x01\x01\x01\x03{"layout":"packed","sequence_length":10,"num_actions":6,"loss_mask":[[0,1,1,1,1,0]],"sub_seq_lengths":[[4,5]]}' >"$corpus/seed-subseq"
        printf '\x00\x00\x00\x00{"layout":"unpacked","sequence_length":6,"num_actions":3,"loss_mask":[[1,0,1],[0,1,1]]}' >"$corpus/seed-unpacked"
        printf '\x00\x00\x00\x00{"layout":"packed","sequence_length":8,"num_actions":4,"loss_mask":[[1,1,0,0]],"attention_mask":[[0,0,1,1,1,1,1,0]]}' >"$corpus/seed-attention"
        ;;
    fuzz_pack)
        printf '\x10\x10\x00\x05\x02\x02\x00\x00' | cat - "$here/tests/data/demo/lengths.json" >"$corpus/seed-demo"
        printf '\x1a\x00\x01\x00\x03\x00\x00\x00[6,5,4,3,2]' >"$corpus/seed-small"
        printf '\x1a\x00\x02\x00\x00\x00\x00\x006\n5\n4\n30\n' >"$corpus/seed-lines"
        ;;
    fuzz_npy)
        # mode byte (0 file, 1 stream, 2 header alone), then a .npy file or a header
        npy() { # VERSION_BYTE HEADER DATA_BYTES
            local h="$2" pad
            pad=$(( (64 - (10 + ${#h} + 1) % 64) % 64 ))
            printf "\\x93NUMPY\\x01\\x00"
            printf "\\x$(printf %02x $(( (${#h} + pad + 1) % 256 )))\\x$(printf %02x $(( (${#h} + pad + 1) / 256 )))"
            printf '%s%*s\n' "$h" "$pad" ""
            head -c "$3" /dev/zero
        }
        { printf '\x00'; npy 1 "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }" 48; } >"$corpus/seed-f4"
        { printf '\x00'; npy 1 "{'descr': '|u1', 'fortran_order': False, 'shape': (5,), }" 5; } >"$corpus/seed-u1"
        { printf '\x01'; npy 1 "{'descr': '<i8', 'fortran_order': False, 'shape': (), }" 8; } >"$corpus/seed-scalar"
        { printf '\x00'; npy 1 "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }" 16; } >"$corpus/seed-fortran"
        printf "\x02{'descr': '<f2', 'fortran_order': False, 'shape': (7, 1, 3L), }   \n" >"$corpus/seed-header"
        ;;
    fuzz_args)
        # table byte (0 layout 1 pack 2 spans 3 tune 4 run 5 run --tp 6 bench; +0x80 allows
        # positional arguments, +0x40 prints the help), then NUL-separated arguments
        printf '\x84--N\0004K\000--H\000256\000--V=4096\000--mask\000random\000--active\0000.3' >"$corpus/seed-run"
        printf '\x06--shape\000A,B\000--N\00016K,64K\000--active\0001,0.5\000--mask\000response,packed-rl' >"$corpus/seed-bench"
        printf '\x81--capacity\00016K\000--algorithm\000mffd\000-\000--tp\0002' >"$corpus/seed-pack"
        printf '\x45--tp\0002\000--cp\0002\000--temperature\0000.7\000--pack\000balanced\000--help' >"$corpus/seed-dist"
        printf '\x80--tp\0002\000-3\00017\000--fp8=mxfp8' >"$corpus/seed-layout"
        ;;
    fuzz_policy)
        # 16 option bytes (shape, flags, loss/KL/agg, scalars) then per-row bytes
        printf '\x0c\x2b\x03\x05\x62\x00\x00\x00\x03\x02\x21\x04\x17\x00\x03\x00' >"$corpus/seed-ppo"
        head -c 96 /dev/urandom >>"$corpus/seed-ppo"
        printf '\x09\x1c\x01\x02\x60\x00\x02\x02\x01\x02\x21\x10\x21\x09\x05\x04' >"$corpus/seed-gspo"
        head -c 72 /dev/urandom >>"$corpus/seed-gspo"
        ;;
    esac
    echo "== $name: ${secs}s =="
    # the inputs that once failed (tests/fuzz/regress/<target>/), replayed first, every run
    regress=("$here/tests/fuzz/regress/$name"/*)
    if ((${#regress[@]})) && ! ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 \
        "$t" -rss_limit_mb=2048 -timeout=10 "${regress[@]}" >"$build/fuzz-$name-regress.log" 2>&1; then
        echo "fuzz.sh: $name fails a regression input of tests/fuzz/regress/$name" >&2
        tail -40 "$build/fuzz-$name-regress.log" >&2
        status=1
        continue
    fi
    ((${#regress[@]})) && echo "regression inputs: ${#regress[@]} passed"
    if ! ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 \
        "$t" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
        -artifact_prefix="$findings/" -print_final_stats=1 "$corpus" 2>"$build/fuzz-$name.log"; then
        echo "fuzz.sh: $name found a problem; see $build/fuzz-$name.log and $findings/" >&2
        tail -40 "$build/fuzz-$name.log" >&2
        status=1
    fi
    grep -E '^stat::(number_of_executed_units|peak_rss_mb)|^#[0-9]+ +DONE' "$build/fuzz-$name.log" || true
    echo "corpus: $(ls "$corpus" | wc -l) inputs"
done
exit $status
