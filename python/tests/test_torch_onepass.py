"""spanhead.torch.weighted_logprob_loss (one-pass mode) on the CPU against the two-pass path
(logprobs() + autograd) and a float64 dense PyTorch reference (skipped without torch; the
CUDA half runs with test_torch_cuda.py's machinery on the GPU machine)."""

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import spanhead  # noqa: E402
import spanhead.torch as sht  # noqa: E402


def dense_loss(h, w, t, weights, mask, temperature, softcap, coef):
    """float64: the full logits, log_softmax, the weighted loss over active rows."""
    u = h.double() @ w.double().T
    z = (softcap * torch.tanh(u / softcap) if softcap else u) / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    valid = (t >= 0).double()
    lp = logp_all.gather(-1, t.clamp(min=0).unsqueeze(-1)).squeeze(-1) * valid
    ent = -(logp_all.exp() * logp_all).sum(-1)
    m = torch.ones_like(lp) if mask is None else mask.double()
    lp, ent = lp * m, ent * m
    return -(weights.double() * lp).sum() - coef * ent.sum(), lp, ent


def make(seed, shape, H, V, dtype):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*shape, H, generator=g).to(dtype)
    w = (torch.randn(V, H, generator=g) * 2.5 / H ** 0.5).to(dtype)
    t = torch.randint(0, V, shape, generator=g)
    t.view(-1)[::5] = -100                                  # ignored targets
    weights = torch.randn(*shape, generator=g)              # e.g. advantages, both signs
    return h, w, t, weights


def rel(got, want):
    return (got.double() - want.double()).abs().max().item() / max(
        1.0, want.double().abs().max().item())


# Tolerances from the arithmetic (issue 20): per-row outputs and the loss are float32 arithmetic
# on the inputs as given (bf16 products are exact in fp32); bf16 gradients carry the rounding of
# dlogits to bf16 before the gradient products and of the result: a few units of 2**-8 of the
# gradient's scale (the elementwise GEMM bound is checked in test_torch.py / test_head.py).
@pytest.mark.parametrize("dtype,tol,gtol", [(torch.float32, 2e-5, 2e-5),
                                            (torch.bfloat16, 2e-5, 4 * 2.0 ** -8)])
@pytest.mark.parametrize("temperature,softcap", [(1.0, 0.0), (0.7, 4.0)])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("coef", [0.0, 0.37])
def test_matches_two_pass_and_dense(rng, kernel, dtype, tol, gtol, temperature, softcap,
                                    masked, coef):
    shape, H, V = (3, 13), 40, 157                          # awkward sizes, leading dims
    h, w, t, weights = make(int(rng.integers(1 << 30)), shape, H, V, dtype)
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(
        int(rng.integers(1 << 30)))) < 0.6 if masked else None
    if masked:
        weights = torch.where(mask, weights, torch.full_like(weights, 1e6))  # no effect
    g_out = float(rng.uniform(-2.0, 2.0))                   # grad_output != 1
    common = dict(loss_mask=mask, temperature=temperature, softcap=softcap, **kernel)

    # one pass
    h1 = h.clone().requires_grad_(True)
    w1 = w.clone().requires_grad_(True)
    out = sht.weighted_logprob_loss(h1, w1, t, weights, entropy_coef=coef,
                                    return_logprobs=True, return_entropy=True, **common)
    assert out.loss.dim() == 0 and out.loss.dtype == torch.float32
    assert out.logprob.shape == shape and not out.logprob.requires_grad
    assert out.entropy.shape == shape and not out.entropy.requires_grad
    (g_out * out.loss).backward()

    # two passes: logprobs() then the same weighted sum through autograd
    h2 = h.clone().requires_grad_(True)
    w2 = w.clone().requires_grad_(True)
    o2 = sht.logprobs(h2, w2, t, entropy=True, **common)
    loss2 = -(weights * o2.logprob).sum() - coef * o2.entropy.sum()
    (g_out * loss2).backward()

    # float64 dense reference
    hd = h.detach().double().requires_grad_(True)
    wd = w.detach().double().requires_grad_(True)
    ld, lpd, entd = dense_loss(hd, wd, t, weights, mask, temperature, softcap, coef)
    (g_out * ld).backward()

    n_terms = max(1.0, weights.abs().masked_fill(~mask if masked else
                                                 torch.zeros_like(t, dtype=torch.bool),
                                                 0).sum().item())
    # the loss is a sum of ~N terms: relative to the sum of |weights| (the scale of the error)
    lt = tol * n_terms * max(1.0, lpd.abs().max().item()) + tol * coef * entd.abs().sum().item()
    assert abs(out.loss.item() - ld.item()) <= lt, (out.loss.item(), ld.item())
    # the same kernels give the same per-row values: only the float32 sums' rounding differs
    scale = (weights * o2.logprob).abs().sum().item() + coef * o2.entropy.abs().sum().item()
    assert abs(out.loss.item() - loss2.item()) <= 1e-5 * scale + 1e-6, \
        (out.loss.item(), loss2.item())
    assert rel(out.logprob, lpd) <= tol and rel(out.entropy, entd) <= tol
    assert torch.equal(out.logprob, o2.logprob.detach())   # same kernels, same sweep order
    if masked:
        assert torch.all(out.logprob[~mask] == 0) and torch.all(out.entropy[~mask] == 0)
    assert torch.all(out.logprob[t < 0] == 0)
    for name, got, two, want, like in (("dhidden", h1.grad, h2.grad, hd.grad, h),
                                       ("dweight", w1.grad, w2.grad, wd.grad, w)):
        assert got is not None and got.dtype == like.dtype and got.shape == like.shape
        assert torch.isfinite(got).all(), name
        assert rel(got, want) <= gtol, f"{name} vs dense: {rel(got, want)}"
        assert rel(got, two) <= gtol, f"{name} vs two-pass: {rel(got, two)}"
    if masked:
        assert torch.all(h1.grad[~mask] == 0)


