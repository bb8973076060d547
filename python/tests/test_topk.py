"""The head's top-k outputs of issue 25 (topk_ids int64 (N, K) and topk_logprobs float32
(N, K): the K most probable ids of every active row, descending, ties the lower id first)
through the NumPy and torch front ends, against a float64 full sort written here (logits
materialized, sorted by (-z, id), log-probs z - lse), on the float64 reference and the default
CPU kernels: masks (inactive rows (-1, 0)), exact ties (equal weight rows), temperature and
softcap, K = 1 / 64 / V, poisoned given buffers, one-pass, no gradient, the bad inputs (K = 0,
257, > V, one tensor alone, dtypes, aliasing, candidates); on CUDA the values (skipped without
a device)."""

import numpy as np
import pytest

import spanhead
from conftest import run_or_skip

TOL = 2e-5  # float32 arithmetic on O(1) values (tests/tolerances.h TOL_CPU_F32)


def oracle(h, w, T, cap):
    """float64 z sorted best first (ties: the lower id) and lse, per row."""
    # equal weight rows get bitwise equal logits: the product over the distinct rows only (a
    # BLAS may round a column in its remainder loop differently from the same column in its
    # main loop: on the device image OpenBLAS split the exact tie of ids 17 and 299, run 31)
    wu, inv = np.unique(w.astype(np.float64), axis=0, return_inverse=True)
    u = (h.astype(np.float64) @ wu.T)[:, inv.reshape(-1)]
    z = (cap * np.tanh(u / cap) if cap else u) / T
    m = z.max(1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(1, keepdims=True)))[:, 0]
    # a stable sort of -z: equal z keep the lower id first (np.lexsort over a broadcast id
    # array put the higher id first on NumPy 2.5.2, the device image's, at exact ties)
    order = np.argsort(-z, axis=1, kind="stable")
    return order, np.take_along_axis(z, order, 1) - lse[:, None]


def check(ids, lp, h, w, T, cap, active, K, gap=1e-4):
    order, ref = oracle(h, w, T, cap)
    assert ids.dtype == np.int64 and lp.dtype == np.float32 and ids.shape == lp.shape
    assert np.all(ids[~active] == -1) and np.all(lp[~active] == 0)
    a = np.flatnonzero(active)
    err = np.abs(lp[a] - ref[a, :K]).max()
    assert err <= TOL * (1 + np.abs(ref[a, :K]).max()), err
    V = ref.shape[1]
    r = ref[a]
    sep = np.ones((len(a), K), bool)
    sep[:, 1:] &= (r[:, :K - 1] - r[:, 1:K]) > gap
    if K < V:
        sep &= (r[:, :K] - r[:, 1:K + 1]) > gap
    tie = np.zeros((len(a), K), bool)  # exact ties in float64: lower id first
    tie[:, 1:] |= r[:, :K - 1] == r[:, 1:K]
    if K < V:
        tie |= r[:, :K] == r[:, 1:K + 1]
    must = sep | tie if gap < 1e-6 else sep
    wrong = (ids[a] != order[a, :K]) & must
    assert not wrong.any(), np.argwhere(wrong)[:5]
    for row in ids[a]:
        assert len(set(row.tolist())) == K and row.min() >= 0 and row.max() < V


