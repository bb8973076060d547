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


@pytest.mark.parametrize("dtype,tol,gtol", [(torch.float32, 1e-4, 1e-3),
                                            (torch.bfloat16, 1e-2, 3e-2)])
@pytest.mark.parametrize("mask_kind", ["none", "host", "device", "device+spans"])
@pytest.mark.parametrize("N,H,V", [(1, 64, 1000), (257, 256, 8003), (1024, 512, 32000)])
def test_matches_dense(dtype, tol, gtol, mask_kind, N, H, V):
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
        assert err <= tol * max(1.0, want.abs().max().item()), f"{name}: max err {err:.3e}"
    if mask is not None:
        off = ~mask_cpu.to(DEV)
        assert torch.all(out.logprob[off] == 0) and torch.all(out.entropy[off] == 0)
    a, b = torch.randn(N, device=DEV), torch.randn(N, device=DEV)
    ((a * out.logprob).sum() + (b * out.entropy).sum() + 0.01 * out.lse.pow(2).sum()).backward()
    ((a.double() * ref[0]).sum() + (b.double() * ref[1]).sum() +
     0.01 * ref[2].pow(2).sum()).backward()
    for name, got, want in (("dhidden", h.grad, hd.grad), ("dweight", w.grad, wd.grad)):
        err = (got.double() - want).abs().max().item()
        assert err <= gtol * max(1.0, want.abs().max().item()), f"{name}: max err {err:.3e}"
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
