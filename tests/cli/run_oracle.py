#!/usr/bin/env python3
"""`spanhead run --inputs DIR --outputs DIR` against a dense NumPy float64 oracle, for every
input file and option the runner forwards (issue 28): `--check` recomputes through the same
argument plumbing it checks, so this oracle reads the input files itself.

    gen DIR SEED [--candidates K] [--no-mask] [--no-ups] [--temperature-rows]   random
        inputs: hidden, weight, targets (some ignored), mask, dlogprob, dentropy, dlse,
        dlogit_mean (each of a different scale), candidates (K per row, the target among
        them, -1 padding), temperature (per-row, log-uniform in [0.2, 5])
    check IN OUT [--temperature T] [--softcap C]           reads IN's files (what is there),
        OUT's outputs, exit 0 when all are within --tol (normwise), 1 otherwise

The oracle: u = h w^T, z = (c tanh(u / c) if c else u) / T (T_i of temperature.npy when
present: one temperature per row); p the softmax over each row's
support (every id, or its candidates); logprob = log p[t] (0 for t < 0), entropy =
-sum p log p, lse = log sum exp z, logit_mean = mean of z over the vocabulary; the gradient of
sum_i g_i logprob_i + e_i entropy_i + gl_i lse_i + gm_i logit_mean_i by
dz = g (onehot - p) + e p (-log p - entropy) + gl p + gm / V, du = dz dz/du, inactive rows 0.
"""

import argparse
import os
import sys

import numpy as np

UPS = ("dlogprob", "dentropy", "dlse", "dlogit_mean")
OUTS = ("logprob", "entropy", "lse", "logit_mean", "dhidden", "dweight")


def gen(d, seed, K=0, mask=True, ups=True, trows=False, N=53, H=19, V=131):
    rng = np.random.default_rng(seed)
    os.makedirs(d, exist_ok=True)
    h = rng.standard_normal((N, H)).astype(np.float32)
    w = (rng.standard_normal((V, H)) * 1.5 / H ** 0.5).astype(np.float32)
    t = rng.integers(0, V, N).astype(np.int64)
    t[rng.random(N) < 0.1] = -100
    files = dict(hidden=h, weight=w, targets=t)
    if mask:
        files["mask"] = (rng.random(N) < 0.7).astype(np.uint8)
    if ups:
        for k, s in zip(UPS, (1.0, 0.3, 0.1, 2.0)):
            if not (K and k == "dlogit_mean"):  # not defined with a sample support
                files[k] = (s * rng.standard_normal(N)).astype(np.float32)
    if K:
        cand = np.full((N, K), -1, np.int64)
        for i in range(N):
            k = int(rng.integers(2, K + 1))
            ids = rng.choice(V, k, replace=False)
            if t[i] >= 0 and t[i] not in ids:
                ids[0] = t[i]
            cand[i, :k] = rng.permutation(ids)
        files["candidates"] = cand
    if trows:
        files["temperature"] = np.exp(rng.uniform(np.log(0.2), np.log(5.0), N)).astype(np.float32)
    for k, v in files.items():
        np.save(os.path.join(d, k + ".npy"), v)


def load(d, name):
    p = os.path.join(d, name + ".npy")
    return np.load(p) if os.path.exists(p) else None


