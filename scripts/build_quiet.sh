#!/usr/bin/env bash
# build_quiet.sh - configure (once) and build spanhead showing progress only: one line
# rewritten in place on a terminal, a single summary line otherwise. The full output goes to
# BUILD/build.log; on a failure its tail is printed and the exit status is the build's.
# usage: scripts/build_quiet.sh BUILD_DIR JOBS [cmake configure arguments...]
set -uo pipefail
build=${1:?usage: build_quiet.sh BUILD_DIR JOBS [cmake args...]}
jobs=${2:-2}
shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$build"
log=$build/build.log
: >"$log"
tty=0
[ -t 1 ] && tty=1
if [ ! -f "$build/CMakeCache.txt" ]; then
    [ $tty = 1 ] && printf 'configuring spanhead ...'
    if ! cmake -S "$here" -B "$build" "$@" >>"$log" 2>&1; then
        echo
        echo "build_quiet.sh: configuring failed; the end of $log:" >&2
        tail -30 "$log" >&2
        exit 1
    fi
fi
start=$(date +%s)
# MAKEFLAGS: no "make[n]: Entering directory" lines from CMake's recursive makefiles
MAKEFLAGS=--no-print-directory cmake --build "$build" -j "$jobs" 2>&1 | tee -a "$log" |
    awk -v tty=$tty '
        match($0, /^\[ *[0-9]+%\]/) {
            pct = substr($0, RSTART + 1, RLENGTH - 3) + 0
            if (tty) printf "\rbuilding spanhead: %3d%%\033[K", pct
        }
        /(warning|error):/ { warnings++ }
        END { if (tty) printf "\r\033[K" }'
status=${PIPESTATUS[0]}
if [ "$status" != 0 ]; then
    echo "build_quiet.sh: the build failed; the end of $log:" >&2
    grep -E "error|Error" "$log" | head -20 >&2
    tail -20 "$log" >&2
    exit "$status"
fi
n_warn=$(grep -c "warning:" "$log" || true)
echo "built spanhead in $build ($(( $(date +%s) - start )) s$( [ "$n_warn" != 0 ] && echo ", $n_warn compiler warnings in $log"))"
