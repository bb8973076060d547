#!/usr/bin/env python3
"""The sm_90a logits kernel's stack, per instantiation, from the built object (no GPU needed).

head_logits_sm90_kernel holds every epilogue variant of a mode behind run-time branches, so
they share one register allocation at __launch_bounds__(384, 1) (168 registers); a variant that
needs more spills the kernel's own loop state for every launch of that mode, plain ones
included (run 33: 128 bytes of stack cost the statistics kernel 1.3 ms; notes/cuda-notes.md,
"v26": an A/B bit beside the emission spilled 24 / 144 bytes). This check holds the budgets:
0 bytes for the logits, statistics, dlogits and main-loop-only modes, 16 for the one-pass
(statistics + E) mode (8 today). cuobjdump comes from the CUDA toolkit or the test
environment's Triton wheel; without one the check skips (exit 77) and says so.

    check_sm90_stack.py BUILD_DIR [ROOT]
"""
import glob
import os
import re
import shutil
import subprocess
import sys

BUDGET = {0: 0, 1: 0, 2: 0, 4: 0, 10: 16}  # EPI mode -> stack bytes at most


def find_cuobjdump(root):
    cands = [shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]
    cands += sorted(glob.glob(os.path.join(
        root, "build-venv/lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump")))
    cands += sorted(glob.glob(os.path.join(
        root, "build-venv/lib/python3*/site-packages/nvidia/cuda_cuobjdump/bin/cuobjdump")))
    return next((c for c in cands if c and os.access(c, os.X_OK)), None)


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    build = argv[1]
    root = argv[2] if len(argv) > 2 else os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    objs = glob.glob(os.path.join(build, "**", "head_sm90.cu.o"), recursive=True)
    if not objs:
        print(f"SKIP: no head_sm90.cu.o under {build} (a build without CUDA)")
        return 77
    tool = find_cuobjdump(root)
    if not tool:
        print("SKIP: no cuobjdump (the CUDA toolkit's, or build-venv's Triton wheel: make test "
              "makes it)")
        return 77
    out = subprocess.run([tool, "-res-usage", objs[0]], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"SKIP: {tool} -res-usage failed: {out.stderr.strip()[:200]}")
        return 77
    fails, seen, name = [], 0, None
    for line in out.stdout.splitlines():
        m = re.search(r"Function (\S+):", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"REG:(\d+) STACK:(\d+)", line)
        if not (m and name and "head_logits_sm90_kernel" in name):
            continue
        k = re.search(r"head_logits_sm90_kernelI\w+?Li(\d+)ELb([01])E", name)
        regs, stack = int(m.group(1)), int(m.group(2))
        if not k or regs <= 8:  # the sm_80 stub (a trap) has no epilogue
            continue
        epi, pp = int(k.group(1)), k.group(2) == "1"
        seen += 1
        budget = BUDGET.get(epi, 0)
        verdict = "ok" if stack <= budget else "OVER"
        print(f"{verdict:4s} mode {epi:2d} {'ping-pong' if pp else 'cooperative':11s} "
              f"{'f16' if '__half' in name else 'bf16':4s} REG {regs} STACK {stack} "
              f"(budget {budget})")
        if stack > budget:
            fails.append(name)
    if seen == 0:
        print(f"FAIL: no sm_90a head_logits_sm90_kernel in {objs[0]}")
        return 1
    if fails:
        print(f"FAIL: {len(fails)} instantiation(s) over their stack budget: a variant's "
              "registers spill the kernel's loop state (scripts/sass_epi.sh shows where)")
        return 1
    print(f"{seen} sm_90a instantiations within their stack budgets")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
