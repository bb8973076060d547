#!/usr/bin/env python3
"""distill_oracle.py - inputs and an independent NumPy float64 oracle for test_distill.sh.

  gen DIR SEED dense|sparse [--bf16] [--trows] [--ttrows]   write hidden, weight, mask,
                                       teacher .npy files (and temperature.npy: one temperature
                                       per row; teacher_temperature.npy: the dense teacher's)
  check IN OUT KIND BETA RED [TT [NT]] compare OUT's loss.json, dhidden.npy, dweight.npy with
                                       the loss and gradients from the formulas (docs/distill.md);
                                       NT: reduction mean's divisor (--num-tokens; 0 = counted)
"""
import json
import sys

import numpy as np


def bf16_bits(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def gen(d, seed, teacher, bf16, trows=False, ttrows=False):
    r = np.random.default_rng(seed)
    N, H, V, HT, K = 23, 12, 67, 9, 6
    arrs = {"hidden": r.standard_normal((N, H)), "weight": r.standard_normal((V, H)) / 3}
    if teacher == "dense":
        arrs["teacher_hidden"] = r.standard_normal((N, HT))
        arrs["teacher_weight"] = r.standard_normal((V, HT)) / 2
    for k, v in arrs.items():
        np.save(f"{d}/{k}.npy", bf16_bits(v) if bf16 else v.astype(np.float32))
    np.save(f"{d}/mask.npy", (r.random(N) < 0.7).astype(np.uint8))
    if trows:
        np.save(f"{d}/temperature.npy", r.uniform(0.5, 2.0, N).astype(np.float32))
    if ttrows:
        np.save(f"{d}/teacher_temperature.npy", r.uniform(0.4, 2.5, N).astype(np.float64))
    if teacher == "sparse":
        z = r.standard_normal((N, V)) * 2
        lp = z - np.log(np.exp(z).sum(1, keepdims=True))
        ids = np.argsort(-lp, 1)[:, :K].copy()
        tl = np.take_along_axis(lp, ids, 1)
        ids[:, K - 1] = -1  # padding
        np.save(f"{d}/teacher_topk_ids.npy", ids.astype(np.int64))
        np.save(f"{d}/teacher_topk_logprobs.npy", tl.astype(np.float32))


def load(d, name):
    a = np.load(f"{d}/{name}.npy")
    return (from_bits(a) if a.dtype == np.uint16 else a).astype(np.float64)


def lsm(x):
    m = x.max(1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(1, keepdims=True))


def term(kind, beta, lq, lp):
    """(l, g) per bin: the loss term and g = dL/dQ."""
    q, p = np.exp(lq), np.exp(lp)
    with np.errstate(divide="ignore", invalid="ignore"):
        if kind == "forward-kl" or (kind == "jsd" and beta == 0):
            return np.where(p > 0, p * (lp - lq), 0), -p / q
        if kind == "reverse-kl" or (kind == "jsd" and beta == 1):
            return q * (lq - lp), lq - lp + 1
        m = beta * p + (1 - beta) * q
        l = np.where(p > 0, beta * p * np.log(p / m), 0) + (1 - beta) * q * np.log(q / m)
        return l, (1 - beta) * np.log(q / m)


def check(ind, outd, kind, beta, red, tt, nt=0):
    h, w = load(ind, "hidden"), load(ind, "weight")
    mask = np.load(f"{ind}/mask.npy").astype(bool)
    N, V = h.shape[0], w.shape[0]
    import os
    T = (np.load(f"{ind}/temperature.npy").astype(np.float64)[:, None]
         if os.path.exists(f"{ind}/temperature.npy") else 1.0)
    lq = lsm(h @ w.T / T)
    rows, dz = np.zeros(N), np.zeros((N, V))
    dense = __import__("os").path.exists(f"{ind}/teacher_hidden.npy")
    if dense:
        TT = tt or T
        if os.path.exists(f"{ind}/teacher_temperature.npy"):  # one per row (f8: converted)
            TT = np.load(f"{ind}/teacher_temperature.npy").astype(np.float32)
            TT = TT.astype(np.float64)[:, None]
        lp = lsm(load(ind, "teacher_hidden") @ load(ind, "teacher_weight").T / TT)
    else:
        ids = np.load(f"{ind}/teacher_topk_ids.npy")
        tl = np.load(f"{ind}/teacher_topk_logprobs.npy").astype(np.float64)
    for i in range(N):
        if not mask[i]:
            continue
        q = np.exp(lq[i])
        if dense:
            l, g = term(kind, beta, lq[i], lp[i])
            rows[i] = l.sum()
            dz[i] = q * (g - (q * g).sum())
            continue
        sel = ids[i] >= 0
        idv, lpv = ids[i][sel], tl[i][sel]
        tail = np.ones(V, bool)
        tail[idv] = False
        Qr, Pr = q[tail].sum(), max(0.0, 1 - np.exp(lpv).sum())
        rev = kind == "reverse-kl" or (kind == "jsd" and beta == 1)
        has_tail = tail.any() and not (rev and Pr == 0)
        bq = list(np.log(q[idv])) + ([np.log(Qr)] if has_tail else [])
        bp = list(lpv) + ([np.log(Pr) if Pr > 0 else -np.inf] if has_tail else [])
        l, g = term(kind, beta, np.array(bq), np.array(bp))
        rows[i] = l.sum()
        gj = np.zeros(V)
        gj[idv] = g[: len(idv)]
        if has_tail:
            gj[tail] = g[-1]
        dz[i] = q * (gj - (q * gj).sum())
    n = nt if nt > 0 else mask.sum()
    sc = np.full(N, 1.0 / n if red == "mean" else 1.0)
    dz *= sc[:, None] / T
    want = {"mean": rows.sum() / n, "sum": rows.sum(), "none": rows}[red]
    dh, dw = dz @ w, dz.T @ h
    got = json.load(open(f"{outd}/loss.json"))
    gl = np.array(got["loss"], dtype=np.float64)
    gdh, gdw = np.load(f"{outd}/dhidden.npy"), np.load(f"{outd}/dweight.npy")
    errs = [np.abs(gl - want).max() / max(np.abs(want).max(), 1e-6),
            np.abs(gdh - dh).max() / np.abs(dh).max(), np.abs(gdw - dw).max() / np.abs(dw).max()]
    ok = all(e < 1e-4 for e in errs) and got["kind"] == kind and got["reduction"] == red
    print(f"{kind} beta={beta} {red}: loss {errs[0]:.2e} dhidden {errs[1]:.2e} dweight {errs[2]:.2e}")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1] == "gen":
        gen(sys.argv[2], int(sys.argv[3]), sys.argv[4], "--bf16" in sys.argv, "--trows" in sys.argv,
            "--ttrows" in sys.argv)
        sys.exit(0)
    tt = float(sys.argv[7]) if len(sys.argv) > 7 else 0.0
    nt = int(sys.argv[8]) if len(sys.argv) > 8 else 0
    sys.exit(check(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), sys.argv[6], tt,
                   nt))
