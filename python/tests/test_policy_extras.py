"""The head's extras through the fused policy loss (issue 25): ``topk=K`` and ``sum_p2=True`` of
spanhead.policy_loss (NumPy) and spanhead.torch.policy_loss (CPU), against a float64 full sort
of the logits and a float64 sum p^2 written here, on the loss's rows (loss_mask and targets
>= 0; the others ids -1, log-probs 0, sum_p2 0), ppo / cispo / gspo, the reference and the
default kernels; the loss, its metrics and its gradients unchanged by asking for them; no
gradient through them; the bad inputs (K = 0 / 257 / > V, one tensor alone). The torch parts
skip without torch."""

import numpy as np
import pytest

import spanhead
from conftest import run_or_skip
from test_policy import case
from test_topk import check

TOL = 2e-5


def oracle_sp2(h, w, T):
    z = h.astype(np.float64) @ w.astype(np.float64).T / T
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return (p * p).sum(1)


def check_sp2(sp2, h, w, T, rows):
    assert sp2.dtype == np.float32 and sp2.shape == (h.shape[0],)
    want = oracle_sp2(h, w, T)
    assert np.all(sp2[~rows] == 0)
    np.testing.assert_allclose(sp2[rows], want[rows], rtol=1e-4)


@pytest.mark.parametrize("loss_type", ["ppo", "cispo", "gspo"])
@pytest.mark.parametrize("K", [1, 7, 53])
def test_numpy_policy_extras(ctx, rng, loss_type, K):
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    kw = dict(loss_mask=mask, loss_type=loss_type, clip_low=0.2, clip_high=0.28,
              ref_logprobs=ref, kl_type="k3", kl_coef=0.05, entropy_coef=0.01,
              agg="seq-mean-token-mean", seq_ids=seq, is_weights=isw, temperature=0.8)
    plain = run_or_skip(ctx, spanhead.policy_loss, h, w, t, adv, old, **kw)
    r = run_or_skip(ctx, spanhead.policy_loss, h, w, t, adv, old, topk=K, sum_p2=True, **kw)
    rows = (mask == 1) & (t >= 0)
    check(r.topk_ids, r.topk_logprobs, h, w, 0.8, 0.0, rows, K,
          1e-9 if ctx.kind == "ref" else 1e-4)
    check_sp2(r.sum_p2, h, w, 0.8, rows)
    # the loss's own outputs: the same bits as without the extras
    for k in spanhead.policy.METRICS:
        assert r.metrics[k] == plain.metrics[k], k
    for k in ("logprob", "entropy", "dhidden", "dweight"):
        np.testing.assert_array_equal(r[k], plain[k], err_msg=k)
    assert plain.topk_ids is None and plain.sum_p2 is None


def test_numpy_policy_extras_given_buffers(rng):
    """Given output buffers (poisoned) are written in full: every row, active or not."""
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    N, K = h.shape[0], 5
    ids = np.full((N, K), 12345, np.int64)
    lps = np.full((N, K), np.nan, np.float32)
    sp2 = np.full(N, np.nan, np.float32)
    r = spanhead.policy_loss(h, w, t, adv, old, loss_mask=mask, topk_ids=ids,
                             topk_logprobs=lps, sum_p2=sp2)
    assert r.topk_ids is ids and r.sum_p2 is sp2
    rows = (mask == 1) & (t >= 0)
    check(ids, lps, h, w, 1.0, 0.0, rows, K)
    check_sp2(sp2, h, w, 1.0, rows)


@pytest.mark.parametrize("kw,exc,needle", [
    (dict(topk=257), spanhead.InvalidArgumentError, "topk: 257"),
    (dict(topk=54), spanhead.ShapeError, "vocab_total"),
    (dict(topk=-1), spanhead.InvalidArgumentError, "topk"),
    (dict(topk_ids=np.zeros((37, 3), np.int64)), spanhead.InvalidArgumentError,
     "topk_logprobs"),
    (dict(sum_p2=np.zeros(36, np.float32)), spanhead.ShapeError, "sum_p2"),
])
def test_numpy_policy_extras_errors(rng, kw, exc, needle):
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    lp = np.full(h.shape[0], np.nan, np.float32)
    with pytest.raises(exc, match=needle):
        spanhead.policy_loss(h, w, t, adv, old, loss_mask=mask, logprob=lp, **kw)
    assert np.isnan(lp).all()  # nothing written


