"""torch.compile, autocast and the drop-in cross-entropy of spanhead.torch (CPU; the CUDA cases
run in test_torch_cuda.py on a GPU machine).

- torch.compile(fullgraph=True) over steps that call logprobs, weighted_logprob_loss and
  linear_cross_entropy with host masks (tensor, NumPy) and spans (NumPy, tensor, list) as
  arguments of the compiled function: fullgraph makes any graph break an error; the compiled
  loss and gradients equal the eager ones (aot_eager: same kernels, so to fp32 rounding of
  the surrounding sums; inductor: reassociated sums), and eager equals a float64 dense
  reference.
- autocast: bf16 activations with a float32 master weight, as F.linear would run; the weight's
  gradient stays float32.
- linear_cross_entropy / LinearCrossEntropyLoss against F.cross_entropy on float64 logits:
  ignore_index, every reduction, temperature, softcap, label smoothing, all rows ignored.

The compiled entry points with a non-unit / non-uniform upstream gradient ((loss * 1.7),
random per-row gradients) and every optional tensor given and absent, against float64 (not
only against eager): test_entry_points.py.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import spanhead  # noqa: E402
import spanhead.torch as sht  # noqa: E402

F32 = 2e-5  # fp32 arithmetic on O(1) values, relative to the values' scale


def dense64(h, w, temperature=1.0, softcap=0.0):
    u = h.double() @ w.double().T
    if softcap:
        u = softcap * torch.tanh(u / softcap)
    return u / temperature


def case(seed, N=37, H=16, V=53, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, H, generator=g).to(dtype)
    w = (torch.randn(V, H, generator=g) * 2.0 / H ** 0.5).to(dtype)
    t = torch.randint(0, V, (N,), generator=g)
    m = torch.rand(N, generator=g) < 0.6
    return h, w, t, m


def assert_close(name, got, want, tol):
    got, want = got.detach().double(), want.detach().double()
    err = (got - want).abs().max().item() if got.numel() else 0.0
    bound = tol * max(1.0, want.abs().max().item() if want.numel() else 0.0)
    assert err <= bound, f"{name}: max |diff| {err:.3e} > {bound:.3e}"


def grads(fn, *leaves):
    for x in leaves:
        x.grad = None
    y = fn()
    y.backward()
    return y.detach(), [x.grad.clone() for x in leaves]


def step(h, w, t, m, sp, coef):
    """One step through every entry point: two-pass logprobs (host mask; spans), one-pass
    weighted loss, drop-in cross-entropy (mean and none)."""
    out = sht.logprobs(h, w, t, loss_mask=m, entropy=True, lse=True)
    l1 = -(out.logprob * 1.5).sum() + 0.1 * out.entropy.sum() + 0.01 * out.lse.sum()
    l2 = sht.weighted_logprob_loss(h, w, t, coef, loss_mask=m, entropy_coef=0.05)
    l3 = sht.linear_cross_entropy(h, w, torch.where(torch.as_tensor(m), t, -100))
    l4 = sht.linear_cross_entropy(h, w, t, reduction="none", softcap=3.0).sum()
    l5 = sht.logprobs(h, w, t, spans=sp, temperature=0.8).sum()
    return l1 + l2 + l3 + l4 + l5


def step_ref(h, w, t, m, sp, coef):
    """The same step on float64 dense logits."""
    mf = m.double()
    lsm = torch.log_softmax(dense64(h, w), -1)
    lp = lsm.gather(1, t[:, None])[:, 0] * mf
    ent = -(lsm.exp() * lsm).sum(-1) * mf
    lse = torch.logsumexp(dense64(h, w), -1) * mf
    l1 = -(lp * 1.5).sum() + 0.1 * ent.sum() + 0.01 * lse.sum()
    l2 = -(coef.double() * lp).sum() - 0.05 * ent.sum()
    l3 = -(lp.sum() / mf.sum())
    l4 = F.cross_entropy(dense64(h, w, softcap=3.0), t, reduction="sum")
    act = torch.zeros(len(t), dtype=torch.float64)
    for a, b in sp.tolist():
        act[a:b] = 1
    l5 = (torch.log_softmax(dense64(h, w, 0.8), -1).gather(1, t[:, None])[:, 0] * act).sum()
    return l1 + l2 + l3 + l4 + l5


@pytest.mark.parametrize("mask_kind", ["tensor", "numpy"])
@pytest.mark.parametrize("spans_kind", ["numpy", "tensor"])
def test_compile_fullgraph_equals_eager(mask_kind, spans_kind):
    torch._dynamo.reset()
    h, w, t, m = case(11)
    h.requires_grad_(True)
    w.requires_grad_(True)
    coef = torch.rand(len(t), requires_grad=True)
    mm = m.numpy() if mask_kind == "numpy" else m
    sp = np.array([[0, 9], [12, 30], [31, 32]], dtype=np.int64)
    sp = torch.from_numpy(sp) if spans_kind == "tensor" else sp

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    y_c, (gh_c, gw_c, gc_c) = grads(lambda: compiled(h, w, t, mm, sp, coef), h, w, coef)
    y_e, (gh_e, gw_e, gc_e) = grads(lambda: step(h, w, t, mm, sp, coef), h, w, coef)
    # same kernels, same order: equal to the rounding of the surrounding fp32 sums
    for name, a, b in (("loss", y_c, y_e), ("dhidden", gh_c, gh_e), ("dweight", gw_c, gw_e),
                       ("dcoef", gc_c, gc_e)):
        assert_close(f"compiled vs eager {name}", a, b, 1e-6)

    h64 = h.detach().double().requires_grad_(True)
    w64 = w.detach().double().requires_grad_(True)
    c64 = coef.detach().double().requires_grad_(True)
    sp_np = sp.numpy() if isinstance(sp, torch.Tensor) else sp
    y_r, (gh_r, gw_r, gc_r) = grads(lambda: step_ref(h64, w64, t, m, sp_np, c64), h64, w64, c64)
    assert_close("eager vs float64 loss", y_e, y_r, F32)
    assert_close("eager vs float64 dhidden", gh_e, gh_r, F32)
    assert_close("eager vs float64 dweight", gw_e, gw_r, F32)
    assert_close("eager vs float64 dcoef", gc_e, gc_r, F32)


def test_compile_list_spans_and_no_grad():
    torch._dynamo.reset()
    h, w, t, _ = case(12)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(h, w, t):
        with torch.no_grad():
            a = sht.weighted_logprob_loss(h, w, t, 0.5, spans=[[2, 20]])
        return a, sht.logprobs(h, w, t, spans=[[2, 20]])

    a, lp = f(h, w, t)
    ref = torch.log_softmax(dense64(h, w), -1).gather(1, t[:, None])[:, 0]
    ref[:2] = 0
    ref[20:] = 0
    assert_close("logprob", lp, ref, F32)
    assert_close("loss", a, -0.5 * ref.sum(), F32)


def test_compile_inductor():
    """One step through inductor (C++ codegen for the surrounding ops, the spanhead ops as
    extern calls): the sums are reassociated, so equal to fp32 tolerance, not bitwise."""
    torch._dynamo.reset()
    h, w, t, m = case(13)
    h.requires_grad_(True)
    w.requires_grad_(True)
    coef = torch.rand(len(t))

    def f(h, w, t, m, coef):
        lp = sht.logprobs(h, w, t, loss_mask=m)
        return (lp * coef).sum() + sht.linear_cross_entropy(h, w, t, label_smoothing=0.1)

    compiled = torch.compile(f, fullgraph=True, backend="inductor")
    y_c, (gh_c, gw_c) = grads(lambda: compiled(h, w, t, m, coef), h, w)
    y_e, (gh_e, gw_e) = grads(lambda: f(h, w, t, m, coef), h, w)
    assert_close("loss", y_c, y_e, F32)
    assert_close("dhidden", gh_c, gh_e, F32)
    assert_close("dweight", gw_c, gw_e, F32)


def test_compile_rejects_float_spans():
    h, w, t, _ = case(14)
    with pytest.raises(spanhead.DTypeError, match="spans"):
        sht.logprobs(h, w, t, spans=torch.tensor([[0.5, 3.2]]))
    with pytest.raises(spanhead.DTypeError, match="spans"):
        sht.logprobs(h, w, t, spans=[[0.5, 3.2]])


# ---- autocast --------------------------------------------------------------------------------

@pytest.mark.parametrize("h_dtype", [torch.float32, torch.bfloat16])
def test_autocast_bf16_activations_fp32_master_weight(h_dtype):
    h, w, t, m = case(21, N=29, H=24, V=61)
    h = h.to(h_dtype).requires_grad_(True)
    w = w.float().requires_grad_(True)
    g = torch.randn(len(t))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp = sht.logprobs(h, w, t, loss_mask=m)
        loss = sht.linear_cross_entropy(h, w, t)
    (lp * g).sum().backward()  # one call's gradients: each is rounded to bf16 once
    assert lp.dtype == torch.float32
    assert w.grad.dtype == torch.float32 and h.grad.dtype == h_dtype

    # float64 on the bf16-rounded operands (what F.linear under autocast multiplies)
    hb = h.detach().bfloat16().double().requires_grad_(True)
    wb = w.detach().bfloat16().double().requires_grad_(True)
    lsm = torch.log_softmax(hb @ wb.T, -1)
    ref_lp = lsm.gather(1, t[:, None])[:, 0] * m.double()
    (ref_lp * g.double()).sum().backward()
    assert_close("logprob", lp, ref_lp, F32)  # fp32 accumulation of exact bf16 products
    assert_close("loss", loss, F.cross_entropy((hb @ wb.T).detach(), t), F32)
    # the gradients leave the kernels in bf16 (the cast's dtype): one rounding, half an ulp
    # (2**-9 relative), bounded here by 2**-8
    ulp = 2.0 ** -8
    for name, g, r in (("dweight", w.grad, wb.grad), ("dhidden", h.grad, hb.grad)):
        err = (g.double() - r).abs()
        assert (err <= ulp * r.abs() + F32 * r.abs().max()).all(), \
            f"{name}: max |diff| {err.max().item():.3e}"


def test_no_autocast_mixed_dtypes_raise():
    h, w, t, _ = case(22)
    with pytest.raises(spanhead.DTypeError):
        sht.logprobs(h.bfloat16(), w.float(), t)


# ---- linear_cross_entropy --------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [-100, 0])
@pytest.mark.parametrize("temperature,softcap,eps", [(1.0, None, 0.0), (0.7, 5.0, 0.0),
                                                     (1.0, None, 0.1), (1.3, 2.0, 0.25)])
def test_linear_cross_entropy_matches_f(reduction, ignore_index, temperature, softcap, eps):
    h, w, t, m = case(31, N=45, H=20, V=67)
    t = torch.where(m, t, torch.full_like(t, ignore_index))
    t = t.reshape(5, 9)
    h = h.reshape(5, 9, 20).requires_grad_(True)
    w.requires_grad_(True)
    loss = sht.linear_cross_entropy(h, w, t, ignore_index=ignore_index, reduction=reduction,
                                    temperature=temperature, softcap=softcap,
                                    label_smoothing=eps)
    g = torch.rand(loss.shape) if reduction == "none" else torch.tensor(0.7)
    (loss * g).sum().backward()

    h64 = h.detach().double().requires_grad_(True)
    w64 = w.detach().double().requires_grad_(True)
    z = dense64(h64.reshape(-1, 20), w64, temperature, softcap or 0.0)
    ref = F.cross_entropy(z, t.reshape(-1), ignore_index=ignore_index, reduction=reduction,
                          label_smoothing=eps)
    if reduction == "none":
        ref = ref.reshape(5, 9)
    (ref * g.double()).sum().backward()
    assert loss.shape == ref.shape and loss.dtype == torch.float32
    assert_close("loss", loss, ref, F32)
    assert_close("dhidden", h.grad, h64.grad, F32)
    assert_close("dweight", w.grad, w64.grad, F32)


def test_linear_cross_entropy_all_ignored_and_module():
    h, w, t, _ = case(32)
    t = torch.full_like(t, -100)
    h.requires_grad_(True)
    loss = sht.linear_cross_entropy(h, w, t)
    assert torch.isnan(loss)  # 0 / 0, as F.cross_entropy
    loss.backward()
    assert (h.grad == 0).all()
    assert sht.linear_cross_entropy(h, w, t, reduction="sum").item() == 0.0

    h, w, t, m = case(33)
    mod = sht.LinearCrossEntropyLoss(ignore_index=-1, label_smoothing=0.05)
    assert "label_smoothing=0.05" in repr(mod)
    t = torch.where(m, t, -1)
    assert_close("module", mod(h, w, t), F.cross_entropy(dense64(h, w), t, ignore_index=-1,
                                                        label_smoothing=0.05), F32)
    with pytest.raises(spanhead.InvalidArgumentError, match="reduction"):
        sht.LinearCrossEntropyLoss(reduction="avg")
    with pytest.raises(spanhead.InvalidArgumentError, match="label_smoothing"):
        sht.linear_cross_entropy(h, w, t, label_smoothing=1.5)


# ---- the fused policy loss under torch.compile -----------------------------------------------

@pytest.mark.skipif(not hasattr(sht, "policy_loss"),
                    reason="this spanhead has no spanhead.torch.policy_loss (issue 14)")
@pytest.mark.parametrize("loss_type,kl", [("ppo", "none"), ("ppo", "k3"), ("cispo", "none")])
@pytest.mark.parametrize("mask_kind", ["tensor", "numpy"])
def test_compile_policy_loss_equals_eager(loss_type, kl, mask_kind):
    torch._dynamo.reset()
    h, w, t, m = case(41, N=40, H=16, V=59)
    h.requires_grad_(True)
    w.requires_grad_(True)
    g = torch.Generator().manual_seed(42)
    adv = torch.randn(len(t), generator=g)
    with torch.no_grad():
        lp0 = sht.logprobs(h, w, t)
    old = lp0 + 0.3 * torch.randn(len(t), generator=g)  # ratios on both sides of the clip
    ref = lp0 + 0.2 * torch.randn(len(t), generator=g)
    mm = m.numpy() if mask_kind == "numpy" else m
    kw = dict(loss_type=loss_type, clip_low=0.2, clip_high=0.28, kl_type=kl,
              kl_coef=0.05 if kl != "none" else 0.0, entropy_coef=0.01)

    def f(h, w, t, adv, old, ref, mm):
        out = sht.policy_loss(h, w, t, adv, old, loss_mask=mm,
                              ref_logprobs=ref if kl != "none" else None, **kw)
        return out.loss

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    y_c, (gh_c, gw_c) = grads(lambda: compiled(h, w, t, adv, old, ref, mm), h, w)
    y_e, (gh_e, gw_e) = grads(lambda: f(h, w, t, adv, old, ref, mm), h, w)
    for name, a, b in (("loss", y_c, y_e), ("dhidden", gh_c, gh_e), ("dweight", gw_c, gw_e)):
        assert_close(f"policy {loss_type}/{kl} compiled vs eager {name}", a, b, 1e-6)

    # and eager against the same loss written in torch on spanhead's two-pass log-probs
    # (ppo, token-mean: verl's compute_policy_loss + kl_penalty + agg_loss)
    if loss_type == "ppo":
        h2 = h.detach().clone().requires_grad_(True)
        w2 = w.detach().clone().requires_grad_(True)
        out = sht.logprobs(h2, w2, t, loss_mask=m, entropy=True)
        r = torch.exp(out.logprob - old)
        pg = torch.maximum(-adv * r, -adv * r.clamp(1 - 0.2, 1 + 0.28))
        per = pg - 0.01 * out.entropy
        if kl == "k3":
            x = ref - out.logprob
            per = per + 0.05 * (torch.exp(x) - x - 1)
        mf = m.float()
        y_t = (per * mf).sum() / mf.sum()
        y_t.backward()
        assert_close("policy vs torch loss", y_e, y_t.detach(), F32)
        assert_close("policy vs torch dhidden", gh_e, h2.grad, F32)
        assert_close("policy vs torch dweight", gw_e, w2.grad, F32)


def test_compile_with_a_spanhead_comm():
    """tp_group=spanhead.Comm: the communicator lookup runs at trace time (a constant of the
    graph), the call itself is the operator; one rank (Comm.none) equals no group."""
    torch._dynamo.reset()
    h, w, t, m = case(51)
    h.requires_grad_(True)
    comm = spanhead.Comm.none()

    def f(h, w, t, m):
        return (sht.logprobs(h, w, t, loss_mask=m, tp_group=comm).sum() +
                sht.weighted_logprob_loss(h, w, t, 0.1, loss_mask=m, tp_group=comm))

    y_c, (g_c,) = grads(lambda: torch.compile(f, fullgraph=True, backend="aot_eager")(h, w, t, m),
                        h)
    y_e, (g_e,) = grads(lambda: (sht.logprobs(h, w, t, loss_mask=m).sum() +
                                 sht.weighted_logprob_loss(h, w, t, 0.1, loss_mask=m)), h)
    assert_close("loss", y_c, y_e, 1e-6)
    assert_close("dhidden", g_c, g_e, 1e-6)


@pytest.mark.parametrize("compiled", [False, True])
def test_library_errors_arrive_as_spanhead_exceptions(compiled):
    """What the C API rejects inside an operator is the same spanhead exception, eager or
    compiled (the fake implementation does not validate; the real one runs the library)."""
    torch._dynamo.reset()
    h, w, t, _ = case(61)

    def f(h, w, t, temperature):
        return sht.logprobs(h, w, t, temperature=temperature)

    g = torch.compile(f, fullgraph=True, backend="aot_eager") if compiled else f
    with pytest.raises(spanhead.InvalidArgumentError, match="temperature"):
        g(h, w, t, 0.0)
    with pytest.raises(spanhead.Error):
        g(h, w, torch.full_like(t, w.shape[0] + 5), 1.0)  # a target beyond the vocabulary


def test_compile_dynamic_shapes_and_scalars():
    """One compiled function over changing N, V, temperature and coefficients (dynamo makes
    them symbolic after the first change): no graph break, each call equals eager."""
    torch._dynamo.reset()

    def f(h, w, t, temperature, coef, eps):
        return (sht.logprobs(h, w, t, temperature=temperature).sum() +
                sht.weighted_logprob_loss(h, w, t, 0.1, entropy_coef=coef) +
                sht.linear_cross_entropy(h, w, t, label_smoothing=eps))

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    for i, (N, V, T, c, e) in enumerate([(5, 7, 1.0, 0.0, 0.0), (9, 11, 0.7, 0.1, 0.1),
                                         (13, 17, 1.3, 0.2, 0.0), (21, 19, 0.9, 0.3, 0.2)]):
        h, w, t, _ = case(70 + i, N=N, H=8, V=V)
        assert_close(f"N={N} V={V} T={T}", cf(h, w, t, T, c, e), f(h, w, t, T, c, e), 1e-6)
