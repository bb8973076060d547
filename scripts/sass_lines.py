#!/usr/bin/env python3
"""SASS instructions of the kernels in `nvdisasm -g -c` output, without a GPU.

For each kernel whose mangled name contains NAME (all kernels when none is given): the total
static instruction count, the spills (STL / LDL), the loops (a backward branch to a label of
the same kernel: its body's length and the source lines it holds), and with --lines the
instructions per source line of FILE (default head_sm90.cu).

    scripts/sass_lines.py epi.sass [NAME ...] [--lines] [--src FILE]

Used by scripts/sass_epi.sh (the sm_90a statistics epilogue's variants, bench/cuda/sass_epi.cu).
"""
import collections
import re
import sys


def parse(path):
    """{kernel: [(source (file, line) or None, opcode, label or None, branch target or None)]}"""
    kernels, cur, src, label = {}, None, None, None
    for ln in open(path, encoding="utf-8", errors="replace"):
        if ln.startswith("//---------------------"):
            m = re.search(r"\.text\.(\S+)", ln)
            cur = m.group(1) if m else None
            if cur:
                kernels[cur] = []
            src, label = None, None
            continue
        if cur is None:
            continue
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)', ln)
        if m:
            src = (m.group(1).split("/")[-1], int(m.group(2)))
            continue
        m = re.match(r"^(\.L_x_\d+):", ln)
        if m:
            label = m.group(1)
            continue
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)", ln)
        if m:
            op, rest = m.group(2), m.group(3)
            t = re.search(r"`\((\.L_x_\d+)\)", rest) if op.startswith("BRA") else None
            kernels[cur].append((src, op, label, t.group(1) if t else None))
            label = None
    return kernels


def report(name, ins, lines, srcfile):
    print(f"== {name}: {len(ins)} instructions")
    spills = collections.Counter((s, op) for s, op, _, _ in ins if op.startswith(("STL", "LDL")))
    print("   spills:", ", ".join(f"{op} at {s[0]}:{s[1]} x{n}" for (s, op), n in spills.items())
          if spills else "none")
    where = {lab: i for i, (_, _, lab, _) in enumerate(ins) if lab}
    for i, (_, _, _, tgt) in enumerate(ins):
        if tgt in where and where[tgt] <= i:
            body = ins[where[tgt]:i + 1]
            srcs = sorted({s[1] for s, _, _, _ in body if s and s[0] == srcfile})
            print(f"   loop: {len(body)} instructions, {srcfile} lines {srcs[:12]}"
                  f"{' ...' if len(srcs) > 12 else ''}")
    if lines:
        per = collections.defaultdict(collections.Counter)
        for s, op, _, _ in ins:
            if s and s[0] == srcfile:
                per[s[1]][op.split(".")[0]] += 1
        for ln in sorted(per):
            c = per[ln]
            print(f"   {ln:5d} {sum(c.values()):6d}  " +
                  " ".join(f"{o}:{n}" for o, n in c.most_common(6)))


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    srcfile = "head_sm90.cu"
    if "--src" in argv:
        srcfile = argv[argv.index("--src") + 1].split("/")[-1]
        args = [a for a in args if a != argv[argv.index("--src") + 1]]
    if not args:
        print(__doc__)
        return 2
    kernels = parse(args[0])
    names = args[1:]
    for k, ins in kernels.items():
        if not names or any(n in k for n in names):
            report(k, ins, "--lines" in argv, srcfile)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
