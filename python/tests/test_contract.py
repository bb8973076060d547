"""The head's appended outputs of issue 25 (sum_p2 = sum_j p_ij^2 per active row) through the
NumPy and torch front ends, against float64 dense computations written here (logits
materialized, softmax, squares summed), on the float64 reference and the default CPU kernels:
masks (inactive rows exactly 0), sample support, temperature and softcap, awkward shapes,
poisoned output buffers, no gradient, the bad inputs (dtype, shape); on CUDA the values and
the refusal with candidates (skipped without a device)."""

import numpy as np
import pytest

import spanhead
from conftest import run_or_skip

TOL = 2e-5  # float32 arithmetic on O(1) values (tests/tolerances.h TOL_CPU_F32)


def dense_sum_p2(h, w, T, cap, active, cand=None):
    """Independent float64: z = (cap tanh(u / cap) if cap else u) / T, p = softmax, sum p^2."""
    u = h.astype(np.float64) @ w.astype(np.float64).T
    z = (cap * np.tanh(u / cap) if cap else u) / T
    if cand is not None:
        keep = np.zeros_like(z, dtype=bool)
        for i, row in enumerate(cand):
            keep[i, row[row >= 0]] = True
        z = np.where(keep, z, -np.inf)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return np.where(active, (p * p).sum(1), 0.0)


def nw(got, ref):
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("shape", [(37, 19, 613), (5, 3, 7), (64, 33, 1001)])
@pytest.mark.parametrize("T,cap", [(1.0, 0.0), (0.6, 2.5)])
def test_numpy_sum_p2(ctx, rng, shape, T, cap):
    N, H, V = shape
    h = rng.standard_normal((N, H)).astype(np.float32)
    w = (rng.standard_normal((V, H)) * 2.5 / np.sqrt(H)).astype(np.float32)
    t = rng.integers(0, V, N).astype(np.int64)
    mask = (rng.random(N) < 0.6).astype(np.uint8)
    mask[0], mask[-1] = 1, 0  # at least one active and one inactive row
    out = np.full(N, np.nan, np.float32)
    r = run_or_skip(ctx, spanhead.head_forward, h, w, t, active_mask=mask, temperature=T,
                    softcap=cap, sum_p2=out)
    assert r.sum_p2 is out
    ref = dense_sum_p2(h, w, T, cap, mask.astype(bool))
    assert np.all(out[mask == 0] == 0)
    assert nw(out, ref) <= TOL, nw(out, ref)
    # allocated (True) the same; absent by default
    r2 = run_or_skip(ctx, spanhead.head_forward, h, w, t, active_mask=mask, temperature=T,
                     softcap=cap, sum_p2=True)
    assert r2.sum_p2.dtype == np.float32 and np.array_equal(r2.sum_p2, out)
    assert run_or_skip(ctx, spanhead.head_forward, h, w, t).sum_p2 is None


def test_numpy_sum_p2_support_and_one_pass(ctx, rng):
    N, H, V, K = 23, 11, 97, 6
    h = rng.standard_normal((N, H)).astype(np.float32)
    w = (rng.standard_normal((V, H)) * 0.8).astype(np.float32)
    cand = np.full((N, K), -1, np.int64)
    t = np.zeros(N, np.int64)
    for i in range(N):
        k = int(rng.integers(1, K + 1))
        cand[i, :k] = rng.choice(V, size=k, replace=False)
        t[i] = cand[i, 0]
    r = run_or_skip(ctx, spanhead.head_forward, h, w, t, candidates=cand, sum_p2=True,
                    temperature=0.7)
    ref = dense_sum_p2(h, w, 0.7, 0.0, np.ones(N, bool), cand)
    assert nw(r.sum_p2, ref) <= TOL
    # one-pass (gradients in the same sweep) gives the same sum_p2
    g = rng.standard_normal(N).astype(np.float32)
    r1 = run_or_skip(ctx, spanhead.head_forward, h, w, t, candidates=cand, sum_p2=True,
                     temperature=0.7, dlogprob=g, dhidden=True, dweight=True)
    assert nw(r1.sum_p2, ref) <= TOL


