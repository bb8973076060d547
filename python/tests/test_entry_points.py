"""Every Python entry point against an independent float64 reference, with every argument it
forwards exercised (issue 28): the upstream gradient non-unit (a scalar loss times 1.7) and
non-uniform (per-row outputs back-propagated with random gradients), and every optional
tensor or scalar (KL reference, importance weights, sequence ids, temperature, softcap, spans)
given in one case and absent in another.

The reference is dense: float64 logits h w^T (softcap, temperature), log-softmax, and the loss
written in torch (test_policy.torch_formulation: verl's formulas), differentiated by torch's
autograd in float64. It shares no code with spanhead's wrappers, so a wrapper that drops an
argument, swaps two or ignores the incoming gradient disagrees with it. Entry points:

- NumPy: spanhead.policy_loss (loss, metrics, dhidden, dweight);
- torch eager and torch.compile(fullgraph, aot_eager): logprobs (+ entropy, lse,
  logit_mean), weighted_logprob_loss (+ the gradient of the weights), linear_cross_entropy,
  policy_loss;
- CUDA graphs: policy_loss and logprobs captured and replayed on new inputs (GPU only; skipped
  visibly here).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import spanhead  # noqa: E402
import spanhead.torch as sht  # noqa: E402
from test_policy import torch_formulation  # noqa: E402

TOL = 3e-5  # fp32 arithmetic on O(1) values, relative to the values' scale
G_OUT = 1.7  # the upstream gradient of every scalar loss (1 would hide a dropped scaling)


def dense64(h, w, temperature=1.0, softcap=0.0):
    u = h.double() @ w.double().T
    if softcap:
        u = softcap * torch.tanh(u / softcap)
    return u / temperature


def assert_close(name, got, want, tol=TOL):
    got = torch.as_tensor(got).detach().double().cpu()
    want = torch.as_tensor(want).detach().double().cpu()
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{name}: not finite"
    err = (got - want).abs().max().item() if got.numel() else 0.0
    bound = tol * max(1.0, want.abs().max().item() if want.numel() else 0.0)
    assert err <= bound, f"{name}: max |diff| {err:.3e} > {bound:.3e}"


def case(seed, N=41, H=16, V=59, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, H, generator=g)
    w = torch.randn(V, H, generator=g) * 2.0 / H ** 0.5
    t = torch.randint(0, V, (N,), generator=g)
    t[::9] = -100  # ignored targets
    m = torch.rand(N, generator=g) < 0.7
    adv = torch.randn(N, generator=g)
    seq = torch.repeat_interleave(torch.arange(N), torch.randint(1, 6, (N,), generator=g))[:N]
    isw = 0.4 + torch.rand(N, generator=g)
    noise = torch.randn(3, N, generator=g)
    d = dict(h=h, w=w, t=t, m=m, adv=adv, seq=seq, isw=isw, noise=noise)
    return {k: v.to(device) for k, v in d.items()}


def leaves(*xs):
    return [x.detach().clone().requires_grad_(True) for x in xs]


# ---- the policy loss: NumPy, torch eager, torch.compile ---------------------------------------

# each variant turns on one optional argument (or a set that needs each other); "plain" has
# none of them: together every forwarded tensor and scalar is both given and absent
POLICY_VARIANTS = {
    "plain": dict(),
    "kl": dict(ref=True, kl_type="k3", kl_coef=0.07),
    "kl-k2": dict(ref=True, kl_type="k2", kl_coef=0.11),
    "is_weights": dict(isw=True),
    "seq_ids": dict(seq=True, agg="seq-mean-token-mean"),
    "temperature": dict(temperature=0.7),
    "softcap": dict(softcap=2.5),
    "counts": dict(seq=True, agg="seq-mean-token-sum", num_tokens=97, num_seqs=13),
    "dual-clip": dict(clip_ratio_c=1.6),
    "all": dict(ref=True, kl_type="k1", kl_coef=0.05, isw=True, seq=True,
                agg="seq-mean-token-sum-norm", norm_length=7.0, temperature=1.3, softcap=3.0,
                entropy_coef=0.02),
    "gspo": dict(loss_type="gspo", seq=True, agg="seq-mean-token-mean", isw=True,
                 temperature=0.8),
    "cispo": dict(loss_type="cispo", ref=True, kl_type="k3", kl_coef=0.03, softcap=4.0),
}


def policy_inputs(d, variant):
    """(old, ref) log-probs near the model's own (ratios on both sides of the clip range) and
    the keyword arguments of the variant, split into spanhead's and the formulation's."""
    v = dict(variant)
    T, c = v.pop("temperature", 1.0), v.pop("softcap", 0.0)
    with torch.no_grad():
        lsm = torch.log_softmax(dense64(d["h"], d["w"], T, c), -1)
        lp = lsm.gather(1, d["t"].clamp(min=0)[:, None])[:, 0].float()
    old = lp + 0.3 * d["noise"][0]
    ref = lp + 0.25 * d["noise"][1]
    opts = dict(loss_type="ppo", clip_low=0.2, clip_high=0.28, clip_ratio_c=None,
                kl_type="none", kl_coef=0.0, entropy_coef=0.01, agg="token-mean",
                num_tokens=None, num_seqs=None, norm_length=None)
    use_ref, use_isw, use_seq = v.pop("ref", False), v.pop("isw", False), v.pop("seq", False)
    opts.update(v)
    tensors = dict(ref_logprobs=ref if use_ref else None,
                   is_weights=d["isw"] if use_isw else None,
                   seq_ids=d["seq"] if use_seq else None)
    return old, tensors, opts, T, c


def policy_ref64(d, old, tensors, opts, T, c):
    """loss, metrics, dhidden, dweight of G_OUT * loss in float64 on dense logits."""
    h, w = leaves(d["h"].double(), d["w"].double())
    lsm = torch.log_softmax(dense64(h, w, T, c), -1)
    act = (d["m"] & (d["t"] >= 0)).double()
    lp = lsm.gather(1, d["t"].clamp(min=0)[:, None])[:, 0] * act
    ent = -(lsm.exp() * lsm).sum(-1) * act

    def dbl(x):
        return None if x is None else x.double()
    loss, met = torch_formulation(torch, lp, ent, d["adv"].double(), old.double(), act,
                                  ref=dbl(tensors["ref_logprobs"]),
                                  seq=tensors["seq_ids"] if tensors["seq_ids"] is not None
                                  else d["seq"],
                                  isw=dbl(tensors["is_weights"]), **opts)
    (loss * G_OUT).backward()
    return loss.detach(), {k: v.detach() for k, v in met.items()}, h.grad, w.grad


def check_policy(tag, loss, metrics, gh, gw, ref):
    r_loss, r_met, r_gh, r_gw = ref
    assert_close(f"{tag} loss", loss, r_loss)
    for k, v in r_met.items():
        assert_close(f"{tag} metric {k}", metrics[k], v)
    assert_close(f"{tag} dhidden", gh, r_gh)
    assert_close(f"{tag} dweight", gw, r_gw)


@pytest.mark.parametrize("variant", list(POLICY_VARIANTS))
def test_numpy_policy_loss_every_optional_tensor(variant):
    d = case(101)
    old, tensors, opts, T, c = policy_inputs(d, POLICY_VARIANTS[variant])
    ref = policy_ref64(d, old, tensors, opts, T, c)
    kw = {k: (None if v is None else v.numpy()) for k, v in tensors.items()}
    res = spanhead.policy_loss(d["h"].numpy(), d["w"].numpy(), d["t"].numpy(), d["adv"].numpy(),
                               old.numpy(), loss_mask=d["m"].numpy().astype(np.uint8),
                               temperature=T, softcap=c, **kw, **opts)
    # the NumPy entry point's gradients are those of the loss itself (upstream 1)
    check_policy(f"numpy {variant}", res.loss, res.metrics, res.dhidden * G_OUT,
                 res.dweight * G_OUT, ref)


def _policy_step(h, w, t, adv, old, m, ref_logprobs, is_weights, seq_ids, kw):
    out = sht.policy_loss(h, w, t, adv, old, loss_mask=m, ref_logprobs=ref_logprobs,
                          is_weights=is_weights, seq_ids=seq_ids, **kw)
    return out.loss, out.metrics


@pytest.mark.parametrize("mode", ["eager", "compile"])
@pytest.mark.parametrize("variant", list(POLICY_VARIANTS))
def test_torch_policy_loss_every_optional_tensor(variant, mode):
    d = case(102)
    old, tensors, opts, T, c = policy_inputs(d, POLICY_VARIANTS[variant])
    ref = policy_ref64(d, old, tensors, opts, T, c)
    kw = dict(opts, temperature=T, softcap=c)
    fn = _policy_step
    if mode == "compile":
        torch._dynamo.reset()
        fn = torch.compile(_policy_step, fullgraph=True, backend="aot_eager")
    h, w = leaves(d["h"], d["w"])
    loss, met = fn(h, w, d["t"], d["adv"], old, d["m"], tensors["ref_logprobs"],
                   tensors["is_weights"], tensors["seq_ids"], kw)
    (loss * G_OUT).backward()
    check_policy(f"torch {mode} {variant}", loss, met, h.grad, w.grad, ref)


# ---- logprobs, weighted_logprob_loss, linear_cross_entropy: eager and compiled ------------------

HEAD_VARIANTS = {
    "plain": dict(),
    "temperature": dict(temperature=0.7),
    "softcap": dict(softcap=3.0),
    "spans": dict(spans=True),
    "both": dict(temperature=1.4, softcap=2.0, spans=True),
}


def _active(d, spans):
    if spans is None:
        return d["m"].double()
    act = torch.zeros(len(d["t"]), dtype=torch.float64)
    for a, b in spans.tolist():
        act[a:b] = 1
    return act


def _spans():
    return np.array([[1, 9], [12, 30], [33, 34], [36, 41]], dtype=np.int64)


def _logprobs_step(h, w, t, m, sp, T, c):
    out = sht.logprobs(h, w, t, loss_mask=None if sp is not None else m, spans=sp,
                       temperature=T, softcap=c, entropy=True, lse=True, logit_mean=True)
    return out.logprob, out.entropy, out.lse, out.logit_mean


def _maybe_compile(fn, mode):
    if mode == "eager":
        return fn
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


def _head_args(d, variant):
    v = HEAD_VARIANTS[variant]
    return (_spans() if v.get("spans") else None, v.get("temperature", 1.0),
            v.get("softcap", 0.0))


@pytest.mark.parametrize("mode", ["eager", "compile"])
@pytest.mark.parametrize("variant", list(HEAD_VARIANTS))
def test_logprobs_non_uniform_upstream(variant, mode):
    """Four per-row outputs back-propagated with four different random gradients."""
    d = case(103)
    sp, T, c = _head_args(d, variant)
    g = torch.Generator().manual_seed(7)
    ups = [torch.randn(len(d["t"]), generator=g) for _ in range(4)]
    fn = _maybe_compile(_logprobs_step, mode)
    h, w = leaves(d["h"], d["w"])
    outs = fn(h, w, d["t"], d["m"], sp, T, c)
    torch.autograd.backward(list(outs), ups)

    h64, w64 = leaves(d["h"].double(), d["w"].double())
    z = dense64(h64, w64, T, c)
    act = _active(d, sp)
    lsm = torch.log_softmax(z, -1)
    valid = (d["t"] >= 0).double()
    lp = lsm.gather(1, d["t"].clamp(min=0)[:, None])[:, 0] * act * valid
    ent = -(lsm.exp() * lsm).sum(-1) * act
    lse = torch.logsumexp(z, -1) * act
    mean = z.mean(-1) * act
    refs = (lp, ent, lse, mean)
    torch.autograd.backward(list(refs), [u.double() for u in ups])
    for name, a, b in zip(("logprob", "entropy", "lse", "logit_mean"), outs, refs):
        assert_close(f"{mode} {variant} {name}", a, b)
    assert_close(f"{mode} {variant} dhidden", h.grad, h64.grad)
    assert_close(f"{mode} {variant} dweight", w.grad, w64.grad)


def _weighted_step(h, w, t, coef, m, sp, T, c, ec):
    return sht.weighted_logprob_loss(h, w, t, coef, loss_mask=None if sp is not None else m,
                                     spans=sp, temperature=T, softcap=c, entropy_coef=ec)


@pytest.mark.parametrize("mode", ["eager", "compile"])
@pytest.mark.parametrize("variant", list(HEAD_VARIANTS))
@pytest.mark.parametrize("ec", [0.0, 0.05])
def test_weighted_logprob_loss_scaled_upstream(variant, mode, ec):
    d = case(104)
    sp, T, c = _head_args(d, variant)
    fn = _maybe_compile(_weighted_step, mode)
    coef0 = 0.2 + torch.rand(len(d["t"]), generator=torch.Generator().manual_seed(3))
    h, w, coef = leaves(d["h"], d["w"], coef0)
    loss = fn(h, w, d["t"], coef, d["m"], sp, T, c, ec)
    (loss * G_OUT).backward()

    h64, w64, c64 = leaves(d["h"].double(), d["w"].double(), coef0.double())
    lsm = torch.log_softmax(dense64(h64, w64, T, c), -1)
    act = _active(d, sp)
    valid = (d["t"] >= 0).double()
    lp = lsm.gather(1, d["t"].clamp(min=0)[:, None])[:, 0] * act * valid
    ent = -(lsm.exp() * lsm).sum(-1) * act
    ref = -(c64 * lp).sum() - ec * ent.sum()
    (ref * G_OUT).backward()
    tag = f"{mode} {variant} ec={ec}"
    assert_close(f"{tag} loss", loss, ref)
    assert_close(f"{tag} dhidden", h.grad, h64.grad)
    assert_close(f"{tag} dweight", w.grad, w64.grad)
    assert_close(f"{tag} dweights", coef.grad, c64.grad)


def _lce_step(h, w, t, reduction, T, c, eps):
    return sht.linear_cross_entropy(h, w, t, reduction=reduction, temperature=T, softcap=c,
                                    label_smoothing=eps)


@pytest.mark.parametrize("mode", ["eager", "compile"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("T,c,eps", [(1.0, None, 0.0), (0.8, 2.5, 0.1)])
def test_linear_cross_entropy_scaled_upstream(mode, reduction, T, c, eps):
    d = case(105)
    fn = _maybe_compile(_lce_step, mode)
    h, w = leaves(d["h"], d["w"])
    loss = fn(h, w, d["t"], reduction, T, c, eps)
    g = (torch.randn(loss.shape, generator=torch.Generator().manual_seed(5))
         if reduction == "none" else torch.tensor(G_OUT))
    loss.backward(g)
    h64, w64 = leaves(d["h"].double(), d["w"].double())
    ref = F.cross_entropy(dense64(h64, w64, T, c or 0.0), d["t"], reduction=reduction,
                          label_smoothing=eps)
    ref.backward(g.double())
    tag = f"{mode} {reduction} T={T} c={c} eps={eps}"
    assert_close(f"{tag} loss", loss, ref)
    assert_close(f"{tag} dhidden", h.grad, h64.grad)
    assert_close(f"{tag} dweight", w.grad, w64.grad)


# ---- CUDA graphs (a GPU machine; skipped visibly here) ----------------------------------------

def _cuda_ready():
    return torch.cuda.is_available() and spanhead.cuda_device_count() > 0


@pytest.mark.skipif(not _cuda_ready(), reason="CUDA graphs need a GPU and a CUDA libspanhead")
@pytest.mark.parametrize("variant", ["plain", "kl", "is_weights", "seq_ids", "temperature",
                                     "softcap", "all", "gspo"])
def test_cuda_graph_policy_loss_against_float64(variant):
    """policy_loss + backward (upstream G_OUT) captured once, replayed on new hidden states and
    advantages, each replay against the float64 reference of that replay's inputs."""
    dev = torch.device("cuda", 0)
    d = case(106, device=dev)
    old, tensors, opts, T, c = policy_inputs(d, POLICY_VARIANTS[variant])
    kw = dict(opts, temperature=T, softcap=c)
    h, w = leaves(d["h"], d["w"])

    def step():
        loss, met = _policy_step(h, w, d["t"], d["adv"], old, d["m"], tensors["ref_logprobs"],
                                 tensors["is_weights"], tensors["seq_ids"], kw)
        (loss * G_OUT).backward()
        return loss, met

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            h.grad = w.grad = None
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    h.grad = w.grad = None
    with torch.cuda.graph(graph, stream=s):
        loss, met = step()
    for trial in range(2):
        g = torch.Generator().manual_seed(200 + trial)
        with torch.no_grad():
            h.copy_(torch.randn(h.shape, generator=g).to(dev))
            d["adv"].copy_(torch.randn(d["adv"].shape, generator=g).to(dev))
        graph.replay()
        torch.cuda.synchronize()
        dc = {k: v.cpu() for k, v in d.items()}
        dc["h"] = h.detach().cpu()
        tc = {k: (None if v is None else v.cpu()) for k, v in tensors.items()}
        ref = policy_ref64(dc, old.cpu(), tc, opts, T, c)
        check_policy(f"cuda graph {variant} replay {trial}", loss, met, h.grad, w.grad, ref)