def case(rng, N, H, V, ties=True):
    h = rng.standard_normal((N, H)).astype(np.float32)
    w = (rng.standard_normal((V, H)) * 2.5 / np.sqrt(H)).astype(np.float32)
    if ties:  # equal weight rows, scaled up into the top: exact ties
        for a, b in ((5, 6), (17, V - 1), (40, V // 2)):
            if max(a, b) < V and a != b:
                w[a] *= 2.5
                w[b] = w[a]
    t = rng.integers(0, V, N).astype(np.int64)
    mask = (rng.random(N) < 0.6).astype(np.uint8)
    mask[0], mask[-1] = 1, 0
    return h, w, t, mask


@pytest.mark.parametrize("shape,K", [((37, 19, 613), 64), ((5, 3, 7), 7), ((29, 33, 1001), 1),
                                     ((23, 16, 300), 256)])
@pytest.mark.parametrize("T,cap", [(1.0, 0.0), (0.6, 2.5)])
def test_numpy_topk(ctx, rng, shape, K, T, cap):
    N, H, V = shape
    h, w, t, mask = case(rng, N, H, V)
    r = run_or_skip(ctx, spanhead.head_forward, h, w, t, active_mask=mask, temperature=T,
                    softcap=cap, topk=K, lse=True)
    gap = 1e-9 if ctx.kind == "ref" else 1e-4
    check(r.topk_ids, r.topk_logprobs, h, w, T, cap, mask.astype(bool), K, gap)
    # the same numbers logprob gives for the target where it is listed
    hit = (r.topk_ids == t[:, None]) & mask.astype(bool)[:, None]
    rows, cols = np.nonzero(hit)
    assert np.allclose(r.topk_logprobs[rows, cols], r.logprob[rows], rtol=1e-6, atol=1e-6)
    # given (poisoned) buffers are used as they are; absent by default
    ids = np.full((N, K), 12345, np.int64)
    lp = np.full((N, K), np.nan, np.float32)
    r2 = run_or_skip(ctx, spanhead.head_forward, h, w, t, active_mask=mask, temperature=T,
                     softcap=cap, topk_ids=ids, topk_logprobs=lp)
    assert r2.topk_ids is ids and r2.topk_logprobs is lp
    assert np.array_equal(ids, r.topk_ids) and np.array_equal(lp, r.topk_logprobs)
    r3 = run_or_skip(ctx, spanhead.head_forward, h, w, t)
    assert r3.topk_ids is None and r3.topk_logprobs is None


def test_numpy_topk_one_pass(ctx, rng):
    N, H, V, K = 31, 12, 301, 20
    h, w, t, mask = case(rng, N, H, V)
    g = rng.standard_normal(N).astype(np.float32)
    r = run_or_skip(ctx, spanhead.head_forward, h, w, t, active_mask=mask, topk=K, dlogprob=g,
                    dhidden=True, dweight=True)
    check(r.topk_ids, r.topk_logprobs, h, w, 1.0, 0.0, mask.astype(bool), K,
          1e-9 if ctx.kind == "ref" else 1e-4)
    assert r.dhidden is not None


def test_numpy_topk_bad(ctx, rng):
    h, w, t, _ = case(rng, 6, 4, 9, ties=False)
    # K out of [1, 256] is judged before any allocation (2**40 would ask NumPy for 296 TiB);
    # K = 10 > the 9 columns is the library's verdict
    for k, err in ((0, None), (-1, spanhead.InvalidArgumentError),
                   (257, spanhead.InvalidArgumentError), (2 ** 40, spanhead.InvalidArgumentError),
                   (10, spanhead.ShapeError)):
        if err is None:
            assert spanhead.head_forward(h, w, t, topk=k, context=ctx).topk_ids is None
            continue
        with pytest.raises(err, match="topk"):
            spanhead.head_forward(h, w, t, topk=k, context=ctx)
    ids, lp = np.full((6, 3), 7, np.int64), np.full((6, 3), np.nan, np.float32)
    with pytest.raises(spanhead.InvalidArgumentError, match="topk_logprobs"):
        spanhead.head_forward(h, w, t, topk_ids=ids, context=ctx)
    with pytest.raises(spanhead.InvalidArgumentError, match="topk_ids"):
        spanhead.head_forward(h, w, t, topk_logprobs=lp, context=ctx)
    with pytest.raises(spanhead.DTypeError, match="topk_ids"):
        spanhead.head_forward(h, w, t, topk_ids=ids.astype(np.int32), topk_logprobs=lp,
                              context=ctx)
    with pytest.raises(spanhead.DTypeError, match="topk_logprobs"):
        spanhead.head_forward(h, w, t, topk_ids=ids, topk_logprobs=lp.astype(np.float64),
                              context=ctx)
    with pytest.raises(spanhead.ShapeError, match="topk_logprobs"):
        spanhead.head_forward(h, w, t, topk_ids=ids, topk_logprobs=np.zeros((6, 4), np.float32),
                              context=ctx)
    lse = np.full((6, 3), np.nan, np.float32)  # lse's memory is also the log-probs'
    with pytest.raises(spanhead.Error, match="topk_logprobs"):
        spanhead.head_forward(h, w, t, lse=lse.reshape(-1)[:6], topk_ids=ids,
                              topk_logprobs=lse, context=ctx)
    assert np.all(np.isnan(lse)) and np.all(ids == 7)  # nothing written
    cand = np.stack([np.arange(3)] * 6).astype(np.int64)
    with pytest.raises(spanhead.InvalidArgumentError, match="candidates"):
        spanhead.head_forward(h, w, t % 3, candidates=cand, topk=2, context=ctx)


def test_torch_topk(kernel, rng):
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    N, H, V, K = 41, 24, 517, 64
    hn, wn, tn, mn = case(rng, N, H, V)
    h = torch.from_numpy(hn).requires_grad_()
    w = torch.from_numpy(wn).requires_grad_()
    t = torch.from_numpy(tn)
    mask = torch.from_numpy(mn.astype(bool))
    out = sht.logprobs(h, w, t, loss_mask=mask, temperature=0.8, topk=K, **kernel)
    assert isinstance(out, sht.HeadOutputsTopK) and out.sum_p2 is None
    assert out.topk_ids.dtype == torch.int64 and out.topk_logprobs.dtype == torch.float32
    assert out.topk_ids.shape == (N, K) and not out.topk_logprobs.requires_grad
    check(out.topk_ids.numpy(), out.topk_logprobs.numpy(), hn, wn, 0.8, 0.0, mn.astype(bool), K,
          1e-9 if kernel.get("kernel") == "ref" else 1e-4)
    # the log-prob gradient is unchanged by asking for top-k
    out.logprob.sum().backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    sht.logprobs(h, w, t, loss_mask=mask, temperature=0.8, **kernel).sum().backward()
    assert torch.equal(gh, h.grad) and torch.equal(gw, w.grad)
    # leading dimensions, with sum_p2; the older result types read None
    both = sht.logprobs(h.reshape(1, N, H), w, t.reshape(1, N), topk=3, sum_p2=True, **kernel)
    assert both.topk_ids.shape == (1, N, 3) and both.sum_p2.shape == (1, N)
    assert sht.logprobs(h, w, t, lse=True, **kernel).topk_ids is None
    assert sht.logprobs(h, w, t, sum_p2=True, **kernel).topk_logprobs is None
    with pytest.raises(spanhead.Error, match="topk"):
        sht.logprobs(h, w, t, topk=V + 1, **kernel)
    with pytest.raises(spanhead.InvalidArgumentError, match="topk: 1099511627776"):
        sht.logprobs(h, w, t, topk=2 ** 40, **kernel)


def test_torch_topk_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the CUDA path is covered by tests/gpu/test_head_cuda_contract.c")
    import spanhead.torch as sht
    rng = np.random.default_rng(25)
    hn, wn, tn, mn = case(rng, 300, 64, 1601)
    out = sht.logprobs(torch.from_numpy(hn).cuda(), torch.from_numpy(wn).cuda(),
                       torch.from_numpy(tn).cuda(), loss_mask=torch.from_numpy(mn).cuda(),
                       temperature=0.7, topk=64)
    check(out.topk_ids.cpu().numpy(), out.topk_logprobs.cpu().numpy(), hn, wn, 0.7, 0.0,
          mn.astype(bool), 64, 1e-3)


def test_torch_topk_compile(rng):
    """torch.compile traces the operator with topk through its fake (shapes and dtypes)."""
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    hn, wn, tn, _ = case(rng, 17, 8, 90, ties=False)
    h, w, t = torch.from_numpy(hn), torch.from_numpy(wn), torch.from_numpy(tn)

    def f(h, w, t):
        o = sht.logprobs(h, w, t, topk=5)
        return o.topk_logprobs * 2, o.topk_ids

    ref = f(h, w, t)
    got = torch.compile(f, fullgraph=True, backend="eager")(h, w, t)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_torch_topk_temperature_rows(rng):
    """temperature= a per-row tensor (issue 25 item 1) with topk: each row's list is that of
    its own distribution."""
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    hn, wn, tn, _ = case(rng, 19, 8, 150)
    T = (0.3 * 10 ** rng.random(19)).astype(np.float32)
    o = sht.logprobs(torch.from_numpy(hn), torch.from_numpy(wn), torch.from_numpy(tn),
                     temperature=torch.from_numpy(T), topk=7)
    for i in range(19):
        ids, lp = o.topk_ids[i:i + 1].numpy(), o.topk_logprobs[i:i + 1].numpy()
        check(ids, lp, hn[i:i + 1], wn, float(T[i]), 0.0, np.ones(1, bool), 7)