def test_numpy_sum_p2_bad(ctx, rng):
    h = rng.standard_normal((6, 4)).astype(np.float32)
    w = rng.standard_normal((9, 4)).astype(np.float32)
    t = rng.integers(0, 9, 6).astype(np.int64)
    with pytest.raises(spanhead.DTypeError, match="sum_p2"):
        spanhead.head_forward(h, w, t, sum_p2=np.zeros(6, np.float64), context=ctx)
    with pytest.raises(spanhead.ShapeError, match="sum_p2"):
        spanhead.head_forward(h, w, t, sum_p2=np.zeros(7, np.float32), context=ctx)
    lse = np.full(6, np.nan, np.float32)
    with pytest.raises(spanhead.Error, match="sum_p2"):  # the same memory as lse
        spanhead.head_forward(h, w, t, lse=lse, sum_p2=lse, context=ctx)
    assert np.all(np.isnan(lse))  # nothing written


def test_torch_sum_p2(kernel, rng):
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    N, H, V = 41, 24, 517
    h = torch.from_numpy(rng.standard_normal((N, H)).astype(np.float32)).requires_grad_()
    w = torch.from_numpy((rng.standard_normal((V, H)) * 0.4).astype(np.float32)).requires_grad_()
    t = torch.from_numpy(rng.integers(0, V, N).astype(np.int64))
    mask = torch.from_numpy(rng.random(N) < 0.7)
    out = sht.logprobs(h, w, t, loss_mask=mask, temperature=0.8, sum_p2=True, **kernel)
    assert out.sum_p2.dtype == torch.float32 and not out.sum_p2.requires_grad
    z = (h.detach().double() @ w.detach().double().T) / 0.8
    ref = torch.where(mask, (torch.softmax(z, 1) ** 2).sum(1), torch.zeros(N, dtype=z.dtype))
    assert torch.all(out.sum_p2[~mask] == 0)
    err = float((out.sum_p2.double() - ref).abs().max() / ref.abs().max())
    assert err <= TOL, err
    # the log-prob gradient is unchanged by asking for sum_p2
    out.logprob.sum().backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    sht.logprobs(h, w, t, loss_mask=mask, temperature=0.8, **kernel).sum().backward()
    assert torch.equal(gh, h.grad) and torch.equal(gw, w.grad)
    # not requested: None; only sum_p2 requested: a HeadOutputs
    assert sht.logprobs(h, w, t, lse=True, **kernel).sum_p2 is None
    only = sht.logprobs(h, w, t, temperature=0.8, sum_p2=True, **kernel)  # no mask: all rows
    ref_all = (torch.softmax(z, 1) ** 2).sum(1)
    assert only.sum_p2.shape == t.shape
    assert float((only.sum_p2.double() - ref_all).abs().max() / ref_all.abs().max()) <= TOL


def test_sum_p2_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the CUDA path is covered by tests/gpu/test_head_cuda_contract.c")
    import spanhead.torch as sht
    g = torch.Generator().manual_seed(25)
    h = torch.randn(70, 64, generator=g).cuda()
    w = (torch.randn(613, 64, generator=g) * 0.3).cuda()
    t = torch.randint(0, 613, (70,), generator=g).cuda()
    out = sht.logprobs(h, w, t, temperature=0.7, sum_p2=True)
    z = (h.double() @ w.double().T) / 0.7
    ref = (torch.softmax(z, 1) ** 2).sum(1)
    assert float((out.sum_p2.double() - ref).abs().max() / ref.abs().max()) <= 5e-5
    # with candidates: over the support (the sample kernel's (m, q), head_extras' finalize)
    rows = []
    for i in range(70):
        others = [int(v) for v in torch.randperm(613, generator=g)[:6] if int(v) != int(t[i])]
        rows.append([int(t[i])] + others[:4])
    cand = torch.tensor(rows, dtype=torch.int64).cuda()
    out = sht.logprobs(h, w, t, candidates=cand, sum_p2=True, temperature=0.7)
    zc = torch.gather(z, 1, cand)
    ref = (torch.softmax(zc, 1) ** 2).sum(1)
    assert float((out.sum_p2.double() - ref).abs().max() / ref.abs().max()) <= 5e-5
