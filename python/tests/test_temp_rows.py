"""Per-row temperature (issue 25 item 1): ``temperature=`` takes a number or one temperature per
row, in the NumPy API (spanhead.head_forward / head_backward / policy_loss) and in
spanhead.torch (logprobs and its backward, weighted_logprob_loss, linear_cross_entropy,
policy_loss), against the float64 NumPy reference (reference.py, T broadcast per row) and
PyTorch's own dense computation; the bad inputs (T_i <= 0, NaN, inf, wrong shape / dtype)."""

import numpy as np
import pytest

import spanhead
from reference import head_ref

TOL = 2e-5


def case(rng, N=29, H=16, V=71, K=0):
    h = rng.standard_normal((N, H)).astype(np.float32)
    w = (rng.standard_normal((V, H)) * 2.0 / H ** 0.5).astype(np.float32)
    t = rng.integers(0, V, N).astype(np.int64)
    t[::7] = -100
    T = np.exp(rng.uniform(np.log(0.25), np.log(4.0), N)).astype(np.float32)
    T[0], T[1] = 0.25, 4.0
    mask = (rng.random(N) < 0.7).astype(np.uint8)
    cand = None
    if K:
        cand = np.full((N, K), -1, np.int64)
        for i in range(N):
            ids = rng.choice(V, K - 1, replace=False)
            if t[i] >= 0 and t[i] not in ids:
                ids[0] = t[i]
            cand[i, :K - 1] = ids
    return h, w, t, T, mask, cand


def close(name, got, ref, tol=TOL):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    err = np.max(np.abs(got - ref)) / (np.max(np.abs(ref)) + 0.5)
    assert err <= tol, f"{name}: normwise error {err:.2e} > {tol:.0e}"


# ---- NumPy API --------------------------------------------------------------------------------

@pytest.mark.parametrize("K", [0, 6])
@pytest.mark.parametrize("softcap", [0.0, 2.5])
def test_numpy_forward_backward(rng, kernel, K, softcap):
    h, w, t, T, mask, cand = case(rng, K=K)
    N = h.shape[0]
    g = rng.standard_normal(N).astype(np.float32)
    e = (0.3 * rng.standard_normal(N)).astype(np.float32)
    ref = head_ref(h, w, t, cand=cand, temperature=T.astype(np.float64)[:, None],
                   softcap=softcap, active=mask, g=g, e=e)
    ctx = spanhead.Context("cpu", **kernel)
    f = spanhead.head_forward(h, w, t, candidates=cand, temperature=T, softcap=softcap,
                              active_mask=mask, entropy=True, lse=True, context=ctx)
    for k in ("logprob", "entropy", "lse"):
        close(k, f[k], ref[k])
    b = spanhead.head_backward(h, w, t, stats=f.stats, dlogprob=g, dentropy=e, candidates=cand,
                               temperature=T, softcap=softcap, active_mask=mask, context=ctx)
    close("dhidden", b.dhidden, ref["dhidden"])
    close("dweight", b.dweight, ref["dweight"])
    # one-pass: the same gradients from the forward
    o = spanhead.head_forward(h, w, t, candidates=cand, temperature=T, softcap=softcap,
                              active_mask=mask, dlogprob=g, dentropy=e, dhidden=True,
                              dweight=True, context=ctx)
    close("one-pass dhidden", o.dhidden, ref["dhidden"])
    # the per-row values are used: the scalar 1 gives other results
    s = spanhead.head_forward(h, w, t, candidates=cand, softcap=softcap, active_mask=mask,
                              lse=True, context=ctx)
    assert np.max(np.abs(s.lse - f.lse)) > 1e-3


@pytest.mark.parametrize("bad,needle", [(0.0, "temperature_rows\\[3\\]: 0"),
                                        (-1.5, "temperature_rows\\[3\\]: -1.5"),
                                        (np.nan, "temperature_rows\\[3\\]: nan"),
                                        (np.inf, "temperature_rows\\[3\\]: inf")])
def test_numpy_bad_values(rng, bad, needle):
    h, w, t, T, _, _ = case(rng)
    T[3] = bad
    lp = np.full(h.shape[0], 7.0, np.float32)
    with pytest.raises(spanhead.InvalidArgumentError, match=needle):
        spanhead.head_forward(h, w, t, temperature=T, logprob=lp)
    assert np.all(lp == 7.0)  # nothing written


