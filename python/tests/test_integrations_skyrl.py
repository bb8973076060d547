"""spanhead.integrations.skyrl against SkyRL's own code (skyrl 0.3.x from PyPI, installed by
scripts/setup.sh into build-integrations/skyrl with megatron-core; skips visibly without it),
CPU, one gloo process as the TP group:

* FusedLinearLogprobSpanhead.apply against SkyRL's torch backend
  (FusedLinearChunkedDistributedLogprob): [B, S] float32 values, targets outside the shard
  give 0, both gradients under random upstream gradients (zero on the out-of-vocabulary rows:
  there SkyRL's backward emits -softmax * g for a forward that returned the constant 0, where
  spanhead's gradient is 0), mixed dtypes, inference_only;
* patch() / unpatch() on SkyRL's dispatcher: SkyRL's from_parallel_hidden_to_logprobs runs
  spanhead, same values and gradients; originals restored; the version check;
* policy_loss against SkyRL's PolicyLossRegistry functions (regular, dual_clip, gspo, cispo)
  on float64 log-probs of the dense logits: loss, clip_ratio, both gradients; the fallback.
"""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import frameworks  # noqa: E402

frameworks.load_skyrl()
mu = pytest.importorskip("skyrl.backends.skyrl_train.distributed.megatron.model_utils",
                         reason="SkyRL's Megatron model utils need megatron-core")
from skyrl.backends.skyrl_train.utils import ppo_utils  # noqa: E402
from skyrl.train.config import AlgorithmConfig  # noqa: E402

import spanhead  # noqa: E402
import spanhead.integrations.skyrl as shs  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _framework_path_off_afterwards():
    yield from frameworks.off_sys_path_afterwards("skyrl")



@pytest.fixture(scope="module")
def group(tmp_path_factory):
    import torch.distributed as dist
    was = dist.is_initialized()
    yield frameworks.init_single_process_group(tmp_path_factory)
    if not was:                          # later test modules see no default group
        dist.destroy_process_group()


close = frameworks.close  # the shared rule (frameworks.py)


def make(rng, B=2, S=29, H=24, V=83, oov=True):
    h = torch.tensor(rng.standard_normal((B, S, H)), dtype=torch.float32, requires_grad=True)
    w = torch.tensor(rng.standard_normal((V, H)) * 1.5 / H ** 0.5, dtype=torch.float32,
                     requires_grad=True)
    t = torch.tensor(rng.integers(0, V, (B, S)))
    if oov:
        t[0, 3] = V + 5
        t[1, 7] = V
        t[1, 11] = -100
    return h, w, t


def test_apply_matches_skyrl_torch_path(rng, group):
    h, w, t = make(rng)
    V = w.shape[0]
    out = shs.FusedLinearLogprobSpanhead.apply(h, w, t, 0, V, 7, group, False)
    h2 = h.detach().clone().requires_grad_(True)
    w2 = w.detach().clone().requires_grad_(True)
    ref = mu.FusedLinearChunkedDistributedLogprob.apply(h2, w2, t.clone(), 0, V, 7, group, False)
    assert out.dtype == torch.float32 and out.shape == t.shape
    close(out, ref, what="log-probs")
    oov = (t < 0) | (t >= V)
    assert (out[oov] == 0).all() and (ref[oov] == 0).all()
    g = torch.tensor(rng.standard_normal(t.shape), dtype=torch.float32)
    g[oov] = 0.0
    (out * g).sum().backward()
    (ref * g).sum().backward()
    close(h.grad, h2.grad, what="d_hidden")
    close(w.grad, w2.grad, what="d_weight")


def test_apply_sharded_ids_single_rank_and_dtypes(rng, group):
    # vocab_start_index != 0 on one rank: ids outside [start, end) give 0
    h, w, t = make(rng, oov=False)
    V = w.shape[0]
    t = t + 50
    out = shs.FusedLinearLogprobSpanhead.apply(h, w, t, 50, 50 + V, 64, group)
    ref = mu.FusedLinearChunkedDistributedLogprob.apply(h.detach(), w.detach(), t.clone(), 50,
                                                        50 + V, 64, group, True)
    close(out, ref, what="shifted ids")
    # bf16 hidden against a float32 weight: cast to the weight's dtype, grad in hidden's
    hb = h.detach().to(torch.bfloat16).requires_grad_(True)
    out = shs.FusedLinearLogprobSpanhead.apply(hb, w, t, 50, 50 + V, 64, group)
    out.sum().backward()
    assert hb.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.float32
    with torch.no_grad():
        ref = mu.FusedLinearChunkedDistributedLogprob.apply(hb.float(), w.detach(), t.clone(), 50,
                                                            50 + V, 64, group, True)
    close(out, ref, what="bf16 hidden")
    inf = shs.FusedLinearLogprobSpanhead.apply(h, w, t, 50, 50 + V, 64, group, True)
    assert inf.grad_fn is None and not inf.requires_grad


def test_apply_errors(rng, group):
    h, w, t = make(rng)
    V = w.shape[0]
    with pytest.raises(spanhead.ShapeError, match="hidden"):
        shs.FusedLinearLogprobSpanhead.apply(h[0], w, t[0], 0, V, 8, group)
    with pytest.raises(spanhead.ShapeError, match="target"):
        shs.FusedLinearLogprobSpanhead.apply(h, w, t[:, 1:], 0, V, 8, group)
    with pytest.raises(spanhead.InvalidArgumentError, match="vocab_end_index=82"):
        shs.FusedLinearLogprobSpanhead.apply(h, w, t, 0, V - 1, 8, group)
    with pytest.raises(spanhead.InvalidArgumentError, match="chunk_size"):
        shs.FusedLinearLogprobSpanhead.apply(h, w, t, 0, V, 0, group)


