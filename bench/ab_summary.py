#!/usr/bin/env python3
"""ab_summary.py - same-run A/B summary of two `spanhead bench` JSON Lines files (issue 6).

    ab_summary.py A.jsonl B.jsonl [--label-a X] [--label-b Y] [--mask M,...]

Points are matched by (shape, H, V_local, N, active, mask, mode, tp, cp); tp and cp are null
for grid runs and missing in files written before --matrix existed (both read as null), and
active is compared at the 4 decimals the bench writes. Per matched point the reduction is
1 - ms_A / ms_B: positive when A is faster. The closing line is the seed's summary: wins
(A faster) / total, then the mean, median and range of the reduction over the matched points.
Points present in only one file are listed, never dropped silently. A point given twice in one
file (the bench appends to --json, so two runs into one file do this) is an error: it would
make the match ambiguous.

Exit status: 0 ok, 1 no point matched, 2 usage error or malformed input.
Standard library only.
"""
import argparse
import json
import math
import statistics
import sys

KEY = ("shape", "H", "V_local", "N", "active", "mask", "mode", "tp", "cp")
REQUIRED = ("shape", "H", "V_local", "N", "active", "mask", "mode", "ms")


class InputError(Exception):
    pass


def _int(rec, name, where, nullable=False):
    v = rec.get(name)
    if v is None and nullable:
        return None
    # bool is an int in Python; a true/false there is a malformed record, not 1/0
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise InputError(f"{where}: {name} = {v!r}, expected an integer >= 1")
    return v


def _str(rec, name, where):
    v = rec.get(name)
    if not isinstance(v, str) or not v:
        raise InputError(f"{where}: {name} = {v!r}, expected a non-empty string")
    return v


def _num(rec, name, where, hi, want):
    """A finite number in (0, hi]; want describes the range for the message."""
    v = rec.get(name)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not (ok and 0 < v <= hi):
        raise InputError(f"{where}: {name} = {v!r}, expected {want}")
    return float(v)


def load(path):
    """Returns {key: (ms, line number)} for the file's points, in file order."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start})")
    points = {}
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{no}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{where}: not JSON ({e.msg} at column {e.colno})")
        if not isinstance(rec, dict):
            raise InputError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        missing = [k for k in REQUIRED if k not in rec]
        if missing:
            raise InputError(f"{where}: missing field(s) {', '.join(missing)}")
        key = (
            _str(rec, "shape", where),
            _int(rec, "H", where),
            _int(rec, "V_local", where),
            _int(rec, "N", where),
            round(_num(rec, "active", where, 1.0, "a number in (0, 1]"), 4),
            _str(rec, "mask", where),
            _str(rec, "mode", where),
            _int(rec, "tp", where, nullable=True),
            _int(rec, "cp", where, nullable=True),
        )
        ms = _num(rec, "ms", where, math.inf, "a number > 0")
        if key in points:
            raise InputError(
                f"{where}: point {fmt_key(key)} already at line {points[key][1]} "
                "(two runs appended to one file? give each run its own --json file)"
            )
        points[key] = (ms, no)
    if not points:
        raise InputError(f"{path}: no points")
    return points


def fmt_key(k):
    d = dict(zip(KEY, k))
    lay = "" if d["tp"] is None else f" TP{d['tp']}/CP{d['cp']}"
    return (
        f"{d['shape']} H={d['H']} V_local={d['V_local']} N={d['N']}{lay} "
        f"active={d['active']:.4f} {d['mask']} {d['mode']}"
    )


def cells(k):
    d = dict(zip(KEY, k))
    tp, cp = ("-", "-") if d["tp"] is None else (str(d["tp"]), str(d["cp"]))
    return [d["shape"], str(d["H"]), str(d["V_local"]), str(d["N"]), tp, cp,
            f"{d['active']:.4f}", d["mask"], d["mode"]]


def main(argv):
    ap = argparse.ArgumentParser(
        description="Same-run A/B summary of two spanhead bench JSON Lines files.")
    ap.add_argument("a", metavar="A.jsonl")
    ap.add_argument("b", metavar="B.jsonl")
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    ap.add_argument("--mask", help="only these masks, comma-separated (e.g. response,packed-rl;"
                    " 'none' is the dense path)")
    args = ap.parse_args(argv)  # exits 2 on usage errors
    try:
        pa, pb = load(args.a), load(args.b)
    except InputError as e:
        print(f"ab_summary.py: {e}", file=sys.stderr)
        return 2
    if args.mask:
        keep = set(args.mask.split(","))
        pa = {k: v for k, v in pa.items() if k[5] in keep}
        pb = {k: v for k, v in pb.items() if k[5] in keep}

    la, lb = args.label_a, args.label_b
    both = [k for k in pa if k in pb]
    head = ["shape", "H", "V_local", "N", "tp", "cp", "active", "mask", "mode",
            f"ms {la}", f"ms {lb}", "reduction"]
    print(f"# A/B: {la} ({args.a}) vs {lb} ({args.b}); reduction = 1 - ms {la} / ms {lb}\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    red = []
    for k in both:
        ma, mb = pa[k][0], pb[k][0]
        r = 100.0 * (1.0 - ma / mb)
        red.append(r)
        print("| " + " | ".join(cells(k) + [f"{ma:.4f}", f"{mb:.4f}", f"{r:+.1f}%"]) + " |")

    only_a = [k for k in pa if k not in pb]
    only_b = [k for k in pb if k not in pa]
    if only_a or only_b:
        print(f"\nunmatched: {len(only_a)} point(s) only in {la}, {len(only_b)} only in {lb}")
        for lab, ks in ((la, only_a), (lb, only_b)):
            for k in ks:
                print(f"- only in {lab}: {fmt_key(k)}")
    print()
    if not red:
        print(f"ab_summary.py: no point of {args.a} matches one of {args.b}", file=sys.stderr)
        return 1
    wins = sum(1 for r in red if r > 0)
    print(
        f"{la} vs {lb}: {la} faster at {wins}/{len(red)} points; reduction mean "
        f"{statistics.mean(red):+.1f}%, median {statistics.median(red):+.1f}%, range "
        f"[{min(red):+.1f}%, {max(red):+.1f}%]"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