def test_numpy_bad_shape_dtype(rng):
    h, w, t, T, _, _ = case(rng)
    with pytest.raises(spanhead.DTypeError, match="temperature_rows"):
        spanhead.head_forward(h, w, t, temperature=T.astype(np.float64))
    with pytest.raises(spanhead.ShapeError, match="temperature_rows"):
        spanhead.head_forward(h, w, t, temperature=T[:-1])
    with pytest.raises(spanhead.ShapeError, match="temperature_rows"):
        spanhead.head_forward(h, w, t, temperature=np.stack([T, T], 1))


def test_numpy_policy_loss(rng):
    h, w, t, T, mask, _ = case(rng)
    N = h.shape[0]
    adv = rng.standard_normal(N).astype(np.float32)
    old = (-4.0 + 0.3 * rng.standard_normal(N)).astype(np.float32)
    r = spanhead.policy_loss(h, w, t, adv, old, loss_mask=mask, temperature=T)
    ref = head_ref(h, w, t, temperature=T.astype(np.float64)[:, None], active=mask)
    close("policy logprob", r.logprob, ref["logprob"])
    # the gradient: du = dz / T_i, through the policy's dlogprob of each row
    act = (mask != 0) & (t >= 0)
    ratio = np.exp(ref["logprob"] - old)
    clipped = np.clip(ratio, 0.8, 1.2)
    use = (-adv * ratio) >= (-adv * clipped)
    dlp = np.where(act & use, -adv * ratio, 0.0) / act.sum()
    g = head_ref(h, w, t, temperature=T.astype(np.float64)[:, None], active=mask, g=dlp)
    close("policy dhidden", r.dhidden, g["dhidden"])


# ---- torch -------------------------------------------------------------------------------------

def dense(torch, h, w, t, T, mask, softcap=0.0):
    u = h.double() @ w.double().T
    z = (softcap * torch.tanh(u / softcap) if softcap else u) / T.double().reshape(-1, 1)
    logp = torch.log_softmax(z, -1)
    valid = t >= 0
    lp = logp.gather(-1, t.clamp(min=0).unsqueeze(-1)).squeeze(-1) * valid * mask
    ent = -(logp.exp() * logp).sum(-1) * mask
    return lp, ent


@pytest.mark.parametrize("softcap", [0.0, 3.0])
def test_torch_logprobs_and_backward(rng, kernel, softcap):
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    h, w, t, T, mask, _ = case(rng)
    H = h.shape[1]
    hh = torch.from_numpy(h).reshape(1, -1, H).requires_grad_(True)  # leading dims (1, N)
    ww = torch.from_numpy(w).requires_grad_(True)
    tt, TT = torch.from_numpy(t).reshape(1, -1), torch.from_numpy(T).reshape(1, -1)
    mm = torch.from_numpy(mask).bool().reshape(1, -1)
    out = sht.logprobs(hh, ww, tt, loss_mask=mm, temperature=TT, entropy=True, softcap=softcap,
                       **kernel)
    g = torch.randn(out.logprob.shape, generator=torch.Generator().manual_seed(3))
    ((out.logprob * g).sum() + 0.3 * out.entropy.sum()).backward()
    hd = torch.from_numpy(h).double().requires_grad_(True)
    wd = torch.from_numpy(w).double().requires_grad_(True)
    lp, ent = dense(torch, hd, wd, tt[0], TT[0], mm[0].double(), softcap)
    ((lp * g[0].double()).sum() + 0.3 * ent.sum()).backward()
    close("logprob", out.logprob[0].detach(), lp.detach())
    close("entropy", out.entropy[0].detach(), ent.detach())
    close("dhidden", hh.grad[0], hd.grad)
    close("dweight", ww.grad, wd.grad)
    # float64 / bfloat16 temperatures are converted; the result is the float32 one
    out64 = sht.logprobs(hh, ww, tt, loss_mask=mm, temperature=TT.double(), softcap=softcap,
                         **kernel)
    assert torch.equal(out64, out.logprob)


