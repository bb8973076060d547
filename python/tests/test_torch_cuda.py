"""spanhead.torch on a CUDA GPU: against PyTorch's dense computation, CUDA-graph capture of a
forward + backward, and no host synchronization in the hot path. Skipped without a GPU (CI);
scripts/device/python_gpu.sh runs it on the H200."""

import time

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

import spanhead  # noqa: E402
import spanhead.torch as sht  # noqa: E402
from test_torch import dense  # noqa: E402

if spanhead.cuda_device_count() == 0:
    pytest.skip("the loaded libspanhead has no CUDA backend or sees no device",
                allow_module_level=True)

DEV = torch.device("cuda", 0)


def make(seed, N, H, V, dtype, ignore_every=5):
    g = torch.Generator(device="cpu").manual_seed(seed)
    h = torch.randn(N, H, generator=g).to(dtype)
    w = (torch.randn(V, H, generator=g) * 2.5 / H ** 0.5).to(dtype)
    t = torch.randint(0, V, (N,), generator=g)
    if ignore_every:
        t[::ignore_every] = -100
    return h.to(DEV), w.to(DEV), t.to(DEV)


# Tolerances from the arithmetic (issue 20). The logits accumulate in fp32 (exact FP32 for f32,
# tensor cores on exactly representable bf16 products for bf16), so every per-row output is
# float32 arithmetic on the inputs as given: F32_TOL relative to the values' scale for both
# dtypes. bf16 gradients: D = dlogits is rounded to bf16 before the two gradient products and
# the result to bf16 once: the GEMM's own error, bounded elementwise by
# 2**-8 (|D| @ |W|) (resp. |D|^T @ |h|) + 2**-8 |grad| + F32_TOL * scale.
F32_TOL = 5e-5
BF16_U = 2.0 ** -8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_kind", ["none", "host", "device", "device+spans"])
@pytest.mark.parametrize("N,H,V", [(1, 64, 1000), (257, 256, 8003), (1024, 512, 32000)])
def test_matches_dense(dtype, mask_kind, N, H, V):
    """Adapter vs torch's own float64 logits/log_softmax/gather/entropy on the same inputs."""
    h, w, t = make(N * 7 + V, N, H, V, dtype)
    mask_cpu = torch.rand(N) < 0.4
    mask = {"none": None, "host": mask_cpu, "device": mask_cpu.to(DEV),
            "device+spans": mask_cpu.to(DEV)}[mask_kind]
    spans = spanhead.spans_from_mask(mask_cpu.numpy(), 16) if mask_kind == "device+spans" \
        else None
    h.requires_grad_(True)
    w.requires_grad_(True)
    out = sht.logprobs(h, w, t, loss_mask=mask, spans=spans, entropy=True, lse=True,
                       temperature=0.9)
    hd = h.detach().double().requires_grad_(True)
    wd = w.detach().double().requires_grad_(True)
    ref_mask = None if mask is None else mask_cpu.to(DEV)
    ref = dense(hd, wd, t, ref_mask, 0.9)[:3]
    for name, got, want in zip(("logprob", "entropy", "lse"), out[:3], ref):
        err = (got.double() - want.detach()).abs().max().item()
        bound = F32_TOL * max(1.0, want.abs().max().item())
        print(f"{name}: max err {err:.3e} (bound {bound:.3e})")
        assert err <= bound, f"{name}: max err {err:.3e} > {bound:.3e}"
    if mask is not None:
        off = ~mask_cpu.to(DEV)
        assert torch.all(out.logprob[off] == 0) and torch.all(out.entropy[off] == 0)
    a, b = torch.randn(N, device=DEV), torch.randn(N, device=DEV)
    ((a * out.logprob).sum() + (b * out.entropy).sum() + 0.01 * out.lse.pow(2).sum()).backward()
    # the float64 reference, with dlogits kept for the bf16 error bound
    u = hd @ wd.T
    u.retain_grad()
    z = u / 0.9
    lsm = torch.log_softmax(z, -1)
    valid = t >= 0
    m = torch.ones(N, dtype=torch.float64, device=DEV) if ref_mask is None else \
        ref_mask.double()
    lp = lsm.gather(-1, t.clamp(min=0)[:, None])[:, 0] * valid * m
    ent = -(lsm.exp() * lsm).sum(-1) * m
    lse = torch.logsumexp(z, -1) * m
    ((a.double() * lp).sum() + (b.double() * ent).sum() + 0.01 * lse.pow(2).sum()).backward()
    D = u.grad.abs()
    for name, got, want, gemm in (("dhidden", h.grad, hd.grad, lambda: D @ wd.detach().abs()),
                                  ("dweight", w.grad, wd.grad,
                                   lambda: D.T @ hd.detach().abs())):
        err = (got.double() - want).abs()
        bound = F32_TOL * max(1.0, want.abs().max().item())
        if dtype == torch.bfloat16:
            bound = bound + BF16_U * (gemm() + want.abs())
        worst = (err - bound).max().item()
        print(f"{name}: max err {err.max().item():.3e}, worst margin {worst:.3e}")
        assert worst <= 0, f"{name}: max err {err.max().item():.3e} beyond the bound by {worst:.3e}"
    if mask is not None:
        assert torch.all(h.grad[~mask_cpu.to(DEV)] == 0)


