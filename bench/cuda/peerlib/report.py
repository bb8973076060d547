"""peers.py, part: the markdown table, the final comparison and the picture."""

import os
import subprocess
from pathlib import Path

from .common import GIB, IMPLS, ONE_PASS_PEERS, REPO, log


# ----------------------------------------------------------------------------------------
# Outputs


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def best_peers(rs):
    """The fastest peer (compacted included) and the fastest one that takes its upstream
    gradient after the forward, among a point's measured rows."""
    peers = [r for r in rs if r.get("ms") is not None and not r["impl"].startswith("spanhead")]
    best = min(peers, key=lambda r: r["ms"]) if peers else None
    two = [r for r in peers if r["impl"] not in ONE_PASS_PEERS]
    best2 = min(two, key=lambda r: r["ms"]) if two else None
    return best, best2


def annotate_point(rs):
    """Adds best_peer, best_peer_ms, vs_best_peer (ms / best peer ms: < 1 is faster than every
    peer) and the same against the peers taking the gradient after the forward."""
    best, best2 = best_peers(rs)
    for r in rs:
        for tag, b in (("", best), ("_general", best2)):
            r[f"best_peer{tag}"] = b["impl"] if b else None
            r[f"best_peer{tag}_ms"] = b["ms"] if b else None
            r[f"vs_best_peer{tag}"] = (r["ms"] / b["ms"]) if b and r.get("ms") else None


