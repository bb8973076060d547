#!/usr/bin/env python3
"""ncu_sass_hot.py - where a kernel's warps wait, per SASS instruction, from Nsight Compute's
source page (`ncu -i REP --page source --csv --print-source sass`, PC sampling of the
SourceCounters section): the instructions ranked by their stall samples until they hold
`--cover` of them (default 0.8), then the samples summed by opcode and, where the export has
them, by stall reason. Generic over the export's columns (they differ between versions): the
sample column is the first whose name holds "Sampling" and "All", else any "Sampling".
   usage: ncu_sass_hot.py SOURCE.csv [--cover 0.8] [--top 80]
"""
import collections
import csv
import sys


def num(s):
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    path, cover, top = args[0], 0.8, 80
    if "--cover" in args:
        cover = float(args[args.index("--cover") + 1])
    if "--top" in args:
        top = int(args[args.index("--top") + 1])
    rows = list(csv.reader(open(path, errors="replace")))
    # the header: the first row naming a source column and a sampling column
    hi = next((i for i, r in enumerate(rows)
               if any("Source" in c for c in r) and any("Sampling" in c for c in r)), None)
    if hi is None:
        print("ncu_sass_hot: no header with Source and Sampling columns in", path)
        print("\n".join(",".join(r)[:200] for r in rows[:8]))
        return 1
    h = rows[hi]
    src = next(i for i, c in enumerate(h) if "Source" in c)
    samp = [i for i, c in enumerate(h) if "Sampling" in c]
    si = next((i for i in samp if "All" in h[i]), samp[0])
    ni = next((i for i in samp if "Not" in h[i] and i != si), None)
    addr = next((i for i, c in enumerate(h) if c.strip().lower() in ("address", "#")), None)
    reasons = [i for i, c in enumerate(h)
               if i not in samp and c.startswith(("stall_", "smsp__pcsamp", "Stall"))]
    body = [r for r in rows[hi + 1:] if len(r) == len(h)]
    total = sum(num(r[si]) for r in body)
    print(f"columns: sample '{h[si]}'" + (f", not issued '{h[ni]}'" if ni is not None else "")
          + f"; {len(body)} instructions, {total:.0f} samples")
    if total <= 0:
        return 1
    ranked = sorted(body, key=lambda r: -num(r[si]))
    acc = 0.0
    print(f"{'share':>6s} {'cum':>6s} {'samples':>8s}  " + ("addr    " if addr is not None else "")
          + "instruction")
    for k, r in enumerate(ranked):
        v = num(r[si])
        acc += v
        extra = ""
        if reasons:
            rs = sorted(((num(r[i]), h[i]) for i in reasons), reverse=True)[:2]
            extra = "  [" + ", ".join(f"{n.replace('stall_', '')} {x:.0f}" for x, n in rs if x > 0) + "]"
        a = f"{r[addr]:>7s} " if addr is not None else ""
        print(f"{100 * v / total:5.1f}% {100 * acc / total:5.1f}% {v:8.0f}  {a}{r[src].strip()[:90]}{extra}")
        if acc >= cover * total or k + 1 >= top:
            break
    ops = collections.Counter()
    for r in body:
        op = r[src].strip().split()
        if not op:
            continue
        o = op[0]
        if o.startswith("@") and len(op) > 1:
            o = op[1]
        ops[o.split(".")[0]] += num(r[si])
    print("\nby opcode:")
    for o, v in ops.most_common(25):
        print(f"{100 * v / total:5.1f}% {v:8.0f}  {o}")
    if reasons:
        print("\nby stall reason:")
        rs = sorted(((sum(num(r[i]) for r in body), h[i]) for i in reasons), reverse=True)
        for v, n in rs[:16]:
            if v > 0:
                print(f"{100 * v / total:5.1f}% {v:8.0f}  {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
