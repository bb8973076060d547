#!/usr/bin/env python3
"""make mutants: plant each bug of tests/mutants.txt, one at a time, in a scratch copy of the
tree, build the CPU parts, run the suite, and report which test killed each mutant.

Every mutant must be killed. A mutant is one or more hunks, each a file and a snippet of it
that must occur exactly once in the file as it is now (a snippet that no longer matches, or
matches twice, fails loudly: the refactor moved the code, update the list), and the text
that replaces it. The suite runs in two stages: the fast C tests (unit, prop, parity), then,
if the mutant survived them, everything else ctest has (cli, mpi, the rest); the report names
every failing test of the stage that killed it; then pytest (python/tests, on the scratch
build's library and CLI and the extension built in the scratch tree), so that mutants of the
Python layer (python/spanhead/) can be killed. A mutant whose hunks are all under python/ runs
pytest first (its C build is unchanged).

    usage: scripts/mutants.py [--list FILE] [--only ID,ID] [--keep] [--jobs N] [--all-stages]
                              [--python PY] [--no-pytest] [--exclude REGEX]
    environment: MUTANTS_DIR (scratch directory; default a fresh one under /tmp),
                 MUTANTS_PYTHON (the interpreter of the pytest stage, as --python: one with
                 numpy, torch and transformers; default build-venv/bin/python where it exists,
                 else this interpreter)

Exit status: 0 all killed, 1 a mutant survived, 2 a snippet is stale, the baseline fails or a
mutant does not build.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = [("unit|prop|parity", None), (None, "unit|prop|parity")]  # ctest (-L, -LE)
PYTEST = "pytest"  # the third stage


def parse(path):
    """The mutant list: blocks of
         ## id: NAME
         ## what: one line of description
         ## file: path/relative/to/root        (one per hunk, before its snippet)
         <<<<
         snippet (verbatim lines)
         ====
         replacement (verbatim lines; may be empty)
         >>>>
    Lines outside blocks starting with # are comments."""
    mutants, cur, mode, buf, hunk = [], None, None, [], None
    with open(path) as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines, 1):
        if mode in ("old", "new"):
            if line == "====" and mode == "old":
                hunk["old"], buf, mode = "\n".join(buf), [], "new"
            elif line == ">>>>" and mode == "new":
                hunk["new"], buf, mode = "\n".join(buf), [], None
                cur["hunks"].append(hunk)
            else:
                buf.append(line)
            continue
        m = re.match(r"## (id|what|file): ?(.*)$", line)
        if m:
            key, val = m.group(1), m.group(2).strip()
            if key == "id":
                cur = {"id": val, "what": "", "hunks": [], "line": n}
                mutants.append(cur)
            elif cur is None:
                sys.exit(f"{path}:{n}: '## {key}' before any '## id'")
            elif key == "what":
                cur["what"] = val
            else:
                hunk = {"file": val}
        elif line == "<<<<":
            if cur is None or hunk is None or "old" in hunk:
                sys.exit(f"{path}:{n}: '<<<<' without a '## file' before it")
            mode, buf = "old", []
        elif line.strip() and not line.startswith("#"):
            sys.exit(f"{path}:{n}: unexpected line outside a hunk: {line!r}")
    if mode:
        sys.exit(f"{path}: unterminated hunk at the end")
    ids = [m["id"] for m in mutants]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        sys.exit(f"{path}: duplicate ids {sorted(dup)}")
    return mutants


def run(cmd, cwd, log, timeout=None):
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        try:
            p = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
            return p.returncode
        except subprocess.TimeoutExpired:
            f.write(f"timeout after {timeout} s\n")
            return 124


def failed_tests(log_text):
    """Names of the tests ctest lists as failed (also timeouts) in its summary."""
    names = []
    for m in re.finditer(r"^\s*\d+ - (\S+) \((Failed|Timeout|SEGFAULT|Subprocess aborted|"
                         r"Child aborted|Exception|OTHER_FAULT|ILLEGAL|BUS_ERROR|Not Run)\)",
                         log_text, re.M):
        names.append(m.group(1) + ("" if m.group(2) == "Failed" else f" [{m.group(2).lower()}]"))
    return names


EXCLUDE = None  # --exclude: a ctest -E regex


