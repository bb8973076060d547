"""spanhead.policy_loss (NumPy) and spanhead.torch.policy_loss (CPU) against the same loss
written in PyTorch the way verl writes it (compute_policy_loss / kl_penalty / agg_loss) on top
of spanhead.torch.logprobs, values, metrics and gradients, for every loss x KL x aggregation;
errors; the NumPy entry point against the reference and optimized kernels. The torch parts skip
without torch; the CUDA half is test_policy_cuda.py."""

import math

import numpy as np
import pytest

import spanhead

AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LOSSES = ("ppo", "cispo", "gspo")
KLS = ("none", "k1", "k2", "k3")


def case(rng, N=37, H=16, V=53, frac=0.7):
    h = rng.standard_normal((N, H)).astype(np.float32)
    w = (rng.standard_normal((V, H)) * 2.0 / H ** 0.5).astype(np.float32)
    t = rng.integers(0, V, N).astype(np.int64)
    t[::7] = -100
    mask = (rng.random(N) < frac).astype(np.uint8)
    seq = np.repeat(np.arange(N), rng.integers(1, 5, N))[:N].astype(np.int64)
    adv = rng.standard_normal(N).astype(np.float32)
    old = (-4.0 + 0.6 * rng.standard_normal(N)).astype(np.float32)
    ref = (-4.0 + 0.6 * rng.standard_normal(N)).astype(np.float32)
    isw = (0.5 + rng.random(N)).astype(np.float32)
    return h, w, t, mask, seq, adv, old, ref, isw


# ---- the NumPy entry point ----------------------------------------------------------------

