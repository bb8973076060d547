"""The LM head in float64 NumPy, written from the formulas of docs/design.md section 2 and
spanhead.h:

    u = h w^T ; z = (c tanh(u / c) if c > 0 else u) / T
    lse = log sum exp z ; p = exp(z - lse) ; logprob = z[t] - lse ; mu = sum p z
    entropy = lse - mu ; logit_mean = mean z
    dz = g (onehot(t) - p) + e p (mu - z) + gl p + gm / V
    du = dz / T * (1 - tanh^2(u / c) if c > 0 else 1) ; dh = du w ; dw = du^T h
Sample support: the softmax, logprob, entropy and lse run over each row's candidate ids only.
Inactive rows: zero outputs and zero gradient. Ignored targets (< 0): logprob 0, g ignored.
"""

import numpy as np


def head_ref(h, w, t=None, *, cand=None, temperature=1.0, softcap=0.0, active=None,
             g=None, e=None, gl=None, gm=None):
    h = np.asarray(h, np.float64)
    w = np.asarray(w, np.float64)
    N, V = h.shape[0], w.shape[0]
    u = h @ w.T
    if softcap > 0:
        th = np.tanh(u / softcap)
        z = softcap * th / temperature
        dudz = (1.0 - th * th) / temperature
    else:
        z = u / temperature
        dudz = np.full_like(u, 1.0 / temperature)
    act = np.ones(N, bool) if active is None else np.asarray(active, bool)
    # support: (N, V) boolean, full vocabulary unless candidates are given
    if cand is None:
        sup = np.ones((N, V), bool)
    else:
        sup = np.zeros((N, V), bool)
        for i in range(N):
            ids = cand[i][cand[i] >= 0]
            sup[i, ids] = True
    zm = np.where(sup, z, -np.inf)
    m = zm.max(axis=1)
    ex = np.where(sup, np.exp(zm - m[:, None]), 0.0)
    s = ex.sum(axis=1)
    lse = m + np.log(s)
    p = ex / s[:, None]
    mu = (p * np.where(sup, z, 0.0)).sum(axis=1)
    ent = lse - mu
    mean = z.mean(axis=1)
    lp = np.zeros(N)
    valid = np.zeros(N, bool)
    if t is not None:
        t = np.asarray(t, np.int64)
        valid = t >= 0
        idx = np.where(valid, t, 0)
        lp = np.where(valid, z[np.arange(N), idx] - lse, 0.0)
    out = {"logprob": lp, "entropy": ent, "lse": lse, "logit_mean": mean,
           "stats": np.stack([m, lse, mu], axis=1)}
    for k in ("logprob", "entropy", "lse", "logit_mean"):
        out[k] = np.where(act, out[k], 0.0)
    dz = np.zeros((N, V))
    z0 = np.where(sup, z, 0.0)
    if g is not None and t is not None:
        gv = np.where(valid, np.asarray(g, np.float64), 0.0)
        onehot = np.zeros((N, V))
        onehot[np.arange(N)[valid], t[valid]] = 1.0
        dz += gv[:, None] * (onehot - p)
    if e is not None:
        dz += np.asarray(e, np.float64)[:, None] * p * (mu[:, None] - z0)
    if gl is not None:
        dz += np.asarray(gl, np.float64)[:, None] * p
    if gm is not None:
        dz += np.asarray(gm, np.float64)[:, None] / V
    dz = np.where(sup, dz, 0.0)
    dz[~act] = 0.0
    du = dz * dudz
    out["du"] = du  # dlogits (N, V), for the error bound of half-precision gradient products
    out["dhidden"] = du @ w
    out["dweight"] = du.T @ h
    return out


def gemm_bound(du, a, u):
    """Elementwise error bound of a gradient product whose operand du was rounded to a half
    format of unit roundoff u (2**-8 bf16, 2**-11 f16) and whose result is rounded once more:
    u * (|du| @ |a|), the product's own error; callers add u * |result| for the output."""
    return u * (np.abs(du) @ np.abs(np.asarray(a, np.float64)))


def close(name, got, ref, atol, rtol=None):
    """|got - ref| <= atol + rtol |ref| elementwise, NaN fails; a readable failure message."""
    rtol = atol if rtol is None else rtol
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    assert got.shape == ref.shape, f"{name}: shape {got.shape} != {ref.shape}"
    err = np.abs(got - ref)
    bad = ~(err <= atol + rtol * np.abs(ref))
    if bad.any():
        k = np.unravel_index(np.argmax(np.where(np.isnan(err), np.inf, err)), err.shape)
        raise AssertionError(f"{name}: {bad.sum()} of {bad.size} entries off; worst at {k}: got "
                             f"{got[k]!r}, ref {ref[k]!r} (atol {atol}, rtol {rtol})")
