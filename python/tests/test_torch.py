"""spanhead.torch on the CPU against PyTorch's own dense computation (skipped without torch;
the GPU half runs from scripts/device/python_gpu.sh)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import spanhead  # noqa: E402
import spanhead.torch as sht  # noqa: E402


def dense(h, w, t, mask=None, temperature=1.0, softcap=0.0):
    """PyTorch's own computation in float64: logits, log_softmax, gather, entropy."""
    u = h.double() @ w.double().T
    z = (softcap * torch.tanh(u / softcap) if softcap else u) / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    valid = t >= 0
    lp = logp_all.gather(-1, t.clamp(min=0).unsqueeze(-1)).squeeze(-1) * valid
    ent = -(logp_all.exp() * logp_all).sum(-1)
    lse = torch.logsumexp(z, dim=-1)
    mean = z.mean(-1)
    if mask is not None:
        m = mask.double()
        lp, ent, lse, mean = lp * m, ent * m, lse * m, mean * m
    return lp, ent, lse, mean


def make(rng_seed, N, H, V, dtype):
    g = torch.Generator().manual_seed(rng_seed)
    h = torch.randn(N, H, generator=g).to(dtype)
    w = (torch.randn(V, H, generator=g) * 2.5 / H ** 0.5).to(dtype)
    t = torch.randint(0, V, (N,), generator=g)
    t[::5] = -100
    return h, w, t


F32_TOL = 2e-5  # float32 arithmetic, relative to the values' scale (bf16 products are exact)
BF16_U = 2.0 ** -8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature,softcap", [(1.0, 0.0), (0.8, 3.0)])
@pytest.mark.parametrize("masked", [False, True])
def test_matches_dense(rng, kernel, dtype, temperature, softcap, masked):
    N, H, V = 33, 24, 91
    h, w, t = make(int(rng.integers(1 << 30)), N, H, V, dtype)
    mask = torch.rand(N) < 0.6 if masked else None
    h.requires_grad_(True)
    w.requires_grad_(True)
    out = sht.logprobs(h, w, t, loss_mask=mask, temperature=temperature, softcap=softcap,
                       entropy=True, lse=True, logit_mean=True, **kernel)
    hd = h.detach().double().requires_grad_(True)
    wd = w.detach().double().requires_grad_(True)
    ref = dense(hd, wd, t, mask, temperature, softcap)
    for name, got, want in zip(out._fields, out, ref):
        assert got.dtype == torch.float32 and got.shape == (N,)
        err = (got.double() - want.detach()).abs().max().item()
        assert err <= F32_TOL * max(1.0, want.abs().max().item()), f"{name}: max err {err}"
    if masked:
        assert torch.all(out.logprob[~mask] == 0) and torch.all(out.entropy[~mask] == 0)
    coef = [torch.randn(N, dtype=torch.float64) for _ in range(4)]
    loss = sum((c.float() * o).sum() for c, o in zip(coef, out))
    loss.backward()
    # the reference's dlogits (through the softcap), for the bf16 products' error bound
    u = hd @ wd.T
    u.retain_grad()
    z = (softcap * torch.tanh(u / softcap) if softcap else u) / temperature
    lsm = torch.log_softmax(z, -1)
    m = torch.ones(N, dtype=torch.float64) if mask is None else mask.double()
    r = (lsm.gather(-1, t.clamp(min=0)[:, None])[:, 0] * (t >= 0) * m,
         -(lsm.exp() * lsm).sum(-1) * m, torch.logsumexp(z, -1) * m, z.mean(-1) * m)
    sum((c * o).sum() for c, o in zip(coef, r)).backward()
    D = u.grad.abs()
    for name, got, want, prod in (("dhidden", h.grad, hd.grad, lambda: D @ wd.detach().abs()),
                                  ("dweight", w.grad, wd.grad, lambda: D.T @ hd.detach().abs())):
        assert got.dtype == dtype and got.shape == want.shape
        err = (got.double() - want).abs()
        bound = F32_TOL * max(1.0, want.abs().max().item())
        if dtype == torch.bfloat16:  # the bf16 GEMM's own error (docs/python.md, Tests)
            bound = bound + BF16_U * (prod() + want.abs())
        assert (err <= bound).all(), f"{name}: max err {err.max().item():.3e}"