def test_numpy_ref_vs_default(rng):
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    out = {}
    for kernel in ("ref", None):
        ctx = spanhead.Context("cpu", kernel=kernel)
        out[kernel] = spanhead.policy_loss(
            h, w, t, adv, old, loss_mask=mask, loss_type="ppo", clip_low=0.2, clip_high=0.28,
            clip_ratio_c=3.0, ref_logprobs=ref, kl_type="k3", kl_coef=0.05, entropy_coef=0.01,
            agg="seq-mean-token-mean", seq_ids=seq, is_weights=isw, context=ctx)
        ctx.close()
    a, b = out["ref"], out[None]
    for k in spanhead.policy.METRICS:
        assert a.metrics[k] == pytest.approx(b.metrics[k], rel=2e-5, abs=1e-6), k
    np.testing.assert_allclose(a.dhidden, b.dhidden, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(a.dweight, b.dweight, rtol=2e-5, atol=1e-6)
    assert a.loss == a.metrics["loss"]
    act = (mask == 1) & (t >= 0)
    assert a.metrics["tokens"] == act.sum()
    assert np.all(a.logprob[~act] == 0) and np.all(a.dhidden[~act] == 0)


def test_numpy_loss_only_and_conversions(rng):
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    full = spanhead.policy_loss(h, w, t, adv, old, loss_mask=mask)
    # float64 inputs are converted; no gradient outputs: the same loss and metrics
    only = spanhead.policy_loss(h, w, t, adv.astype(np.float64), old.astype(np.float64),
                                loss_mask=mask, dhidden=False, dweight=False)
    assert only.dhidden is None and only.dweight is None
    assert only.metrics == full.metrics


@pytest.mark.parametrize("kw,exc,needle", [
    (dict(kl_type="k1"), spanhead.InvalidArgumentError, "ref_logprob"),
    (dict(agg="seq-mean-token-mean"), spanhead.InvalidArgumentError, "seq_id"),
    (dict(loss_type="gspo"), spanhead.InvalidArgumentError, "seq_id"),
    (dict(loss_type="ppo2"), spanhead.InvalidArgumentError, "loss_type"),
    (dict(kl_type="k4"), spanhead.InvalidArgumentError, "kl_type"),
    (dict(agg="mean"), spanhead.InvalidArgumentError, "agg"),
    (dict(clip_ratio_c=1.0), spanhead.InvalidArgumentError, "clip_ratio_c: 1"),
    (dict(clip_low=1.5), spanhead.InvalidArgumentError, "clip_low: 1.5"),
    (dict(kl_coef=-1.0, kl_type="k2"), spanhead.InvalidArgumentError, "kl_coef: -1"),
    (dict(entropy_coef=math.nan), spanhead.InvalidArgumentError, "entropy_coef: nan"),
    (dict(num_tokens=0), spanhead.InvalidArgumentError, "num_tokens"),
    (dict(norm_length=0.0), spanhead.InvalidArgumentError, "norm_length"),
    (dict(agg="seq-mean-token-sum-norm", seq_ids="seq"), spanhead.InvalidArgumentError,
     "norm_length"),
])
def test_numpy_errors(rng, kw, exc, needle):
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    if kw.get("seq_ids") == "seq":
        kw["seq_ids"] = seq
    lp = np.full(len(t), 7.0, np.float32)
    with pytest.raises(exc, match=needle):
        spanhead.policy_loss(h, w, t, adv, old, loss_mask=mask, logprob=lp, **kw)
    assert np.all(lp == 7.0)  # nothing written


def test_numpy_nan_advantage_on_active_row(rng):
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    i = int(np.flatnonzero((mask == 1) & (t >= 0))[0])
    adv[i] = np.nan
    with pytest.raises(spanhead.InvalidArgumentError, match=f"advantages\\[{i}\\]: nan"):
        spanhead.policy_loss(h, w, t, adv, old, loss_mask=mask)


# ---- the torch formulation ----------------------------------------------------------------

def torch_formulation(torch, logp, ent, adv, old, act, *, loss_type, clip_low, clip_high,
                      clip_ratio_c, ref, kl_type, kl_coef, entropy_coef, agg, seq, num_tokens,
                      num_seqs, norm_length, isw):
    """verl's compute_policy_loss_{vanilla,cispo,gspo} + kl_penalty + agg_loss, flattened to
    (N,) rows with an active mask (act: float 0/1)."""
    neg_kl = logp - old
    m = act
    T = float(num_tokens) if num_tokens else m.sum()
    if seq is not None:
        uniq, inv = torch.unique(seq, return_inverse=True)
        cnt = torch.zeros(len(uniq), dtype=m.dtype, device=m.device).index_add_(0, inv, m)
        S = float(num_seqs) if num_seqs else (cnt > 0).sum().to(m.dtype)
        Tj = cnt[inv]
    if loss_type == "gspo":
        sums = torch.zeros(len(uniq), dtype=m.dtype, device=m.device).index_add_(0, inv, (neg_kl * m).detach())
        rho = (sums / cnt.clamp(min=1))[inv]
        log_r = logp - logp.detach() + rho
        ratio = torch.exp(torch.clamp(log_r, max=10.0))
    else:
        ratio = torch.exp(torch.clamp(neg_kl, min=-20.0, max=20.0))
    pg1 = -adv * ratio
    cr = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    pg2 = -adv * cr
    clipfrac = (torch.gt(pg2, pg1).to(m.dtype) * m).sum() / T
    lower = torch.zeros((), dtype=m.dtype, device=m.device)
    if loss_type == "cispo":
        pg = -adv * cr.detach() * logp
    else:
        clip1 = torch.maximum(pg1, pg2)
        pg = clip1
        if clip_ratio_c is not None:
            pg3 = -adv * clip_ratio_c
            clip2 = torch.min(pg3, clip1)
            pg = torch.where(adv < 0, clip2, clip1)
            lower = (torch.gt(clip1, pg3).to(m.dtype) * (adv < 0).to(m.dtype) * m).sum() / T
    kl = torch.zeros_like(logp)
    if kl_type != "none":
        x = ref - logp
        if kl_type == "k1":
            kl = -x
        elif kl_type == "k2":
            kl = 0.5 * x.square()
        else:
            xc = torch.clamp(x, min=-20, max=20)
            kl = torch.clamp(torch.exp(xc) - xc - 1, min=-10, max=10)
    if agg == "token-mean":
        c = m / T
    elif agg == "seq-mean-token-sum":
        c = m / S
    elif agg == "seq-mean-token-mean":
        c = m / (S * Tj.clamp(min=1))
    else:
        c = m / (S * norm_length)
    w = isw if isw is not None else torch.ones_like(logp)
    beta = kl_coef if kl_type != "none" else 0.0
    loss = (c * (w * pg + beta * kl - entropy_coef * ent)).sum()
    metrics = {"loss": loss, "pg_loss": (c * w * pg).sum(), "kl_loss": (c * kl).sum(),
               "entropy_loss": (c * ent).sum(), "pg_clipfrac": clipfrac,
               "pg_clipfrac_lower": lower, "ppo_kl": (-neg_kl * m).sum() / T}
    return loss, metrics


def run_both(torch, sht, data, kernel, **kw):
    """(fused outputs, fused grads, formulation loss/metrics, formulation grads)."""
    h, w, t, mask, seq, adv, old, ref, isw = data
    T = torch.from_numpy
    hh, ww = T(h).requires_grad_(True), T(w).requires_grad_(True)
    tt, mm = T(t), T(mask).bool()
    args = dict(kw)
    args["ref_logprobs"] = T(ref) if kw.get("kl_type", "none") != "none" else None
    args["seq_ids"] = T(seq)
    args["is_weights"] = T(isw)
    out = sht.policy_loss(hh, ww, tt, T(adv), T(old), loss_mask=mm, **args, **kernel)
    g_out = 1.7
    (out.loss * g_out).backward()
    fused = (out, hh.grad.clone(), ww.grad.clone())
    h2, w2 = T(h).requires_grad_(True), T(w).requires_grad_(True)
    r = sht.logprobs(h2, w2, tt, loss_mask=mm, entropy=True, **kernel)
    act = ((T(mask) != 0) & (tt >= 0)).to(torch.float32)
    opts = dict(loss_type="ppo", clip_low=0.2, clip_high=0.2, clip_ratio_c=None, kl_type="none",
                kl_coef=0.0, entropy_coef=0.0, agg="token-mean", num_tokens=None,
                num_seqs=None, norm_length=None)
    opts.update({k: v for k, v in kw.items() if k in opts})
    loss, met = torch_formulation(torch, r.logprob, r.entropy, T(adv), T(old), act,
                                  ref=T(ref), seq=T(seq), isw=T(isw), **opts)
    (loss * g_out).backward()
    return fused, (loss, met), (h2.grad, w2.grad)


@pytest.mark.parametrize("loss_type", LOSSES)
@pytest.mark.parametrize("kl_type", KLS)
@pytest.mark.parametrize("agg", AGGS)
def test_torch_every_combination(rng, kernel, loss_type, kl_type, agg):
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    data = case(rng)
    kw = dict(loss_type=loss_type, clip_low=0.2, clip_high=0.28, kl_type=kl_type, kl_coef=0.07,
              entropy_coef=0.013, agg=agg, norm_length=11.0)
    if loss_type != "cispo":
        kw["clip_ratio_c"] = 3.0
    (out, gh, gw), (loss, met), (rh, rw) = run_both(torch, sht, data, kernel, **kw)
    assert out.loss.item() == pytest.approx(loss.item(), rel=1e-5, abs=1e-6)
    for k, v in met.items():
        assert out.metrics[k].item() == pytest.approx(v.item(), rel=1e-5, abs=1e-6), k
    scale = max(1.0, rh.abs().max().item())
    assert (gh - rh).abs().max().item() <= 2e-5 * scale
    scale = max(1.0, rw.abs().max().item())
    assert (gw - rw).abs().max().item() <= 2e-5 * scale


def test_torch_global_counts_and_shapes(rng, kernel):
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    data = case(rng, N=24)
    kw = dict(loss_type="ppo", agg="seq-mean-token-sum", num_tokens=500, num_seqs=40,
              kl_type="k2", kl_coef=0.1)
    (out, gh, gw), (loss, met), (rh, rw) = run_both(torch, sht, data, kernel, **kw)
    assert out.loss.item() == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(met["pg_clipfrac"].item(),
                                                              abs=1e-7)
    assert torch.allclose(gh, rh, rtol=2e-5, atol=1e-7)
    # leading dimensions: (B, S, H) hidden, (B, S) per-token tensors
    h, w, t, mask, seq, adv, old, ref, isw = data
    T = torch.from_numpy
    hh = T(h).reshape(4, 6, -1).requires_grad_(True)
    o = sht.policy_loss(hh, T(w), T(t).reshape(4, 6), T(adv).reshape(4, 6),
                        T(old).reshape(4, 6), loss_mask=T(mask).reshape(4, 6), **kernel)
    assert o.logprob.shape == (4, 6) and o.entropy.shape == (4, 6)
    o.loss.backward()
    assert hh.grad.shape == hh.shape


def test_torch_errors(rng):
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    T = torch.from_numpy
    with pytest.raises(spanhead.InvalidArgumentError, match="ref_logprob"):
        sht.policy_loss(T(h), T(w), T(t), T(adv), T(old), loss_mask=T(mask), kl_type="k3")
    with pytest.raises(spanhead.ShapeError, match="advantages"):
        sht.policy_loss(T(h), T(w), T(t), T(adv)[:-1], T(old), loss_mask=T(mask))
    with pytest.raises(spanhead.InvalidArgumentError, match="clip_ratio_c"):
        sht.policy_loss(T(h), T(w), T(t), T(adv), T(old), loss_mask=T(mask), clip_ratio_c=0.5)
    o = sht.policy_loss(T(h).requires_grad_(True), T(w), T(t), T(adv), T(old),
                        loss_mask=T(mask))
    o.loss.backward()
    with pytest.raises(RuntimeError):
        o.loss.backward()


def test_torch_compile(rng):
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    T = torch.from_numpy

    def step(hh, ww):
        o = sht.policy_loss(hh, ww, T(t), T(adv), T(old), loss_mask=T(mask).bool(),
                            loss_type="gspo", seq_ids=T(seq), agg="seq-mean-token-mean")
        return o.loss

    hh = T(h).requires_grad_(True)
    eager = step(hh, T(w))
    eager.backward()
    g_eager = hh.grad.clone()
    hh.grad = None
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    loss = compiled(hh, T(w))
    loss.backward()
    assert loss.item() == pytest.approx(eager.item(), rel=1e-6)
    assert torch.allclose(hh.grad, g_eager, rtol=1e-6, atol=1e-8)


# ---- issue 26: aliasing, coefficients beyond float, host masks, int64 bounds ----------------

@pytest.mark.parametrize("kernel", ["ref", None])
@pytest.mark.parametrize("out_name, in_name", [
    ("logprob", "advantages"), ("logprob", "old_logprobs"), ("entropy", "advantages"),
    ("logprob", "ref_logprobs"), ("entropy", "is_weights"), ("stats", "hidden"),
    ("dhidden", "hidden"), ("dweight", "weight"), ("logprob", "entropy"),
])
def test_numpy_aliasing_refused(rng, kernel, out_name, in_name):
    """An output of the loss on an input's (or another output's) bytes: refused naming both,
    the input and every output untouched (was: the advantages overwritten, a wrong loss)."""
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    inputs = {"hidden": h, "weight": w, "advantages": adv, "old_logprobs": old,
              "ref_logprobs": ref, "is_weights": isw}
    N = len(t)
    if out_name in ("logprob", "entropy"):
        base = inputs.get(in_name)
        if base is None:  # another output: its own buffer
            base = np.full(N, 3.0, np.float32)
        out = base[:N] if base.ndim == 1 else base.reshape(-1)[:N]
    elif out_name == "stats":
        out = h.reshape(-1)[:3 * N].reshape(N, 3)
    else:
        out = inputs[in_name]
    kw = {out_name: out}
    if in_name == "entropy":
        kw["entropy"] = np.full(N, 3.0, np.float32)
        kw["logprob"] = kw["entropy"]
    before = {k: v.copy() for k, v in inputs.items()}
    with pytest.raises(spanhead.InvalidArgumentError, match="overlap"):
        spanhead.policy_loss(h, w, t, adv, old, loss_mask=mask, ref_logprobs=ref,
                             kl_type="k3", is_weights=isw, stats=kw.pop("stats", False),
                             context=spanhead.Context("cpu", kernel=kernel), **kw)
    for k, v in inputs.items():
        assert np.array_equal(v, before[k], equal_nan=True), k


def test_numpy_aliasing_case_of_the_issue(rng):
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    a0 = adv.copy()
    with pytest.raises(spanhead.InvalidArgumentError, match="logprob.*overlap.*advantages"):
        spanhead.policy_loss(h, w, t, adv, old, logprob=adv)
    assert np.array_equal(adv, a0)
    # inputs may share memory: advantages as old_logprobs runs
    spanhead.policy_loss(h, w, t, adv, adv, loss_mask=mask)


COEF_CASES = [
    (dict(agg="seq-mean-token-sum-norm", norm_length=1e-320), "norm_length: 9.99989e-321"),
    (dict(agg="seq-mean-token-sum-norm", norm_length=1e38), "norm_length: 1e\\+38"),
    (dict(kl_type="k1", kl_coef=1e300), "kl_coef: 1e\\+300"),
    (dict(entropy_coef=1e39), "entropy_coef: 1e\\+39"),
    (dict(clip_high=1e39), "clip_high: 1e\\+39"),
    (dict(clip_ratio_c=1e39), "clip_ratio_c: 1e\\+39"),
    (dict(clip_low=1e-310), "clip_low: 1e-310"),
    (dict(agg="seq-mean-token-sum-norm", norm_length=1e-10, entropy_coef=1e30),
     "entropy gradient"),
]


@pytest.mark.parametrize("kw, needle", COEF_CASES)
def test_numpy_coefficients_beyond_float(rng, kw, needle):
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    lp = np.full(len(t), 7.0, np.float32)
    kw = dict(kw)
    with pytest.raises(spanhead.InvalidArgumentError, match=needle):
        spanhead.policy_loss(h, w, t, adv, old, loss_mask=mask, logprob=lp, seq_ids=seq,
                             ref_logprobs=ref, **kw)
    assert np.all(lp == 7.0)


@pytest.mark.parametrize("kw, needle", COEF_CASES)
def test_torch_coefficients_beyond_float(rng, kw, needle):
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    T = torch.from_numpy
    with pytest.raises(spanhead.InvalidArgumentError, match=needle):
        sht.policy_loss(T(h), T(w), T(t), T(adv), T(old), loss_mask=T(mask), seq_ids=T(seq),
                        ref_logprobs=T(ref), **kw)


@pytest.mark.parametrize("bad", [0.5, -1, 2, float("nan")])
def test_torch_host_mask_values(rng, bad):
    """A host loss_mask follows the rule NumPy and C follow (0 or 1), whatever its dtype:
    0.5, -1, 2 and NaN are refused naming the row (were: every such row active)."""
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    T = torch.from_numpy
    m = mask.astype(np.float32)
    m[4] = bad
    with pytest.raises(spanhead.InvalidArgumentError, match=r"loss_mask\[4\]"):
        sht.policy_loss(T(h), T(w), T(t), T(adv), T(old), loss_mask=T(m))
    with pytest.raises(spanhead.InvalidArgumentError, match=r"loss_mask\[4\]"):
        sht.logprobs(T(h), T(w), T(t), loss_mask=T(m))
    if bad == bad and float(bad).is_integer():  # an integer mask is checked the same way
        mi = mask.astype(np.int64)
        mi[4] = int(bad)
        with pytest.raises(spanhead.InvalidArgumentError, match=r"loss_mask\[4\]"):
            sht.logprobs(T(h), T(w), T(t), loss_mask=T(mi))
    # NumPy and C refuse the same values
    with pytest.raises((spanhead.InvalidArgumentError, spanhead.DTypeError)):
        spanhead.policy_loss(h, w, t, adv, old, loss_mask=m)
    # 0/1 in any dtype is fine and equals the bool mask
    a = sht.logprobs(T(h), T(w), T(t), loss_mask=T(mask.astype(np.float32)))
    b = sht.logprobs(T(h), T(w), T(t), loss_mask=T(mask.astype(bool)))
    assert torch.equal(a, b)


@pytest.mark.parametrize("kw", [dict(num_tokens=2**63), dict(num_seqs=2**64),
                                dict(threads=2**63), dict(chunk_rows=2**63),
                                dict(chunk_bytes=2**70)])
def test_torch_int64_bounds(rng, kw):
    """Integers beyond int64 get spanhead's overflow error naming the argument, before torch's
    operator schema sees them (was: "Expected a value of type 'List[int]'")."""
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    T = torch.from_numpy
    name = next(iter(kw))
    with pytest.raises(spanhead.SizeOverflowError, match=f"{name}: "):
        sht.policy_loss(T(h), T(w), T(t), T(adv), T(old), loss_mask=T(mask), seq_ids=T(seq),
                        **kw)
    if name not in ("num_tokens", "num_seqs"):
        with pytest.raises(spanhead.SizeOverflowError, match=f"{name}: "):
            sht.logprobs(T(h), T(w), T(t), loss_mask=T(mask), **kw)