def test_weights_gradient_scalar_weights_and_frozen_weight(rng, kernel):
    shape, H, V = (29,), 24, 71
    h, w, t, adv = make(int(rng.integers(1 << 30)), shape, H, V, torch.float32)
    # a differentiable weighting: dL/dweights = -logprob; weight frozen (no dweight)
    h1 = h.clone().requires_grad_(True)
    a = adv.clone().requires_grad_(True)
    out = sht.weighted_logprob_loss(h1, w, t, a, return_logprobs=True, **kernel)
    assert out.entropy is None
    (-3.0 * out.loss).backward()
    assert torch.allclose(a.grad, 3.0 * out.logprob, rtol=0, atol=0)
    hd = h.double().requires_grad_(True)
    ld, _, _ = dense_loss(hd, w, t, adv, None, 1.0, 0.0, 0.0)
    (-3.0 * ld).backward()
    assert rel(h1.grad, hd.grad) <= 2e-5
    # SFT: a number as the weight of every token (the mean NLL over valid targets)
    n = int((t >= 0).sum())
    h2 = h.clone().requires_grad_(True)
    w2 = w.clone().requires_grad_(True)
    loss = sht.weighted_logprob_loss(h2, w2, t, 1.0 / n, **kernel)
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0
    ref = torch.nn.functional.cross_entropy(h.double() @ w.double().T, t, ignore_index=-100)
    assert abs(loss.item() - ref.item()) <= 2e-5 * max(1.0, ref.item())
    loss.backward()
    h3 = h.clone().requires_grad_(True)
    w3 = w.clone().requires_grad_(True)
    torch.nn.functional.cross_entropy(h3 @ w3.T, t, ignore_index=-100).backward()
    assert rel(h2.grad, h3.grad) <= 2e-5 and rel(w2.grad, w3.grad) <= 2e-5


def test_spans_device_mask_and_no_grad(rng, kernel):
    N, H, V = 40, 16, 33
    h, w, t, adv = make(int(rng.integers(1 << 30)), (N,), H, V, torch.float32)
    m = np.zeros(N, np.uint8)
    m[3:11] = m[20:21] = m[30:38] = 1
    sp = spanhead.spans_from_mask(m)
    hs = h.clone().requires_grad_(True)
    a = sht.weighted_logprob_loss(hs, w, t, adv, loss_mask=torch.from_numpy(m).bool(),
                                  spans=sp, **kernel)          # mask + explicit spans
    a.backward()
    hn = h.clone().requires_grad_(True)
    b = sht.weighted_logprob_loss(hn, w, t, adv, loss_mask=m, **kernel)   # numpy mask
    b.backward()
    assert a.item() == b.item() and torch.equal(hs.grad, hn.grad)
    assert torch.all(hs.grad[torch.from_numpy(m) == 0] == 0)
    ld, _, _ = dense_loss(h, w, t, adv, torch.from_numpy(m), 1.0, 0.0, 0.0)
    assert abs(a.item() - ld.item()) <= 1e-4 * max(1.0, abs(ld.item()))
    with torch.no_grad():                                       # no gradients wanted
        c = sht.weighted_logprob_loss(h.clone().requires_grad_(True), w, t, adv, loss_mask=m,
                                      **kernel)
    assert not c.requires_grad and c.item() == a.item()