def oracle(d, T, c):
    h = load(d, "hidden").astype(np.float64)
    w = load(d, "weight").astype(np.float64)
    t = load(d, "targets").astype(np.int64)
    N, V = h.shape[0], w.shape[0]
    m = load(d, "mask")
    act = np.ones(N, bool) if m is None else m.astype(bool)
    u = h @ w.T
    tr = load(d, "temperature")
    if tr is not None:  # per-row: broadcast over the vocabulary
        T = tr.astype(np.float64)[:, None]
    if c:
        th = np.tanh(u / c)
        z, dzdu = c * th / T, (1.0 - th * th) / T
    else:
        z, dzdu = u / T, np.ones_like(u) / T
    cand = load(d, "candidates")
    sup = np.ones((N, V), bool)
    if cand is not None:
        sup[:] = False
        for i in range(N):
            sup[i, cand[i][cand[i] >= 0]] = True
    zs = np.where(sup, z, -np.inf)
    mx = zs.max(1, keepdims=True)
    lse = (mx + np.log(np.exp(zs - mx).sum(1, keepdims=True)))[:, 0]
    logp_all = np.where(sup, z - lse[:, None], 0.0)
    p = np.where(sup, np.exp(logp_all), 0.0)
    ent = -(p * logp_all).sum(1)
    valid = t >= 0
    ti = np.where(valid, t, 0)
    lp = np.where(valid, logp_all[np.arange(N), ti], 0.0)
    out = dict(logprob=lp, entropy=ent, lse=lse, logit_mean=z.mean(1))
    for k in out:
        out[k] = np.where(act, out[k], 0.0)
    if cand is not None:
        del out["logit_mean"]  # not defined with a sample support
    ups = {k: load(d, k) for k in UPS}
    if any(v is not None for v in ups.values()):
        dz = np.zeros((N, V))
        if ups["dlogprob"] is not None:
            g = np.where(valid, ups["dlogprob"].astype(np.float64), 0.0)
            onehot = np.zeros((N, V))
            onehot[np.arange(N)[valid], t[valid]] = 1.0
            dz += g[:, None] * (onehot - p)
        if ups["dentropy"] is not None:  # d(-sum p log p)/dz = p (-log p - H)
            dz += ups["dentropy"].astype(np.float64)[:, None] * p * (-logp_all - ent[:, None])
        if ups["dlse"] is not None:
            dz += ups["dlse"].astype(np.float64)[:, None] * p
        if ups["dlogit_mean"] is not None:
            dz += ups["dlogit_mean"].astype(np.float64)[:, None] / V
        dz = np.where(sup, dz, 0.0)  # (dlogit_mean is refused with a sample support)
        dz[~act] = 0.0
        du = dz * dzdu
        out["dhidden"] = du @ w
        out["dweight"] = du.T @ h
    return out


def check(inp, outd, o):
    want = oracle(inp, o.temperature, o.softcap)
    # what must be there: logprob; entropy when its upstream is given; both gradients when
    # any upstream is; the rest is checked where written
    need = {"logprob"} | ({"entropy"} if load(inp, "dentropy") is not None else set())
    need |= {"dhidden", "dweight"} & set(want)
    bad = []
    for name in OUTS:
        path = os.path.join(outd, name + ".npy")
        if name not in want:
            continue
        if not os.path.exists(path):
            if name in need:
                bad.append(f"{name}.npy was not written")
            continue
        got = np.load(path)
        ref = want[name]
        if got.shape != ref.shape or got.dtype != np.float32:
            bad.append(f"{name}.npy: {got.dtype} {got.shape}, expected float32 {ref.shape}")
            continue
        err = float(np.max(np.abs(got - ref))) / (float(np.max(np.abs(ref))) + 0.5)
        print(f"  {name:<11} normwise error {err:.2e} (budget {o.tol:.0e})")
        if not err <= o.tol:
            bad.append(f"{name}: normwise error {err:.2e} > {o.tol:.0e}")
    for b in bad:
        print("FAIL", b)
    print(f"run_oracle: {'FAIL' if bad else 'PASS'} ({outd})")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=("gen", "check"))
    ap.add_argument("a")
    ap.add_argument("b", nargs="?")
    ap.add_argument("--candidates", type=int, default=0)
    ap.add_argument("--no-mask", action="store_true")
    ap.add_argument("--no-ups", action="store_true")
    ap.add_argument("--temperature-rows", action="store_true")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--softcap", type=float, default=0.0)
    # tests/tolerances.h TOL_CPU_F32: f32 arithmetic on exactly these inputs
    ap.add_argument("--tol", type=float, default=2e-5)
    o = ap.parse_args()
    if o.cmd == "gen":
        gen(o.a, int(o.b or 1), o.candidates, not o.no_mask, not o.no_ups, o.temperature_rows)
        return 0
    return check(o.a, o.b, o)


if __name__ == "__main__":
    sys.exit(main())
