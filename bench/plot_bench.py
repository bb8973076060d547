#!/usr/bin/env python3
"""Time against active fraction per shape, from `spanhead bench --json` records.

usage: plot_bench.py BENCH.jsonl OUT.png [--N 16384] [--peers PEERS.jsonl]
(`spanhead bench --plot OUT.png [--peers PEERS.jsonl]` runs it on the records it just made.)

One panel per shape at the chosen N (default: the smallest N in the file): spanhead's general
path and one-pass for each mask pattern, the active floors (8 and 6 N_active H V at the
same-run burst GEMM rate, dotted; at the sustained rate, dashed, where the records carry
floor_sustained_ms: older files have only the burst floor) and, with --peers
(bench/cuda/peers.py's peers.jsonl), each peer's time on the response mask. Needs
matplotlib (scripts/setup.sh installs it; or pip install matplotlib). Exit status: 0 picture
written, 1 bad input, 2 usage error, 3 matplotlib is missing.
"""
import argparse
import json
import sys


def load(path, skip_unmeasured=False):
    """Records of a JSON Lines file; with skip_unmeasured, rows without a time (peers.py writes
    failed and skipped peers with "ms": null) are left out instead of refused."""
    recs = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                if skip_unmeasured and r.get("ms") is None:
                    continue
                float(r["ms"]), float(r["active"]), r["shape"], int(r["N"])
            except (ValueError, KeyError, TypeError) as e:
                sys.exit(f"plot_bench: {path}:{i}: not a bench record ({e})")
            recs.append(r)
    if not recs:
        sys.exit(f"plot_bench: {path}: no records")
    return recs


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Needs matplotlib (scripts/setup.sh installs it, or pip install matplotlib). "
               "Exit status: 0 written, 1 bad input, 2 usage error, 3 matplotlib missing.")
    ap.add_argument("bench")
    ap.add_argument("out")
    ap.add_argument("--N", type=int, default=None)
    ap.add_argument("--peers", default=None)
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_bench: matplotlib is not installed (scripts/setup.sh installs it, or "
              "pip install matplotlib)", file=sys.stderr)
        sys.exit(3)
    recs = load(a.bench)
    N = a.N if a.N is not None else min(int(r["N"]) for r in recs)
    recs = [r for r in recs if int(r["N"]) == N]
    if not recs:
        sys.exit(f"plot_bench: no records at N = {N}")
    peers = [r for r in load(a.peers, skip_unmeasured=True) if int(r["N"]) == N] \
        if a.peers else []
    shapes = sorted({r["shape"] for r in recs})
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 3.8), squeeze=False)
    for ax, sh in zip(axes[0], shapes):
        rs = [r for r in recs if r["shape"] == sh]
        H, V = rs[0]["H"], rs[0]["V_local"]
        for mode, style in (("general", "-"), ("one-pass", "--")):
            for mask, color in (("response", "C0"), ("fragmented", "C1")):
                pts = sorted((r["active"], r["ms"]) for r in rs
                             if r["mode"] == mode and r["mask"] in (mask, "none"))
                if len(pts) > 1:
                    ax.plot(*zip(*pts), style, color=color, marker="o", ms=3,
                            label=f"spanhead {mode}, {mask}")
            prl = [r for r in rs if r["mode"] == mode and r["mask"] == "packed-rl"]
            for r in prl:
                ax.plot(r["active"], r["ms"], "s" if mode == "general" else "D", color="C2",
                        label=f"spanhead {mode}, packed-RL")
            flops = "8" if mode == "general" else "6"
            for key, style, what in (("floor_ms", ":", "burst"),
                                     ("floor_sustained_ms", (0, (5, 3)), "sustained")):
                fl = sorted((r["active"], r[key]) for r in rs if key in r
                            and r["mode"] == mode and r["mask"] in ("response", "none"))
                if fl:
                    ax.plot(*zip(*fl), linestyle=style,
                            color="k" if mode == "general" else "grey",
                            label=f"{what} floor ({flops} N_act H V)")
        for k, impl in enumerate(sorted({p["impl"] for p in peers if p["shape"] == sh
                                         and not p["impl"].startswith("spanhead")})):
            pts = sorted((p["active"], p["ms"]) for p in peers
                         if p["shape"] == sh and p["impl"] == impl and p["mask"] == "response"
                         and p.get("ms") is not None)
            if pts:
                ax.plot(*zip(*pts), "-", color=f"C{3 + k}", alpha=0.6, lw=1, label=impl)
        ax.set_title(f"{sh}: H {H}, V_local {V}, N {N}")
        ax.set_xlabel("active fraction")
        ax.set_ylabel("fwd + bwd ms")
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.tight_layout()
    # below the panels, as many rows as it needs; bbox_inches="tight" grows the picture to hold
    # it, so no entry is clipped whatever the number of shapes and peers
    ncol = max(1, min(len(labels), 2 * len(shapes) + 1))
    legend = fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                        ncol=ncol, fontsize=7, frameon=False)
    fig.savefig(a.out, dpi=110, bbox_inches="tight", bbox_extra_artists=(legend,))
    print(f"plot_bench: wrote {a.out} ({len(shapes)} shapes, N = {N})")


if __name__ == "__main__":
    main()