def write_md(path, meta, records, notes):
    mode = meta.get("mode", "logprob")
    what = ("loss = sum of masked log-probs (spanhead: the general path; spanhead-onepass: "
            "the one-pass mode, gradients in the forward's sweep)" if mode == "logprob" else
            f"loss = ppo clipped policy loss, token-mean (clip {meta.get('clip')}), "
            f"per-sequence advantages")
    lines = [f"# spanhead vs peers ({mode}): {meta['gpu']}, {meta['date']}, commit "
             f"{meta['commit']}", "",
             f"torch {meta['torch']}, triton {meta['triton']}, python {meta['python']}; "
             f"dtype {meta['dtype']}, forward + backward, grads of hidden and weight, {what}.",
             ""]
    for k, v in meta["versions"].items():
        lines.append(f"- {k}: {v}")
    for k, v in meta["unavailable"].items():
        lines.append(f"- {k}: skipped: {v}")
    for k, v in sorted(meta["gemm"].items()):
        lines.append(f"- dense bf16 GEMM rate {k}: {v / 1e12:.1f} TFLOP/s")
    lines += ["",
              "ratio = ms / (8 N_active H V / GEMM rate), r6 = ms / (6 N_active H V / rate); "
              "vs best = ms / the fastest peer's ms at the point (compacted peers included; "
              "< 1: faster than every peer). first s = the first call's wall time (JIT, "
              "autotuning, torch.compile), not in ms. peak extra = peak allocated during the "
              "timed reps beyond the inputs and the two gradient outputs. check: against "
              "spanhead's log-probs on active rows (max abs; sum/row where the peer returns "
              "only the sum), policy loss (abs), gradients (relative error); MISMATCH above "
              "tolerance.",
              "",
              "| shape | N | active | mask | impl | ms | floor ms | ratio | r6 | vs best | "
              "first s | peak extra GiB | logp/loss diff | grad relerr | status |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        pe = r.get("peak_extra_bytes")
        status = r.get("status", "")
        if r.get("flag"):
            status = f"{status} {r['flag']}"
        if r.get("notes"):
            status = f"{status} ({r['notes']})"
        diff = r.get("loss_diff") if r.get("loss_diff") is not None else r.get("logp_diff")
        lines.append(
            f"| {r['shape']} | {r['N']} | {r['active']:.3f} | {r['mask']} | {r['impl']} | "
            f"{fmt(r.get('ms'), '.3f')} | {fmt(r.get('floor_ms'), '.3f')} | "
            f"{fmt(r.get('ratio'), '.3f')} | {fmt(r.get('ratio_onepass'), '.3f')} | "
            f"{fmt(r.get('vs_best_peer'), '.2f')} | {fmt(r.get('first_call_s'), '.1f')} | "
            f"{fmt(None if pe is None else pe / GIB, '.3f')} | "
            f"{fmt(diff, '.2e')} | {fmt(r.get('grad_relerr'), '.2e')} | {status} |")
    pts = {}
    for r in records:
        pts.setdefault((r["shape"], r["N"], r["active_target"], r["mask"]), []).append(r)
    summ = []
    for key, rs in pts.items():
        best, best2 = best_peers(rs)
        if best is None:
            continue
        row = [key[0], str(key[1]), f"{rs[0]['active']:.3f}", key[3]]
        for impl in (("spanhead", "spanhead-onepass") if mode == "logprob"
                     else ("spanhead+torch", "spanhead-policy")):
            s = [r for r in rs if r["impl"] == impl and r.get("ms") is not None]
            row += ([f"{s[0]['ms']:.3f}", fmt(s[0].get("ratio"), ".3f"),
                     fmt(s[0].get("ratio_onepass"), ".3f"), f"{s[0]['ms'] / best['ms']:.2f}"]
                    if s else ["-"] * 4)
        row += [best["impl"], f"{best['ms']:.3f}", fmt(best.get("ratio"), ".3f")]
        row += ([best2["impl"], f"{best2['ms']:.3f}"] if best2 else ["-", "-"])
        summ.append("| " + " | ".join(row) + " |")
    if summ:
        a, b = (("general", "one-pass") if mode == "logprob" else ("logprobs+torch", "fused"))
        lines += ["", "## spanhead against the fastest peer at each point", "",
                  f"vs = spanhead ms / fastest peer ms (< 1: spanhead faster). The last two "
                  f"columns leave out the peers that compute their gradients inside the "
                  f"forward ({', '.join(sorted(ONE_PASS_PEERS))}): the comparison for "
                  f"spanhead's general path, which takes its gradient after the forward.", "",
                  f"| shape | N | active | mask | {a} ms | ratio | r6 | vs | {b} ms | ratio | "
                  f"r6 | vs | fastest peer | its ms | its ratio | fastest taking the gradient "
                  f"after the forward | its ms |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"] + summ
    firsts = {}
    for r in records:
        if r.get("first_call_s") is not None and r.get("ms") is not None:
            firsts.setdefault(r["impl"], []).append(r["first_call_s"] - r["ms"] * 1e-3)
    if firsts:
        lines += ["", "## first-call cost (compilation, autotuning; not in ms)", "",
                  "| impl | points | total s | max s |", "|---|---|---|---|"]
        for k, v in firsts.items():
            lines.append(f"| {k} | {len(v)} | {sum(v):.1f} | {max(v):.1f} |")
    if notes:
        lines += ["", "## notes", ""] + [f"- {n}" for n in notes]
    Path(path).write_text("\n".join(lines) + "\n")


def final_table(records, mode):
    """A short table for the end of the log (the device tool returns only its tail)."""
    pts = {}
    for r in records:
        pts.setdefault((r["shape"], r["N"], r["active_target"], r["mask"]), []).append(r)
    a, b = (("spanhead", "spanhead-onepass") if mode == "logprob"
            else ("spanhead+torch", "spanhead-policy"))
    out = [f"# final ({mode}): ms, ratio to 8NHV (r8) / 6NHV (r6), vs = ms / fastest peer",
           f"# {'point':<28} {a + ' ms':>16} r8    {b + ' ms':>18} r6    fastest peer"]
    for key, rs in pts.items():
        best, _ = best_peers(rs)

        def cell(impl, ratio_key):
            s = [r for r in rs if r["impl"] == impl and r.get("ms") is not None]
            if not s:
                return f"{'-':>16} {'-':>5}"
            return f"{s[0]['ms']:16.2f} {fmt(s[0].get(ratio_key), '5.2f')}"

        name = f"{key[0]} {key[1] // 1024}K {rs[0]['active']:.2f} {key[3]}"
        bp = (f"{best['impl']} {best['ms']:.2f} ({fmt(best.get('ratio'), '.2f')})"
              if best else "-")
        out.append(f"  {name:<28} {cell(a, 'ratio')} {cell(b, 'ratio_onepass'):>24} {bp}")
    fails = [f"{r['impl']}@{r['shape']}/{r['N'] // 1024}K/{r['active']:.2f}/{r['mask']}: "
             f"{r['status']}" for r in records
             if r.get("ms") is None and not str(r.get("status", "")).startswith("skipped")]
    skips = sorted({f"{r['impl']}: {str(r['status'])[len('skipped: '):]}" for r in records
                    if str(r.get("status", "")).startswith("skipped")})
    flags = [f"{r['impl']}@{r['shape']}/{r['active']:.2f}/{r['mask']}: {r['flag']}"
             for r in records if r.get("flag")]
    for title, items in (("failed", fails), ("skipped", skips), ("flagged", flags)):
        if items:
            out.append(f"# {title}: " + "; ".join(items)[:1500])
    return "\n".join(out)


def write_plot(path, records):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        log(f"# plot skipped: matplotlib unavailable ({e})")
        return
    shapes = []
    for r in records:
        if (r["shape"], r["N"]) not in shapes:
            shapes.append((r["shape"], r["N"]))
    if not shapes:
        return
    n = len(shapes)
    cols = min(n, 2)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4.8 * rows), squeeze=False)
    impls = [i for i in IMPLS if any(r["impl"] == i for r in records)]
    cmap = plt.get_cmap("tab20")
    color = {impl: cmap(j % 20) for j, impl in enumerate(impls)}
    for k, (shape, N) in enumerate(shapes):
        ax = axes[k // cols][k % cols]
        rs = [r for r in records if r["shape"] == shape and r["N"] == N and r.get("ms")]
        labelled = set()
        for mask, ls, mk in (("response", "-", "o"), ("fragmented", ":", "s")):
            # fragmented is not run at 1.0: its line starts from response's dense point
            m = [r for r in rs if r["mask"] == mask or (mask == "fragmented" and
                                                        r["mask"] == "response" and
                                                        r["active"] >= 1.0)]
            if not any(r["mask"] == mask for r in m):
                continue
            for impl in impls:
                pts = sorted((r["active"], r["ms"]) for r in m if r["impl"] == impl)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, marker=mk,
                            color=color[impl], label=None if impl in labelled else impl)
                    labelled.add(impl)
            for key, fls, lab in (("floor_ms", "-", "8NHV floor"),
                                  ("floor_onepass_ms", "--", "6NHV floor")):
                fl = sorted({(r["active"], r[key]) for r in m if r.get(key)})
                if fl:
                    ax.plot([p[0] for p in fl], [p[1] for p in fl], fls if mask == "response"
                            else ":", color="black", lw=1.8 if key == "floor_ms" else 1.2,
                            label=None if lab in labelled else lab)
                    labelled.add(lab)
        for r in rs:        # packed-rl: one point per impl at the batch's fraction
            if r["mask"] == "packed-rl":
                ax.plot([r["active"]], [r["ms"]], "X", ms=8, color=color[r["impl"]],
                        label=None if r["impl"] in labelled else r["impl"])
                labelled.add(r["impl"])
        ax.set_title(f"{shape}: H {rs[0]['H'] if rs else '?'}, V {rs[0]['V_local'] if rs else '?'}"
                     f", N {N} (solid: response, dotted: fragmented, X: packed-rl)", fontsize=9)
        ax.set_xlabel("active fraction")
        ax.set_ylabel("forward + backward ms")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    for k in range(n, rows * cols):
        axes[k // cols][k % cols].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def commit_hash():
    c = os.environ.get("SPH_COMMIT")
    if c:
        return c
    try:
        r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    return "unknown"