def test_bad_input_and_second_backward():
    h = torch.randn(6, 8, requires_grad=True)
    w = torch.randn(11, 8, requires_grad=True)
    t = torch.randint(0, 11, (6,))
    with pytest.raises(spanhead.ShapeError, match="weights: shape is \\(5,\\)"):
        sht.weighted_logprob_loss(h, w, t, torch.ones(5))
    with pytest.raises(ValueError, match="weights"):
        sht.weighted_logprob_loss(h, w, t, torch.ones(6, 1))
    with pytest.raises(spanhead.DTypeError, match="weights: dtype"):
        sht.weighted_logprob_loss(h, w, t, torch.ones(6, dtype=torch.int64))
    with pytest.raises(TypeError, match="weights"):
        sht.weighted_logprob_loss(h, w, t, "1")
    with pytest.raises(spanhead.InvalidArgumentError, match="targets"):
        sht.weighted_logprob_loss(h, w, None, torch.ones(6))
    with pytest.raises(spanhead.InvalidArgumentError, match="entropy_coef"):
        sht.weighted_logprob_loss(h, w, t, torch.ones(6), entropy_coef=float("nan"))
    with pytest.raises(spanhead.ShapeError, match="loss_mask"):
        sht.weighted_logprob_loss(h, w, t, torch.ones(6), loss_mask=torch.ones(7))
    with pytest.raises(spanhead.DTypeError, match="float64"):
        sht.weighted_logprob_loss(h.double(), w.double(), t, torch.ones(6))
    with pytest.raises(spanhead.InvalidArgumentError, match="temperature"):
        sht.weighted_logprob_loss(h, w, t, torch.ones(6), temperature=0.0)
    loss = sht.weighted_logprob_loss(h, w, t, torch.ones(6))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


# ---- CUDA (skipped without a GPU; scripts/device/python_gpu.sh runs the whole suite) ------

_CUDA = torch.cuda.is_available() and spanhead.cuda_device_count() > 0
cuda = pytest.mark.skipif(not _CUDA, reason="no CUDA device visible to torch and libspanhead")


@cuda
@pytest.mark.parametrize("dtype,tol,gtol", [(torch.float32, 5e-5, 5e-5),
                                            (torch.bfloat16, 5e-5, 6 * 2.0 ** -8)])
@pytest.mark.parametrize("mask_kind", ["none", "host", "device", "device+spans"])
@pytest.mark.parametrize("N,H,V", [(1, 64, 1000), (257, 256, 8003), (1024, 512, 32000)])
def test_cuda_matches_two_pass_and_dense(dtype, tol, gtol, mask_kind, N, H, V):
    dev = torch.device("cuda", 0)
    h, w, t, adv = make(N * 7 + V, (N,), H, V, dtype)
    h, w, t, adv = h.to(dev), w.to(dev), t.to(dev), adv.to(dev)
    mask_cpu = torch.rand(N, generator=torch.Generator().manual_seed(N + H)) < 0.4
    mask = {"none": None, "host": mask_cpu, "device": mask_cpu.to(dev),
            "device+spans": mask_cpu.to(dev)}[mask_kind]
    spans = spanhead.spans_from_mask(mask_cpu.numpy(), 16) if mask_kind == "device+spans" \
        else None
    kw = dict(loss_mask=mask, spans=spans, temperature=0.9, softcap=20.0)
    coef, g_out = 0.05, -1.3
    h1, w1 = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    out = sht.weighted_logprob_loss(h1, w1, t, adv, entropy_coef=coef, return_logprobs=True,
                                    return_entropy=True, **kw)
    assert out.loss.device == dev and out.logprob.device == dev
    (g_out * out.loss).backward()
    h2, w2 = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    o2 = sht.logprobs(h2, w2, t, entropy=True, **kw)
    (g_out * (-(adv * o2.logprob).sum() - coef * o2.entropy.sum())).backward()
    hd = h.detach().double().requires_grad_(True)
    wd = w.detach().double().requires_grad_(True)
    ld, lpd, entd = dense_loss(hd, wd, t, adv, None if mask is None else mask_cpu.to(dev),
                               0.9, 20.0, coef)
    (g_out * ld).backward()
    assert rel(out.logprob, lpd) <= tol and rel(out.entropy, entd) <= tol
    scale = (adv.double() * lpd).abs().sum().item() + coef * entd.abs().sum().item()
    assert abs(out.loss.item() - ld.item()) <= tol * max(1.0, scale), (out.loss, ld)
    for name, got, two, want in (("dhidden", h1.grad, h2.grad, hd.grad),
                                 ("dweight", w1.grad, w2.grad, wd.grad)):
        assert got.dtype == dtype and torch.isfinite(got).all(), name
        assert rel(got, want) <= gtol, f"{name} vs dense: {rel(got, want):.3e}"
        assert rel(got, two) <= gtol, f"{name} vs two-pass: {rel(got, two):.3e}"