@pytest.mark.parametrize("loss_type", ["ppo", "gspo"])
def test_torch_policy_extras(rng, kernel, loss_type):
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    T = torch.from_numpy
    kw = dict(loss_mask=T(mask).bool(), loss_type=loss_type, clip_low=0.2, clip_high=0.28,
              seq_ids=T(seq), agg="seq-mean-token-mean", entropy_coef=0.01, **kernel)
    outs, grads = [], []
    for extras in (dict(), dict(topk=9, sum_p2=True), dict(topk=4), dict(sum_p2=True)):
        hh, ww = T(h).requires_grad_(True), T(w).requires_grad_(True)
        o = sht.policy_loss(hh, ww, T(t), T(adv), T(old), **kw, **extras)
        (o.loss * 1.3).backward()
        outs.append(o)
        grads.append((hh.grad, ww.grad))
    plain, both, only_k, only_s = outs
    assert isinstance(plain, sht.PolicyOutputs) and len(plain) == 4
    assert isinstance(both, sht.PolicyOutputsExtras) and len(both) == 7
    rows = (mask == 1) & (t >= 0)
    gap = 1e-9 if kernel else 1e-4
    check(both.topk_ids.numpy(), both.topk_logprobs.numpy(), h, w, 1.0, 0.0, rows, 9, gap)
    check(only_k.topk_ids.numpy(), only_k.topk_logprobs.numpy(), h, w, 1.0, 0.0, rows, 4, gap)
    check_sp2(both.sum_p2.numpy(), h, w, 1.0, rows)
    assert only_k.sum_p2 is None and only_s.topk_ids is None and only_s.topk_logprobs is None
    np.testing.assert_array_equal(only_s.sum_p2.numpy(), both.sum_p2.numpy())
    for o in (both.topk_ids, both.topk_logprobs, both.sum_p2):
        assert not o.requires_grad  # no gradient through the extras
    for o, (gh, gw) in zip(outs[1:], grads[1:]):
        assert o.loss.item() == plain.loss.item()
        assert torch.equal(o.logprob, plain.logprob)
        assert torch.equal(gh, grads[0][0]) and torch.equal(gw, grads[0][1])
    # targets' shape: (B, S) rows give (B, S, K) lists
    B, S = 1, h.shape[0]
    o = sht.policy_loss(T(h).reshape(B, S, -1), T(w), T(t).reshape(B, S), T(adv).reshape(B, S),
                        T(old).reshape(B, S), loss_mask=T(mask).bool().reshape(B, S),
                        topk=3, sum_p2=True, **kernel)
    assert tuple(o.topk_ids.shape) == (B, S, 3) and tuple(o.sum_p2.shape) == (B, S)


def test_torch_policy_extras_errors(rng):
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    T = torch.from_numpy
    for k, exc in ((0.5, spanhead.InvalidArgumentError), (True, spanhead.InvalidArgumentError),
                   (257, spanhead.ShapeError), (54, spanhead.ShapeError)):
        with pytest.raises(exc):
            sht.policy_loss(T(h), T(w), T(t), T(adv), T(old), loss_mask=T(mask).bool(), topk=k)


def test_torch_policy_extras_compile(rng):
    """torch.compile traces the operator with the extras through its fake (shapes, dtypes)."""
    torch = pytest.importorskip("torch")
    import spanhead.torch as sht
    h, w, t, mask, seq, adv, old, ref, isw = case(rng)
    T = torch.from_numpy

    def step(hh, ww):
        o = sht.policy_loss(hh, ww, T(t), T(adv), T(old), loss_mask=T(mask).bool(), topk=6,
                            sum_p2=True)
        return o.loss, o.topk_ids, o.topk_logprobs * 2, o.sum_p2

    hh = T(h).requires_grad_(True)
    eager = step(hh, T(w))
    eager[0].backward()
    g_eager = hh.grad.clone()
    hh.grad = None
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = compiled(hh, T(w))
    got[0].backward()
    assert got[0].item() == pytest.approx(eager[0].item(), rel=1e-6)
    assert torch.equal(got[1], eager[1]) and torch.equal(got[2], eager[2])
    assert torch.equal(got[3], eager[3])
    assert torch.allclose(hh.grad, g_eager, rtol=1e-6, atol=1e-8)
