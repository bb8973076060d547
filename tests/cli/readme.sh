#!/usr/bin/env bash
# readme.sh - every command of README.md runs as written (issue 17). The fenced ```sh blocks are
# run line by line in one shell from the repository root (so an `export` holds for what
# follows), the ```python blocks with the Python the tests use, in README order. Each command
# must exit 0, except:
#   - the lines of SKIP below, each with the reason (and each must still be in the README, so
#     the list cannot go stale);
#   - GPU lines (--device cuda) on a machine without a GPU: they must fail cleanly instead,
#     exit 1 and one line saying there is no CUDA device.
# The build directory the README calls build/ is this test's (BUILD_DIR); with the default
# build/ nothing is rewritten.
# usage: readme.sh BUILD_DIR SOURCE_DIR
set -u
build=$(cd "${1:?usage: readme.sh BUILD_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: readme.sh BUILD_DIR SOURCE_DIR}" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# line prefix (as in the README) -> why it does not run here
SKIP=(
    "make test|it is this test suite"
    "pip install ./python|python/tests/test_packaging.py builds and imports that wheel (from this build)"
)
py=${SPH_README_PYTHON:-}
[ -z "$py" ] && [ -x "$src/build-venv/bin/python" ] && py=$src/build-venv/bin/python
[ -z "$py" ] && py=python3
gpu=0
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && gpu=1

python3 - "$src/README.md" "$tmp" "$build" "$src" <<'PY' || { echo "FAIL: cannot read README.md"; exit 1; }
import os, re, sys
readme, tmp, build, src = sys.argv[1:5]
text = open(readme).read()
blocks = re.findall(r"^```(sh|python)\n(.*?)^```", text, re.S | re.M)
rel = os.path.relpath(build, src)
with open(f"{tmp}/steps", "w") as out:
    for k, (lang, body) in enumerate(blocks):
        if lang == "python":
            open(f"{tmp}/block{k}.py", "w").write(body)
            out.write(f"python\t{tmp}/block{k}.py\n")
            continue
        for line in body.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            cmd = line
            if rel != "build":  # the README's build/ is this test's build directory
                cmd = re.sub(r"(^|[\s=/(])build(?=[/\s]|$)", lambda m: m.group(1) + rel, cmd)
            # the README's /tmp/... paths (install prefix, example build) are this run's own:
            # checkouts sharing a machine must not install into or reuse each other's
            cmd = re.sub(r"(?<![\w.])/tmp/", tmp + "/", cmd)
            out.write(f"sh\t{line}\t{cmd}\n")
PY

fails=0 ran=0
for entry in "${SKIP[@]}"; do
    grep -qF -- "${entry%%|*}" "$src/README.md" || { echo "FAIL stale SKIP entry: '${entry%%|*}' is not in README.md"; fails=$((fails + 1)); }
done
cd "$src"
export BUILD=${build#"$src"/} # for `make demo`: the same build directory
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
while IFS=$'\t' read -r kind line cmd; do
    if [ "$kind" = python ]; then
        if grep -q "^import torch" "$line" && ! "$py" -c "import torch" 2>/dev/null; then
            if [ -n "${CI:-}" ]; then
                echo "FAIL python block $(basename "$line"): torch is not importable by $py"
                fails=$((fails + 1))
            else
                echo "skip python block $(basename "$line"): torch is not installed for $py" \
                    "(scripts/setup.sh puts it in build-venv)"
            fi
            continue
        fi
        if "$py" "$line" >"$tmp/out" 2>&1; then
            echo "ok   python block $(basename "$line"): $(tail -1 "$tmp/out" | cut -c1-100)"
            ran=$((ran + 1))
        else
            echo "FAIL python block $(basename "$line"):"; sed 's/^/     /' "$line"; tail -15 "$tmp/out"
            fails=$((fails + 1))
        fi
        continue
    fi
    why=""
    for entry in "${SKIP[@]}"; do
        [[ $line == "${entry%%|*}"* ]] && why=${entry#*|}
    done
    if [ -n "$why" ]; then
        echo "skip $line   ($why)"
        continue
    fi
    eval "$cmd" >"$tmp/out" 2>"$tmp/err" </dev/null
    rc=$?
    if [[ $line == *"--device cuda"* && $gpu == 0 ]]; then
        if [ $rc = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -qiE "cuda|gpu" "$tmp/err"; then
            echo "ok   $line   (no GPU here: $(cat "$tmp/err"))"
        else
            echo "FAIL $line: without a GPU, expected exit 1 with one line about CUDA, got $rc:"
            tail -5 "$tmp/err"; fails=$((fails + 1))
        fi
        continue
    fi
    if [ $rc = 0 ]; then
        echo "ok   $line"
        ran=$((ran + 1))
    else
        echo "FAIL $line: exit $rc"; tail -5 "$tmp/out"; tail -10 "$tmp/err"; fails=$((fails + 1))
    fi
done <"$tmp/steps"

[ "$fails" = 0 ] && echo "README: $ran commands and blocks ran as written" && exit 0
echo "README: $fails failure(s)"
exit 1
