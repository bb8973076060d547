#!/usr/bin/env python3
"""The fused policy loss in float64 NumPy, written from the issue's formulas (docs/policy.md),
for the CLI tests: `gen DIR SEED [bf16]` writes random inputs; `check IN OUT [options]` reads
the inputs of `spanhead run --inputs IN --policy-loss ...` and the files it wrote to OUT, and
compares loss.json, logprob, entropy, dhidden and dweight with a dense float64 computation
(logits z = (c tanh(u / c) or u) / T for --softcap c and --temperature T, log-softmax, the
loss, its gradient through dz = g (onehot - p) + e p (mu - z) and dz/du).
Exit 0 when everything is within the tolerance, 1 otherwise (the worst errors printed)."""

import argparse
import json
import os
import sys

import numpy as np

METRICS = ("loss", "pg_loss", "kl_loss", "entropy_loss", "pg_clipfrac", "pg_clipfrac_lower",
           "ppo_kl")


def gen(d, seed, bf16=False, N=61, H=24, V=97):
    rng = np.random.default_rng(seed)
    os.makedirs(d, exist_ok=True)
    h = rng.standard_normal((N, H)).astype(np.float32)
    w = (rng.standard_normal((V, H)) * 2.0 / H ** 0.5).astype(np.float32)
    if bf16:
        def to(x):
            u = x.view(np.uint32)
            return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        h, w = to(h), to(w)
    np.save(f"{d}/hidden.npy", h)
    np.save(f"{d}/weight.npy", w)
    t = rng.integers(0, V, N).astype(np.int64)
    t[::9] = -100
    np.save(f"{d}/targets.npy", t)
    np.save(f"{d}/mask.npy", (rng.random(N) < 0.75).astype(np.uint8))
    # advantages in float64 on purpose: the CLI converts them
    np.save(f"{d}/advantages.npy", rng.standard_normal(N))
    np.save(f"{d}/old_logprob.npy", (-4.6 + 0.5 * rng.standard_normal(N)).astype(np.float32))
    np.save(f"{d}/ref_logprob.npy", (-4.6 + 0.5 * rng.standard_normal(N)).astype(np.float32))
    np.save(f"{d}/is_weight.npy", (0.5 + rng.random(N)).astype(np.float32))
    lens = rng.integers(1, 9, N)
    np.save(f"{d}/seq_id.npy", np.repeat(np.arange(N), lens)[:N].astype(np.int64))


def load(d, name, dtype=None):
    p = f"{d}/{name}.npy"
    if not os.path.exists(p):
        return None
    a = np.load(p)
    return a.astype(dtype) if dtype else a