def test_patch_routes_skyrl_dispatcher(rng, group, monkeypatch):
    h, w, t = make(rng, oov=False)
    V = w.shape[0]
    orig = mu._fused_lm_head_logprob_apply
    h2 = h.detach().clone().requires_grad_(True)
    w2 = w.detach().clone().requires_grad_(True)
    ref = mu.from_parallel_hidden_to_logprobs(h2, w2, t, 0, V, group, chunk_size=8,
                                              temperature=0.8)
    calls = []
    real = shs.FusedLinearLogprobSpanhead.apply
    monkeypatch.setattr(shs.FusedLinearLogprobSpanhead, "apply",
                        staticmethod(lambda *a: calls.append(1) or real(*a)))
    shs.patch()
    shs.patch()                                          # idempotent
    try:
        out = mu.from_parallel_hidden_to_logprobs(h, w, t, 0, V, group, chunk_size=8,
                                                  temperature=0.8)
    finally:
        shs.unpatch()
    assert calls == [1] and mu._fused_lm_head_logprob_apply is orig and not shs.is_patched()
    close(out, ref, what="log-probs")
    g = torch.tensor(rng.standard_normal(out.shape), dtype=torch.float32)
    (out * g).sum().backward()
    (ref * g).sum().backward()
    close(h.grad, h2.grad, what="d_hidden")
    close(w.grad, w2.grad, what="d_weight")
    # only the named backend is routed
    shs.patch(backends=("triton",))
    try:
        mu.from_parallel_hidden_to_logprobs(h.detach(), w.detach(), t, 0, V, group,
                                            inference_only=True, fused_backend="torch")
    finally:
        shs.unpatch()
    assert calls == [1]
    with pytest.raises(spanhead.InvalidArgumentError, match="liger"):
        shs.patch(backends=("liger",))
    assert not shs.is_patched()


def test_version_check(monkeypatch):
    import importlib.metadata as md
    real = md.version
    orig = mu._fused_lm_head_logprob_apply
    for v in ("0.2.0", "0.4.0"):
        monkeypatch.setattr(md, "version", lambda d, v=v: v if d == "skyrl" else real(d))
        with pytest.raises(spanhead.UnsupportedError) as e:
            shs.patch()
        assert f"skyrl {v}" in str(e.value) and ">=0.3.0,<0.4" in str(e.value)
        assert mu._fused_lm_head_logprob_apply is orig


def loss_case(rng, B=4, S=21, H=20, V=67):
    h, w, t = make(rng, B=B, S=S, H=H, V=V, oov=False)
    lens = rng.integers(3, S + 1, B)
    mask = torch.tensor((np.arange(S)[None, :] < lens[:, None]).astype(np.float32))
    adv = torch.tensor(rng.standard_normal((B, S)) / (B * S), dtype=torch.float32)
    old = torch.tensor(-4.2 + 0.8 * rng.standard_normal((B, S)), dtype=torch.float32)
    return h, w, t, mask, adv, old


def dense_logprobs(h, w, t):
    hd = h.detach().double().requires_grad_(True)
    wd = w.detach().double().requires_grad_(True)
    lp = torch.log_softmax(hd @ wd.T, -1).gather(-1, t.unsqueeze(-1)).squeeze(-1)
    return hd, wd, lp


@pytest.mark.parametrize("ptype", ["regular", "dual_clip", "gspo", "cispo"])
def test_policy_loss_matches_skyrl(rng, group, ptype):
    h, w, t, mask, adv, old = loss_case(rng)
    cfg = AlgorithmConfig(policy_loss_type=ptype, eps_clip_low=0.2, eps_clip_high=0.28,
                          clip_ratio_c=2.5,
                          loss_reduction="sequence_mean" if ptype == "gspo" else "token_mean")
    hd, wd, lp = dense_logprobs(h, w, t)
    fn = ppo_utils.PolicyLossRegistry.get(ptype)
    rloss, rmet = fn(lp, old.double(), adv.double(), cfg, mask.double(), None)
    rloss.backward()
    loss, met = shs.policy_loss(cfg, h, w, t, mask, old, adv, tp_group=group)
    close(loss, rloss, what="loss")
    assert abs(float(met["clip_ratio"]) - rmet["clip_ratio"]) < 1e-6, (met, rmet)
    loss.backward()
    close(h.grad, hd.grad, what="d_hidden")
    close(w.grad, wd.grad, what="d_weight")


def test_policy_loss_fallback(rng, group, monkeypatch):
    from spanhead import integrations
    monkeypatch.setattr(integrations, "_warned", set())
    h, w, t, mask, adv, old = loss_case(rng)
    cfg = AlgorithmConfig(policy_loss_type="sapo")
    hd, wd, lp = dense_logprobs(h, w, t)
    rloss, _ = ppo_utils.PolicyLossRegistry.get("sapo")(lp, old.double(), adv.double(), cfg,
                                                        mask.double(), None)
    rloss.backward()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        loss, _ = shs.policy_loss(cfg, h, w, t, mask, old, adv, tp_group=group)
        shs.policy_loss(cfg, h.detach(), w.detach(), t, mask, old, adv, tp_group=group)
    assert len([r for r in rec if "not fused" in str(r.message)]) == 1
    close(loss, rloss, what="loss")
    loss.backward()
    close(h.grad, hd.grad, what="d_hidden")
    close(w.grad, wd.grad, what="d_weight")