@pytest.mark.filterwarnings("ignore:Input #:UserWarning")
def test_gradcheck_tiny():
    N, H, V = 3, 4, 5
    g = torch.Generator().manual_seed(7)
    # float32 inputs (spanhead computes from f32/bf16/f16); the ref kernel accumulates in
    # float64, so central differences with eps 1e-2 resolve the gradient to ~1e-4
    h = torch.randn(N, H, generator=g).requires_grad_(True)
    w = torch.randn(V, H, generator=g).requires_grad_(True)
    t = torch.tensor([1, -100, 4])

    def f(h_, w_):
        o = sht.logprobs(h_, w_, t, entropy=True, lse=True, logit_mean=True, softcap=2.0,
                         temperature=0.9, kernel="ref")
        return tuple(o)

    assert torch.autograd.gradcheck(f, (h, w), eps=1e-2, atol=2e-3, rtol=2e-3,
                                    nondet_tol=0.0)


def test_leading_dims_and_logprob_only(kernel):
    B, S, H, V = 2, 5, 8, 17
    h, w, t = make(3, B * S, H, V, torch.float32)
    lp = sht.logprobs(h.reshape(B, S, H), w, t.reshape(B, S), **kernel)
    assert isinstance(lp, torch.Tensor) and lp.shape == (B, S)
    ref = dense(h, w, t)[0].reshape(B, S)
    assert torch.allclose(lp.double(), ref, atol=1e-5)


def test_spans_and_mask(kernel):
    N, H, V = 40, 8, 23
    h, w, t = make(5, N, H, V, torch.float32)
    mask = torch.zeros(N, dtype=torch.bool)
    mask[4:9] = True
    mask[30:33] = True
    spans = spanhead.spans_from_mask(mask.numpy(), gap=2)
    lp = sht.logprobs(h, w, t, loss_mask=mask, spans=spans, **kernel)
    ref = dense(h, w, t, mask)[0]
    assert torch.allclose(lp.double(), ref, atol=1e-5)


def test_sample_support(kernel):
    N, H, V, K = 6, 8, 50, 4
    h, w, _ = make(9, N, H, V, torch.float32)
    cand = torch.stack([torch.randperm(V)[:K] for _ in range(N)])
    t = cand[:, 0].clone()
    out = sht.logprobs(h, w, t, candidates=cand, entropy=True, **kernel)
    z = (h.double() @ w.double().T).gather(1, cand)
    lsm = torch.log_softmax(z, -1)
    assert torch.allclose(out.logprob.double(), lsm[:, 0], atol=1e-5)
    assert torch.allclose(out.entropy.double(), -(lsm.exp() * lsm).sum(-1), atol=1e-5)


def test_no_grad_needed_and_unused_outputs(kernel):
    h, w, t = make(11, 7, 4, 9, torch.float32)
    w.requires_grad_(True)
    out = sht.logprobs(h, w, t, entropy=True, **kernel)
    out.logprob.sum().backward()  # entropy unused: its gradient is None, not zeros
    ref_w = w.detach().double().requires_grad_(True)
    dense(h, ref_w, t)[0].sum().backward()
    assert torch.allclose(w.grad.double(), ref_w.grad, atol=1e-5)


def test_bad_input():
    h, w, t = make(1, 6, 4, 9, torch.float32)
    with pytest.raises(spanhead.ShapeError, match="loss_mask"):
        sht.logprobs(h, w, t, loss_mask=torch.ones(5, dtype=torch.bool), kernel="ref")
    with pytest.raises(spanhead.DTypeError, match="float64"):
        sht.logprobs(h.double(), w.double(), t, kernel="ref")
    with pytest.raises(spanhead.ShapeError, match="targets"):
        sht.logprobs(h, w, t[:3], kernel="ref")
    with pytest.raises(spanhead.ShapeError):
        sht.logprobs(h, w[:, :3], t, kernel="ref")
    with pytest.raises(spanhead.InvalidArgumentError, match="targets"):
        sht.logprobs(h, w, torch.full((6,), 9), kernel="ref")