def floats(a):
    if a.dtype == np.uint16:  # bf16 bits
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def oracle(d, o):
    h, w = floats(load(d, "hidden")), floats(load(d, "weight"))
    t = load(d, "targets").astype(np.int64)
    N, V = h.shape[0], w.shape[0]
    m = load(d, "mask")
    act = (np.ones(N, bool) if m is None else m.astype(bool)) & (t >= 0)
    A = load(d, "advantages", np.float32).astype(np.float64)
    old = load(d, "old_logprob", np.float32).astype(np.float64)
    ref = load(d, "ref_logprob", np.float32)
    ref = None if ref is None else ref.astype(np.float64)
    isw = load(d, "is_weight", np.float32)
    isw = np.ones(N) if isw is None else isw.astype(np.float64)
    seq = load(d, "seq_id")
    u = h @ w.T
    T_, c_ = o.temperature, o.softcap
    tr = load(d, "temperature", np.float32)
    if tr is not None:  # temperature.npy: one temperature per row
        T_ = tr.astype(np.float64)[:, None]
    if c_:
        th = np.tanh(u / c_)
        z, dzdu = c_ * th / T_, (1.0 - th * th) / T_
    else:
        z, dzdu = u / T_, np.ones_like(u) / T_
    mx = z.max(1, keepdims=True)
    lse = (mx + np.log(np.exp(z - mx).sum(1, keepdims=True)))[:, 0]
    p = np.exp(z - lse[:, None])
    mu = (p * z).sum(1)
    logp = np.where(act, z[np.arange(N), np.clip(t, 0, V - 1)] - lse, 0.0)
    ent = np.where(act, lse - mu, 0.0)
    T = o.num_tokens or act.sum()
    if seq is not None:
        ids = np.unique(seq[act])
        S = o.num_seqs or len(ids)
        Tj = np.array([np.sum(act & (seq == seq[i])) for i in range(N)])
    lo, hi = 1 - o.clip_low, 1 + o.clip_high
    delta = logp - old
    if o.policy_loss == "gspo":
        rho = np.array([delta[act & (seq == seq[i])].mean() if act[i] else 0 for i in range(N)])
        r = np.exp(np.minimum(rho, 10))
        dr = np.where(rho > 10, 0.0, r)
    else:
        r = np.exp(np.clip(delta, -20, 20))
        dr = np.where((delta < -20) | (delta > 20), 0.0, r)
    cr = np.clip(r, lo, hi)
    dcr = np.where((r < lo) | (r > hi), 0.0, dr)
    pg1, pg2 = -A * r, -A * cr
    clip = pg2 > pg1
    lower = np.zeros(N, bool)
    if o.policy_loss == "cispo":
        pg, dpg = -A * cr * logp, -A * cr
    else:
        pg = np.maximum(pg1, pg2)
        dpg = np.where(pg1 > pg2, -A * dr, np.where(pg2 > pg1, -A * dcr, -0.5 * A * (dr + dcr)))
        if o.clip_ratio_c is not None:
            pg3 = -A * o.clip_ratio_c
            lower = (A < 0) & (pg > pg3)
            dpg = np.where(lower, 0.0, dpg)
            pg = np.where(lower, pg3, pg)
    kl = dkl = np.zeros(N)
    if o.kl != "none":
        x = ref - logp
        if o.kl == "k1":
            kl, dkl = -x, np.ones(N)
        elif o.kl == "k2":
            kl, dkl = x * x / 2, -x
        else:
            xh = np.clip(x, -20, 20)
            v = np.exp(xh) - xh - 1
            kl = np.clip(v, -10, 10)
            dkl = np.where((x < -20) | (x > 20) | (v > 10), 0.0, -(np.exp(xh) - 1))
    c = {"token-mean": lambda: np.full(N, 1.0 / T),
         "seq-mean-token-sum": lambda: np.full(N, 1.0 / S),
         "seq-mean-token-mean": lambda: 1.0 / (S * np.maximum(Tj, 1)),
         "seq-mean-token-sum-norm": lambda: np.full(N, 1.0 / (S * o.norm_length))}[o.agg]()
    c = np.where(act, c, 0.0)
    beta = o.kl_coef if o.kl != "none" else 0.0
    met = {"loss": np.sum(c * (isw * pg + beta * kl - o.entropy_coef * ent)),
           "pg_loss": np.sum(c * isw * pg), "kl_loss": np.sum(c * kl),
           "entropy_loss": np.sum(c * ent),
           "pg_clipfrac": np.sum(clip & act) / T, "pg_clipfrac_lower": np.sum(lower & act) / T,
           "ppo_kl": np.sum(np.where(act, -delta, 0)) / T}
    g = np.where(act, c * (isw * dpg + beta * dkl), 0.0)
    e = np.where(act, -c * o.entropy_coef, 0.0)
    onehot = np.zeros_like(z)
    onehot[np.arange(N), np.clip(t, 0, V - 1)] = 1.0
    dz = g[:, None] * (onehot - p) + e[:, None] * p * (mu[:, None] - z)
    dz[~act] = 0
    du = dz * dzdu
    return met, logp, ent, du @ w, du.T @ h


def rel(got, want):
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)) if want.size else 0.0


def check(inp, out, o):
    met, logp, ent, dh, dw = oracle(inp, o)
    with open(f"{out}/loss.json") as f:
        js = json.load(f)
    bad = []
    if tuple(js) != METRICS:
        bad.append(f"loss.json keys {tuple(js)}, expected {METRICS}")
    for k in METRICS:
        if not abs(js.get(k, np.nan) - met[k]) <= o.tol * (abs(met[k]) + 0.05):
            bad.append(f"{k}: {js.get(k)} vs {met[k]}")
    for name, want in (("logprob", logp), ("entropy", ent), ("dhidden", dh), ("dweight", dw)):
        got = np.load(f"{out}/{name}.npy")
        if got.shape != want.shape or got.dtype != np.float32:
            bad.append(f"{name}.npy: {got.dtype} {got.shape}, expected float32 {want.shape}")
            continue
        e = rel(got.astype(np.float64), want)
        if not e <= o.tol:
            bad.append(f"{name}: relative error {e:.2e} > {o.tol:g}")
    for b in bad:
        print("FAIL", b)
    print(f"policy_oracle: {'FAIL' if bad else 'PASS'} ({out})")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=("gen", "check"))
    ap.add_argument("a")
    ap.add_argument("b", nargs="?")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--policy-loss", default="ppo")
    ap.add_argument("--clip-low", type=float, default=0.2)
    ap.add_argument("--clip-high", type=float, default=0.2)
    ap.add_argument("--clip-ratio-c", type=float, default=None)
    ap.add_argument("--kl", default="none")
    ap.add_argument("--kl-coef", type=float, default=0.0)
    ap.add_argument("--entropy-coef", type=float, default=0.0)
    ap.add_argument("--agg", default="token-mean")
    ap.add_argument("--norm-length", type=float, default=None)
    ap.add_argument("--num-tokens", type=int, default=None)
    ap.add_argument("--num-seqs", type=int, default=None)
    ap.add_argument("--gap", type=int, default=0)  # span coalescing: changes no result
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--softcap", type=float, default=0.0)
    ap.add_argument("--tol", type=float, default=1e-4)
    o = ap.parse_args()
    if o.cmd == "gen":
        gen(o.a, int(o.b or 1), o.bf16)
        return 0
    return check(o.a, o.b, o)


if __name__ == "__main__":
    sys.exit(main())