@cuda
def test_cuda_graph_capture_and_no_host_sync():
    dev = torch.device("cuda", 0)
    N, H, V = 512, 256, 4099
    h, w, t, adv = make(23, (N,), H, V, torch.bfloat16)
    h, w, t, adv = h.to(dev), w.to(dev), t.to(dev), adv.to(dev)
    mask_cpu = torch.rand(N, generator=torch.Generator().manual_seed(3)) < 0.5
    mask = mask_cpu.to(dev)
    spans = spanhead.spans_from_mask(mask_cpu.numpy(), 8)
    h.requires_grad_(True)
    w.requires_grad_(True)

    def step(hh, ww):
        out = sht.weighted_logprob_loss(hh, ww, t, adv, loss_mask=mask, spans=spans,
                                        entropy_coef=0.01, return_logprobs=True)
        out.loss.backward()
        return out

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on the capture stream creates its context
        for _ in range(2):
            h.grad = w.grad = None
            step(h, w)
    torch.cuda.synchronize()
    # no host synchronization: the step returns while ~1 s of GPU work is queued ahead
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(s):
            torch.cuda._sleep(2_000_000_000)
            h.grad = w.grad = None
            step(h, w)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    assert time.perf_counter() - t1 > 0.2, "the step synchronized with the GPU"
    g = torch.cuda.CUDAGraph()
    h.grad = w.grad = None
    with torch.cuda.graph(g, stream=s):
        static = step(h, w)
    for _ in range(2):
        with torch.no_grad():  # new inputs in place, then replay
            h.copy_(torch.randn_like(h, dtype=torch.float32).to(h.dtype))
            adv.copy_(torch.randn_like(adv))
        g.replay()
        torch.cuda.synchronize()
        got = (static.loss.clone(), static.logprob.clone(), h.grad.clone(), w.grad.clone())
        he = h.detach().clone().requires_grad_(True)
        we = w.detach().clone().requires_grad_(True)
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # the same stream, so the same spanhead context
            eager = step(he, we)
        torch.cuda.synchronize()
        assert torch.equal(got[0], eager.loss) and torch.equal(got[1], eager.logprob)
        assert torch.equal(got[2], he.grad) and torch.equal(got[3], we.grad)


# ---- tensor parallelism over MPI (skipped without mpi4py, mpirun or an MPI library) -------