def test_torch_one_pass_losses(rng, kernel):
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    h, w, t, T, mask, _ = case(rng)
    hh, ww = torch.from_numpy(h).requires_grad_(True), torch.from_numpy(w).requires_grad_(True)
    tt, TT = torch.from_numpy(t), torch.from_numpy(T)
    loss = sht.linear_cross_entropy(hh, ww, tt, temperature=TT, **kernel)
    loss.backward()
    hd = torch.from_numpy(h).double().requires_grad_(True)
    wd = torch.from_numpy(w).double().requires_grad_(True)
    z = (hd @ wd.T) / TT.double()[:, None]
    ref = torch.nn.functional.cross_entropy(z, tt, ignore_index=-100)
    ref.backward()
    assert abs(loss.item() - ref.item()) <= 1e-5 * max(1.0, abs(ref.item()))
    close("dhidden", hh.grad, hd.grad)
    close("dweight", ww.grad, wd.grad)
    # the per-row "none" reduction goes through logprobs
    per = sht.linear_cross_entropy(hh, ww, tt, temperature=TT, reduction="none", **kernel)
    refn = torch.nn.functional.cross_entropy(z, tt, ignore_index=-100, reduction="none")
    close("per-row loss", per.detach(), refn.detach())


def test_torch_policy_loss(rng, kernel):
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    h, w, t, T, mask, _ = case(rng)
    N = h.shape[0]
    adv = torch.from_numpy(rng.standard_normal(N).astype(np.float32))
    old = torch.from_numpy((-4.0 + 0.3 * rng.standard_normal(N)).astype(np.float32))
    hh, ww = torch.from_numpy(h).requires_grad_(True), torch.from_numpy(w).requires_grad_(True)
    tt, TT, mm = torch.from_numpy(t), torch.from_numpy(T), torch.from_numpy(mask).bool()
    out = sht.policy_loss(hh, ww, tt, adv, old, loss_mask=mm, temperature=TT, **kernel)
    out.loss.backward()
    # the same loss on top of the differentiable per-row-temperature log-probs
    h2, w2 = torch.from_numpy(h).requires_grad_(True), torch.from_numpy(w).requires_grad_(True)
    lp = sht.logprobs(h2, w2, tt, loss_mask=mm, temperature=TT, **kernel)
    act = (mm & (tt >= 0)).float()
    ratio = torch.exp(torch.clamp(lp - old, -20, 20))
    pg = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2))
    ref = (pg * act).sum() / act.sum()
    ref.backward()
    assert abs(out.loss.item() - ref.item()) <= 1e-5 * max(1.0, abs(ref.item()))
    close("logprob", out.logprob, lp.detach())
    close("dhidden", hh.grad, h2.grad)
    close("dweight", ww.grad, w2.grad)


def test_torch_bad_input(rng):
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    h, w, t, T, _, _ = case(rng)
    hh, ww, tt = torch.from_numpy(h), torch.from_numpy(w), torch.from_numpy(t)
    TT = torch.from_numpy(T)
    with pytest.raises(spanhead.ShapeError, match="temperature"):
        sht.logprobs(hh, ww, tt, temperature=TT[:-1])
    with pytest.raises(spanhead.DTypeError, match="temperature"):
        sht.logprobs(hh, ww, tt, temperature=torch.ones(len(t), dtype=torch.int64))
    bad = TT.clone()
    bad[5] = 0.0
    with pytest.raises(spanhead.InvalidArgumentError, match="temperature_rows\\[5\\]: 0"):
        sht.logprobs(hh, ww, tt, temperature=bad)
    bad[5] = float("nan")
    with pytest.raises(spanhead.InvalidArgumentError, match="temperature_rows\\[5\\]: nan"):
        sht.linear_cross_entropy(hh, ww, tt, temperature=bad)


def test_torch_compile_per_row(rng):
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    h, w, t, T, mask, _ = case(rng)
    hh, ww = torch.from_numpy(h), torch.from_numpy(w)
    tt, TT = torch.from_numpy(t), torch.from_numpy(T)

    def f(h_, w_, t_, T_):
        return sht.logprobs(h_, w_, t_, temperature=T_)

    eager = f(hh, ww, tt, TT)
    compiled = torch.compile(f, fullgraph=True, backend="eager")(hh, ww, tt, TT)
    assert torch.equal(eager, compiled)