@pytest.mark.skipif(not _cuda_ready(), reason="CUDA graphs need a GPU and a CUDA libspanhead")
@pytest.mark.parametrize("variant", list(HEAD_VARIANTS))
def test_cuda_graph_logprobs_against_float64(variant):
    dev = torch.device("cuda", 0)
    d = case(107, device=dev)
    sp, T, c = _head_args(d, variant)
    gu = torch.Generator().manual_seed(9)
    ups = [torch.randn(len(d["t"]), generator=gu).to(dev) for _ in range(4)]
    mask = d["m"] if sp is None else None
    h, w = leaves(d["h"], d["w"])

    def step():
        outs = _logprobs_step(h, w, d["t"], mask, sp, T, c)
        torch.autograd.backward(list(outs), ups)
        return outs

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            h.grad = w.grad = None
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    h.grad = w.grad = None
    with torch.cuda.graph(graph, stream=s):
        outs = step()
    with torch.no_grad():
        h.copy_(torch.randn(h.shape, generator=torch.Generator().manual_seed(11)).to(dev))
    graph.replay()
    torch.cuda.synchronize()
    h64, w64 = leaves(h.detach().cpu().double(), d["w"].cpu().double())
    z = dense64(h64, w64, T, c)
    dc = {k: v.cpu() for k, v in d.items()}
    act = _active(dc, sp)
    lsm = torch.log_softmax(z, -1)
    valid = (dc["t"] >= 0).double()
    refs = (lsm.gather(1, dc["t"].clamp(min=0)[:, None])[:, 0] * act * valid,
            -(lsm.exp() * lsm).sum(-1) * act, torch.logsumexp(z, -1) * act, z.mean(-1) * act)
    torch.autograd.backward(list(refs), [u.cpu().double() for u in ups])
    for name, a, b in zip(("logprob", "entropy", "lse", "logit_mean"), outs, refs):
        assert_close(f"cuda graph {variant} {name}", a, b)
    assert_close(f"cuda graph {variant} dhidden", h.grad, h64.grad)
    assert_close(f"cuda graph {variant} dweight", w.grad, w64.grad)