_TP_WORKER = r'''
import sys
import numpy as np
import torch
from mpi4py import MPI
import spanhead
import spanhead.torch as sht

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
try:
    g = torch.Generator().manual_seed(int(sys.argv[1]))     # same inputs on every rank
    N, H, V, T, coef = 37, 12, 101, 0.8, 0.2
    h = torch.randn(N, H, generator=g)
    w = torch.randn(V, H, generator=g) * 0.7
    t = torch.randint(0, V, (N,), generator=g)
    t[::6] = -100
    mask = torch.rand(N, generator=g) < 0.7
    adv = torch.randn(N, generator=g)
    bounds = np.linspace(0, V, size + 1).astype(int)        # uneven shards
    v0, v1 = int(bounds[rank]), int(bounds[rank + 1])
    sc = spanhead.Comm.from_mpi4py(comm, vocab_total=V, vocab_start=v0, vocab_local=v1 - v0,
                                   dtype="float32", temperature=T)
    hl = h.clone().requires_grad_(True)
    wl = w[v0:v1].clone().requires_grad_(True)
    out = sht.weighted_logprob_loss(hl, wl, t, adv, loss_mask=mask, temperature=T,
                                    entropy_coef=coef, tp_group=sc, vocab_start=v0,
                                    vocab_total=V, return_logprobs=True, threads=1)
    (1.5 * out.loss).backward()
    hd = h.double().requires_grad_(True)
    wd = w.double().requires_grad_(True)
    lsm = torch.log_softmax(hd @ wd.T / T, -1)
    m = mask.double()
    lp = lsm.gather(-1, t.clamp(min=0).unsqueeze(-1)).squeeze(-1) * m * (t >= 0).double()
    ent = -(lsm.exp() * lsm).sum(-1) * m
    loss = -(adv.double() * lp).sum() - coef * ent.sum()
    (1.5 * loss).backward()

    def check(name, got, want, tol=2e-5):
        err = (got.double() - want.double()).abs().max().item()
        lim = tol * max(1.0, want.abs().max().item())
        assert err <= lim, f"rank {rank} {name}: max err {err:.3e} > {lim:.3e}"

    check("loss", out.loss.reshape(1), loss.detach().reshape(1), 2e-5 * N)
    check("logprob", out.logprob, lp.detach())
    check("dhidden (all-reduced)", hl.grad, hd.grad)
    check("dweight (shard)", wl.grad, wd.grad[v0:v1])
    losses = comm.allgather(out.loss.item())
    assert len(set(losses)) == 1, f"the loss differs across ranks: {losses}"
    comm.Barrier()
    if rank == 0:
        print(f"onepass tp ok: {size} ranks")
except Exception as exc:  # report, then make every rank stop
    print(f"rank {rank}: {type(exc).__name__}: {exc}", flush=True)
    comm.Abort(1)
'''


@pytest.mark.parametrize("np_", [2, 3])
def test_tp_over_mpi(rng, tmp_path, np_):
    import os
    import shutil
    import subprocess
    import sys
    pytest.importorskip("mpi4py")
    if "sph_comm_create_mpi" in spanhead.missing_functions():
        pytest.skip("the loaded libspanhead has no MPI communicator")
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if not mpirun:
        pytest.skip("no mpirun on PATH")
    worker = tmp_path / "onepass_tp_worker.py"
    worker.write_text(_TP_WORKER)
    env = dict(os.environ, OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="self,vader",
               OMPI_MCA_btl_vader_single_copy_mechanism="none",
               OMPI_MCA_btl_base_warn_component_unused="0", OMP_NUM_THREADS="1")
    p = subprocess.run([mpirun, "--oversubscribe", "--allow-run-as-root", "-np", str(np_),
                        sys.executable, str(worker), str(int(rng.integers(1 << 31)))],
                       capture_output=True, text=True, timeout=240, env=env)
    if p.returncode != 0 and "built without MPI" in p.stdout + p.stderr:
        pytest.skip("the loaded libspanhead was built without MPI")
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"onepass tp ok: {np_} ranks" in p.stdout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("g_out", [1.0, 0.0, -3.25])
def test_backward_scales_stored_gradients(rng, dtype, g_out):
    """The eager backward hands over the forward's gradients times the upstream gradient in
    one library call (sph_scale_inplace): exactly the stored ones when it is 1 (a plain
    loss.backward(): nothing read or written), zeros for 0, and the product rounded once
    otherwise, against the same gradients taken with grad_output 1 and scaled here."""
    shape, H, V = (2, 9), 24, 131
    h, w, t, weights = make(int(rng.integers(1 << 30)), shape, H, V, dtype)
    grads = []
    for g in (1.0, g_out):
        hg, wg = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
        loss = sht.weighted_logprob_loss(hg, wg, t, weights)
        loss.backward(torch.tensor(g)) if g != 1.0 else loss.backward()
        grads.append((hg.grad, wg.grad))
    (h1, w1), (hs, ws) = grads
    for one, got in ((h1, hs), (w1, ws)):
        want = (one.float() * g_out).to(dtype)
        assert got.dtype == dtype
        assert torch.equal(got, want), (g_out, (got.float() - want.float()).abs().max())