def _step(h, w, t, mask, spans, adv):
    out = sht.logprobs(h, w, t, loss_mask=mask, spans=spans, entropy=True)
    loss = -(out.logprob * adv).sum() - 0.01 * out.entropy.sum()
    loss.backward()
    return out


def test_cuda_graph_capture_forward_backward():
    N, H, V = 512, 256, 4099
    h, w, t = make(11, N, H, V, torch.bfloat16)
    mask_cpu = torch.rand(N) < 0.5
    mask = mask_cpu.to(DEV)
    spans = spanhead.spans_from_mask(mask_cpu.numpy(), 8)
    adv = torch.randn(N, device=DEV)
    h.requires_grad_(True)
    w.requires_grad_(True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on the capture stream creates its context
        for _ in range(2):
            h.grad = w.grad = None
            _step(h, w, t, mask, spans, adv)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    h.grad = w.grad = None
    with torch.cuda.graph(g, stream=s):
        static = _step(h, w, t, mask, spans, adv)
    for trial in range(2):
        with torch.no_grad():  # new inputs in place, then replay
            h.copy_(torch.randn_like(h, dtype=torch.float32).to(h.dtype))
            adv.copy_(torch.randn_like(adv))
        g.replay()
        torch.cuda.synchronize()
        got = (static.logprob.clone(), h.grad.clone(), w.grad.clone())
        he = h.detach().clone().requires_grad_(True)
        we = w.detach().clone().requires_grad_(True)
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # the same stream, so the same spanhead context
            eager = _step(he, we, t, mask, spans, adv)
        torch.cuda.synchronize()
        assert torch.equal(got[0], eager.logprob), "graph replay differs from eager (logprob)"
        assert torch.equal(got[1], he.grad), "graph replay differs from eager (dhidden)"
        assert torch.equal(got[2], we.grad), "graph replay differs from eager (dweight)"


@pytest.mark.parametrize("with_spans", [False, True])
def test_no_host_sync_in_hot_path(with_spans):
    """The forward + backward returns to the host while the GPU is still busy with earlier
    work, and torch's sync debug mode sees no synchronizing call."""
    N, H, V = 2048, 512, 32000
    h, w, t = make(5, N, H, V, torch.bfloat16)
    mask_cpu = torch.rand(N) < 0.5
    mask = mask_cpu.to(DEV)
    spans = spanhead.spans_from_mask(mask_cpu.numpy(), 128) if with_spans else None
    adv = torch.randn(N, device=DEV)
    h.requires_grad_(True)
    w.requires_grad_(True)
    _step(h, w, t, mask, spans, adv)  # warm-up: context, workspace, autotune
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time queued ahead of us
        t0 = time.perf_counter()
        h.grad = w.grad = None
        _step(h, w, t, mask, spans, adv)
        host = time.perf_counter() - t0
    finally:
        torch.cuda.set_sync_debug_mode(0)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    waited = time.perf_counter() - t1
    print(f"host time of fwd+bwd {host * 1e3:.2f} ms, then waited {waited * 1e3:.1f} ms for "
          f"the GPU")
    assert waited > 0.2, "the step waited for the GPU: a host synchronization in the hot path"


def test_generic_api_on_gpu():
    """spanhead.head_forward / head_backward with torch CUDA tensors (outputs allocated by
    torch on the same device, the current stream used)."""
    N, H, V = 100, 64, 999
    h, w, t = make(3, N, H, V, torch.float32)
    r = spanhead.head_forward(h, w, t, entropy=True)
    assert r.logprob.device == DEV
    ref = dense(h, w, t)
    assert torch.allclose(r.logprob.double(), ref[0], atol=1e-4, rtol=1e-4)
    b = spanhead.head_backward(h, w, t, stats=r.stats,
                               dlogprob=torch.ones(N, device=DEV))
    assert b.dhidden.shape == (N, H) and b.dweight.shape == (V, H)
    with pytest.raises(spanhead.DeviceError):
        spanhead.head_forward(h, w.cpu(), t)


def test_nonfinite_counted_on_device():
    """A CUDA pass does not sync: a NaN hidden row on an active row comes out NaN, the pass
    returns, and Context.nonfinite() (the one synchronizing call) counts it, then resets."""
    N, H, V = 300, 64, 999
    h, w, t = make(5, N, H, V, torch.float32, ignore_every=0)
    h[17, 3] = float("nan")
    h[250, 0] = float("inf")
    ctx = spanhead.Context(("cuda", 0))
    try:
        assert ctx.nonfinite() == (0, -1)
        r = spanhead.head_forward(h, w, t, context=ctx)
        lp = r.logprob.cpu()
        assert torch.isnan(lp[17]) and not torch.isfinite(lp[250])
        fin = torch.ones(N, dtype=torch.bool)
        fin[[17, 250]] = False
        assert torch.isfinite(lp[fin]).all()
        assert ctx.nonfinite() == (2, 17)
        assert ctx.nonfinite() == (0, -1)
    finally:
        ctx.close()


# ---- torch.compile, autocast, drop-in cross-entropy on the GPU ------------------------------

@pytest.mark.parametrize("backend,mask_kind", [("aot_eager", "device"),
                                               ("aot_eager", "device+spans"),
                                               ("aot_eager", "host"),
                                               ("inductor", "device+spans")])
def test_compile_fullgraph_equals_eager_cuda(backend, mask_kind):
    torch._dynamo.reset()
    N, H, V = 300, 128, 5003
    h, w, t = make(21, N, H, V, torch.bfloat16)
    mask_cpu = torch.rand(N) < 0.5
    mask = mask_cpu if mask_kind == "host" else mask_cpu.to(DEV)
    spans = torch.from_numpy(spanhead.spans_from_mask(mask_cpu.numpy(), 0)) \
        if mask_kind == "device+spans" else None
    adv = torch.randn(N, device=DEV)
    h.requires_grad_(True)
    w.requires_grad_(True)

    def f(h, w, t, mask, spans, adv):
        out = sht.logprobs(h, w, t, loss_mask=mask, spans=spans, entropy=True)
        l1 = -(out.logprob * adv).sum() - 0.01 * out.entropy.sum()
        l2 = sht.weighted_logprob_loss(h, w, t, adv / N, loss_mask=mask, spans=spans)
        l3 = sht.linear_cross_entropy(h, w, t)
        return l1 + l2 + l3

    cf = torch.compile(f, fullgraph=True, backend=backend)
    res = []
    for fn in (cf, f):
        h.grad = w.grad = None
        y = fn(h, w, t, mask, spans, adv)
        y.backward()
        res.append((y.detach().float(), h.grad.float().clone(), w.grad.float().clone()))
    for name, a, b in zip(("loss", "dhidden", "dweight"), res[0], res[1]):
        err = (a - b).abs().max().item()
        tol = (1e-6 if backend == "aot_eager" else F32_TOL) * max(1.0, b.abs().max().item())
        if name != "loss":
            tol = max(tol, BF16_U * b.abs().max().item() if backend == "inductor" else tol)
        assert err <= tol, f"{backend} {mask_kind} {name}: max |diff| {err:.3e} > {tol:.3e}"


def test_autocast_cuda_bf16_master_weight():
    N, H, V = 200, 256, 7001
    h, w, t = make(22, N, H, V, torch.float32)
    h.requires_grad_(True)
    w.requires_grad_(True)
    g = torch.randn(N, device=DEV)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        lp = sht.logprobs(h, w, t)
    (lp * g).sum().backward()
    assert lp.dtype == torch.float32 and w.grad.dtype == torch.float32
    assert h.grad.dtype == torch.float32
    hb = h.detach().bfloat16().double()
    wb = w.detach().bfloat16().double()
    ref = dense(hb, wb, t)[0]
    err = (lp.double() - ref).abs().max().item()
    assert err <= F32_TOL * max(1.0, ref.abs().max().item()), f"logprob: {err:.3e}"


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_linear_cross_entropy_cuda(reduction):
    import torch.nn.functional as F
    N, H, V = 333, 128, 9001
    h, w, t = make(23, N, H, V, torch.float32)
    h.requires_grad_(True)
    w.requires_grad_(True)
    loss = sht.linear_cross_entropy(h, w, t, reduction=reduction, label_smoothing=0.1)
    loss.sum().backward()
    hd = h.detach().double().requires_grad_(True)
    wd = w.detach().double().requires_grad_(True)
    ref = F.cross_entropy(hd @ wd.T, t, reduction=reduction, label_smoothing=0.1)
    ref.sum().backward()
    for name, a, b in (("loss", loss, ref), ("dhidden", h.grad, hd.grad),
                       ("dweight", w.grad, wd.grad)):
        err = (a.double() - b.detach()).abs().max().item()
        assert err <= F32_TOL * max(1.0, b.abs().max().item()), f"{name}: {err:.3e}"