def test_generic_api_with_torch_tensors():
    """spanhead.head_forward allocates outputs with torch when given torch tensors."""
    h, w, t = make(2, 5, 4, 7, torch.float32)
    h.requires_grad_(True)  # exported detached
    r = spanhead.head_forward(h, w, t, entropy=True, context=spanhead.Context(kernel="ref"))
    assert isinstance(r.logprob, torch.Tensor) and r.logprob.dtype == torch.float32
    assert torch.allclose(r.logprob.double(), dense(h.detach(), w, t)[0], atol=1e-5)


@pytest.mark.parametrize("softcap", [0.0, 5.0])
def test_z_loss_and_label_smoothing(kernel, softcap):
    """Trainer losses written with the per-row outputs (issue 9): z-loss from lse and
    label-smoothed cross-entropy from logprob, lse and logit_mean, against the same losses
    computed densely in float64; values and gradients."""
    N, H, V, eps, zc = 29, 16, 77, 0.1, 1e-2
    h, w, t = make(13, N, H, V, torch.float32)
    h.requires_grad_(True)
    w.requires_grad_(True)
    o = sht.logprobs(h, w, t, lse=True, logit_mean=True, softcap=softcap, temperature=0.9,
                     **kernel)
    valid = (t >= 0).float()
    # mean_j log p_j = logit_mean - lse
    ls = -((1 - eps) * o.logprob + eps * (o.logit_mean - o.lse) * valid)
    loss = ls.sum() / valid.sum() + zc * (o.lse ** 2).mean()
    loss.backward()
    hd = h.detach().double().requires_grad_(True)
    wd = w.detach().double().requires_grad_(True)
    u = hd @ wd.T
    z = (softcap * torch.tanh(u / softcap) if softcap else u) / 0.9
    lsm = torch.log_softmax(z, -1)
    vd = valid.double()
    nll = -lsm.gather(-1, t.clamp(min=0).unsqueeze(-1)).squeeze(-1) * vd
    ref_ls = (1 - eps) * nll - eps * lsm.mean(-1) * vd
    ref = ref_ls.sum() / vd.sum() + zc * (torch.logsumexp(z, -1) ** 2).mean()
    ref.backward()
    assert abs(loss.item() - ref.item()) <= 1e-5 * max(1.0, abs(ref.item()))
    for name, got, want in (("dhidden", h.grad, hd.grad), ("dweight", w.grad, wd.grad)):
        err = (got.double() - want).abs().max().item()
        assert err <= 2e-5 * max(1.0, want.abs().max().item()), f"{name}: max err {err}"


def test_operator_schemas_stay_short():
    """Per-call cost: torch's autograd wrapper of a custom op with a setup_context runs
    torch._library.utils.fill_defaults on every forward, which rebuilds schema.arguments
    (n Argument objects) 2n + 1 times: quadratic in the argument count (27 arguments: ~230 us
    per call on this CPU, 10: ~50 us). The operators pack their scalars into one float[] and
    one int[] (spanhead._torch_ops.pack_tail); this keeps them from growing back (each has
    one optional tensor more since issue 25: the per-row temperatures, trows)."""
    from spanhead import _torch_ops as ops
    n = {op._opoverload._schema.name: len(op._opoverload._schema.arguments)
         for op in (ops.head_fwd, ops.head_bwd, ops.weighted_loss)}
    assert n["spanhead::head_fwd"] <= 12 and n["spanhead::weighted_loss"] <= 11, n
    assert n["spanhead::head_bwd"] <= 18, n
    # the packing round-trips every field of the tail
    tail = (3, 100, 5000, 0.7, 30.0, True, 12345, 2, "avx2", True, False, 64, 1 << 20, "/t.json")
    a = ops._unpack(*ops.pack_tail(tail))
    assert (a.gap, a.vocab_start, a.vocab_total, a.temperature, a.softcap, a.reduce_dhidden,
            a.comm) == tail[:7]
    assert a.opts == (2, "avx2", True, False, 64, 1 << 20, "/t.json")