def ctest(build, label, exclude, jobs, log):
    cmd = ["ctest", "-j", str(jobs), "--timeout", "300", "--output-on-failure"]
    if EXCLUDE:
        cmd += ["-E", EXCLUDE]
    if label:
        cmd += ["-L", label]
    if exclude:
        cmd += ["-LE", exclude]
    start = os.path.getsize(log) if os.path.exists(log) else 0
    rc = run(cmd, build, log)
    with open(log) as f:
        f.seek(start)
        text = f.read()
    return rc, failed_tests(text)


def failed_pytests(log_text):
    """Names of the tests pytest lists as failed or in error in its short summary."""
    return [m.group(2) + ("" if m.group(1) == "FAILED" else " [error]")
            for m in re.finditer(r"^(FAILED|ERROR) (\S+)", log_text, re.M)]


def pytest_stage(tree, build, python, jobs, log):
    """make the extension in the scratch tree (a no-op unless python/csrc changed), then
    python/tests against the scratch build, up to its first failure."""
    rc = run(["make", "--no-print-directory", f"PYTHON={python}",
              "python/spanhead/_spanhead.abi3.so"], tree, log)
    if rc:
        return rc, ["the Python extension does not build"]
    env = dict(os.environ, SPANHEAD_LIB=os.path.join(build, "libspanhead.so"),
               SPANHEAD_CLI=os.path.join(build, "spanhead"), SPANHEAD_BUILD_DIR=build,
               PYTHONPATH=os.path.join(tree, "python"), PYTHONDONTWRITEBYTECODE="1",
               OMP_NUM_THREADS=str(jobs))
    # -x: a killed mutant stops at its first failing test (the whole suite takes minutes)
    cmd = [python, "-m", "pytest", "-q", "-x", "-rfE", "-p", "no:cacheprovider", "python/tests"]
    start = os.path.getsize(log) if os.path.exists(log) else 0
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT,
                                timeout=1800).returncode
        except subprocess.TimeoutExpired:
            f.write("timeout\n")
            rc = 124
    with open(log) as f:
        f.seek(start)
        text = f.read()
    return rc, failed_pytests(text)


def stages_for(m, with_pytest):
    """The stage order of a mutant: C-only changes run the C stages first, Python-only ones
    pytest first."""
    py_only = all(h["file"].startswith("python/") for h in m["hunks"])
    st = list(STAGES)
    if with_pytest:
        st = [PYTEST] + st if py_only else st + [PYTEST]
    return st


