#!/usr/bin/env bash
# install.sh - spanhead as a C consumer sees it (issue 17): `cmake --install` into a fresh
# prefix, then examples/head_forward_backward.c built against that prefix three ways -
# find_package with spanhead::spanhead (shared) and spanhead::spanhead_static, and pkg-config -
# and every program run with LD_LIBRARY_PATH unset (run paths alone find the library), plus
# the installed CLI. Also keeps the header's example quote equal to the example program.
# usage: install.sh BUILD_DIR SOURCE_DIR
set -u
build=${1:?usage: install.sh BUILD_DIR SOURCE_DIR}
src=${2:?usage: install.sh BUILD_DIR SOURCE_DIR}
. "$(dirname "$0")/lib.sh"
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
run_clean() { env -u LD_LIBRARY_PATH -u SPANHEAD_LIB "$@"; }

# ---- the header quotes the example program verbatim ------------------------------------------
python3 - "$src/include/spanhead.h" "$src/examples/head_forward_backward.c" <<'PY' \
    && ok "header quotes examples/head_forward_backward.c" || bad "header quote differs from the example"
import sys
hdr, ex = open(sys.argv[1]).read().splitlines(), open(sys.argv[2]).read().splitlines()
code = ex[ex.index("// [example]") + 1:ex.index("// [example end]")]
start = next(i for i, l in enumerate(hdr) if l.startswith(" * Example (examples/head_forward_backward.c"))
body = hdr[start + 1:]
body = body[next(i for i, l in enumerate(body) if l.rstrip() == " *"):]  # after the intro
quote = []
for l in body:
    if l.startswith(" */"):
        break
    quote.append(l)
while quote and quote[0].rstrip() == " *":
    quote.pop(0)
while quote and quote[-1].rstrip() == " *":
    quote.pop()
got = [l[5:] if l.startswith(" *   ") else ("" if l.rstrip() == " *" else None) for l in quote]
if got != code:
    for a, b in zip(got, code):
        if a != b:
            print("header :", a, "\nexample:", b)
            break
    print(len(got), "quoted lines,", len(code), "in the example")
    sys.exit(1)
PY

# ---- install --------------------------------------------------------------------------------
prefix=$tmp/prefix
if ! cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1; then
    bad "cmake --install: $(tail -3 "$tmp/install.log")"
    exit 1
fi
libdir=$(cd "$prefix" && ls -d lib* | head -1)
for f in bin/spanhead include/spanhead.h "$libdir/libspanhead.so" "$libdir/libspanhead.a" \
    "$libdir/cmake/spanhead/spanheadConfig.cmake" "$libdir/cmake/spanhead/spanheadConfigVersion.cmake" \
    "$libdir/pkgconfig/spanhead.pc" share/spanhead/plot_bench.py; do
    [ -e "$prefix/$f" ] || bad "not installed: $f"
done
# the installed CLI runs as it is, and takes the installed library
if out=$(run_clean "$prefix/bin/spanhead" run --N 24 --H 8 --V 40 --entropy --check 2>&1); then
    [[ $out == *"check passed"* ]] && ok "installed spanhead run --check" || bad "installed run: $out"
else
    bad "installed spanhead run: $out"
fi
lib=$(run_clean ldd "$prefix/bin/spanhead" | awk '/libspanhead/ {print $3}')
[[ $lib == "$prefix"/* ]] && ok "installed CLI loads $lib" || bad "installed CLI loads '$lib', not the prefix's"

# ---- find_package: shared and static ---------------------------------------------------------
if cmake -S "$src/examples" -B "$tmp/ex" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
        >"$tmp/ex.log" 2>&1 && cmake --build "$tmp/ex" -j 2 >>"$tmp/ex.log" 2>&1; then
    grep -q "spanhead 0" "$tmp/ex.log" || bad "find_package: no version line"
    for p in head_forward_backward head_forward_backward_static; do
        if out=$(run_clean "$tmp/ex/$p" 2>&1) && [[ $out == *"max |error| against float64"* ]]; then
            ok "find_package $p: $out"
        else
            bad "find_package $p: $out"
        fi
    done
    lib=$(run_clean ldd "$tmp/ex/head_forward_backward" | awk '/libspanhead/ {print $3}')
    [[ $lib == "$prefix"/* ]] && ok "find_package program loads the prefix's library" \
        || bad "find_package program loads '$lib'"
    ldd "$tmp/ex/head_forward_backward_static" | grep -q libspanhead \
        && bad "the static program needs libspanhead.so" || ok "the static program is standalone"
else
    bad "find_package build: $(tail -15 "$tmp/ex.log")"
fi

# ---- pkg-config ------------------------------------------------------------------------------
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
if ! command -v pkg-config >/dev/null; then
    bad "pkg-config is not installed (scripts/setup.sh installs it)"
elif flags=$(pkg-config --cflags --libs spanhead) &&
        ${CC:-cc} -std=c11 -o "$tmp/pc_example" "$src/examples/head_forward_backward.c" $flags -lm \
        2>"$tmp/pc.log"; then
    [ "$(pkg-config --modversion spanhead)" = "$(run_clean "$prefix/bin/spanhead" version | cut -d' ' -f2)" ] \
        && ok "pkg-config --modversion" || bad "pkg-config version differs from spanhead version"
    if out=$(run_clean "$tmp/pc_example" 2>&1) && [[ $out == *"max |error| against float64"* ]]; then
        ok "pkg-config build: $out"
    else
        bad "pkg-config program: $out"
    fi
else
    bad "pkg-config build: $(cat "$tmp/pc.log")"
fi

[ "$fails" -eq 0 ] && echo "all install tests passed" && exit 0
echo "$fails install test(s) failed"
exit 1