def copy_tree(dst):
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in files:
        if not rel:
            continue
        src = os.path.join(ROOT, rel)
        if not os.path.isfile(src) or os.path.islink(src):
            continue
        out = os.path.join(dst, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        shutil.copy2(src, out)


def check_snippets(mutants, tree):
    stale = []
    for m in mutants:
        for h in m["hunks"]:
            path = os.path.join(tree, h["file"])
            if not os.path.exists(path):
                stale.append(f"{m['id']}: {h['file']} does not exist")
                continue
            n = open(path).read().count(h["old"])
            if n != 1:
                first = h["old"].strip().split("\n")[0][:70]
                stale.append(f"{m['id']}: {h['file']}: snippet found {n} times "
                             f"(expected once): {first!r}")
    return stale


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--list", default=os.path.join(ROOT, "tests", "mutants.txt"))
    ap.add_argument("--only", default="", help="comma-separated ids")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", os.cpu_count() or 2)))
    ap.add_argument("--all-stages", action="store_true",
                    help="run every stage for every mutant (lists every killer)")
    ap.add_argument("--python", default=os.environ.get("MUTANTS_PYTHON") or (
        os.path.join(ROOT, "build-venv", "bin", "python")
        if os.path.exists(os.path.join(ROOT, "build-venv", "bin", "python")) else sys.executable),
        help="the interpreter of the pytest stage")
    ap.add_argument("--no-pytest", action="store_true", help="leave the pytest stage out")
    ap.add_argument("--exclude", default="",
                    help="ctest -E regex of tests to leave out (say why in the results)")
    a = ap.parse_args()
    global EXCLUDE
    EXCLUDE = a.exclude or None
    with_pytest = not a.no_pytest
    # the stage runs in the scratch tree: a relative path or a bare name resolved here
    a.python = (os.path.abspath(a.python) if os.sep in a.python
                else shutil.which(a.python) or a.python)
    mutants = parse(a.list)
    if a.only:
        want = set(a.only.split(","))
        unknown = want - {m["id"] for m in mutants}
        if unknown:
            sys.exit(f"unknown mutant ids: {sorted(unknown)}")
        mutants = [m for m in mutants if m["id"] in want]
    stale = check_snippets(mutants, ROOT)
    if stale:
        print("mutants: stale snippets (the code moved; update tests/mutants.txt):")
        for s in stale:
            print("  " + s)
        return 2

    scratch = os.environ.get("MUTANTS_DIR") or tempfile.mkdtemp(prefix="spanhead-mutants-")
    tree, build = os.path.join(scratch, "tree"), os.path.join(scratch, "build")
    log = os.path.join(scratch, "mutants.log")
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(tree)
    copy_tree(tree)
    print(f"mutants: {len(mutants)} mutants, scratch {scratch} (log {log})", flush=True)
    t0 = time.time()
    cfg = ["cmake", "-S", tree, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DSPH_CUDA=OFF",
           "-DSPH_BUILD_BENCH=OFF", "-DSPH_WERROR=OFF"]
    if run(cfg, scratch, log) or run(["cmake", "--build", build, "-j", str(a.jobs)], scratch, log):
        print(f"mutants: the unmutated tree does not configure or build (see {log})")
        return 2
    for stage in STAGES + ([PYTEST] if with_pytest else []):
        if stage == PYTEST:
            rc, bad = pytest_stage(tree, build, a.python, a.jobs, log)
        else:
            rc, bad = ctest(build, *stage, a.jobs, log)
        if rc:
            print(f"mutants: the unmutated tree fails its tests: {', '.join(bad) or rc} "
                  f"(see {log})")
            return 2
    print(f"mutants: baseline builds and passes ({time.time() - t0:.0f} s)", flush=True)

    results, status = [], 0
    for m in mutants:
        t1 = time.time()
        originals = {}
        for h in m["hunks"]:
            path = os.path.join(tree, h["file"])
            if path not in originals:
                originals[path] = open(path).read()
        texts = dict(originals)
        for h in m["hunks"]:
            path = os.path.join(tree, h["file"])
            texts[path] = texts[path].replace(h["old"], h["new"], 1)
        for path, text in texts.items():
            with open(path, "w") as f:
                f.write(text)
        killers, how = [], ""
        if run(["cmake", "--build", build, "-j", str(a.jobs)], scratch, log):
            how, status = "DOES NOT BUILD", 2
        else:
            for stage in stages_for(m, with_pytest):
                if stage == PYTEST:
                    rc, bad = pytest_stage(tree, build, a.python, a.jobs, log)
                    tool = "pytest"
                else:
                    rc, bad = ctest(build, *stage, a.jobs, log)
                    tool = "ctest"
                if rc:
                    killers += bad or [f"{tool} exit {rc}"]
                    if not a.all_stages:
                        break
            how = "killed" if killers else "SURVIVED"
            if not killers:
                status = max(status, 1)
        for path, text in originals.items():
            with open(path, "w") as f:
                f.write(text)
            os.utime(path)  # newer than the mutant's objects: rebuilt next time
        dt = time.time() - t1
        results.append((m, how, killers))
        print(f"  {m['id']:<28} {how:<8} {dt:5.0f} s  {', '.join(killers)}", flush=True)
    # the restored tree builds again (the last mutant's objects replaced)
    run(["cmake", "--build", build, "-j", str(a.jobs)], scratch, log)

    print(f"\nmutants: {sum(1 for r in results if r[1] == 'killed')} of {len(results)} killed "
          f"in {time.time() - t0:.0f} s")
    print("| mutant | planted bug | killed by |")
    print("|---|---|---|")
    for m, how, killers in results:
        print(f"| {m['id']} | {m['what']} | {', '.join(killers) if killers else how} |")
    if not a.keep and status == 0:
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        print(f"scratch kept: {scratch}")
    return status


if __name__ == "__main__":
    sys.exit(main())
