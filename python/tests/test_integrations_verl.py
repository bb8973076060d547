"""spanhead.integrations.verl against verl's own code (verl 0.9.x from PyPI, installed by
scripts/setup.sh into build-integrations/verl; skips visibly without it), CPU:

* linear_cross_entropy against verl's torch path (verl.utils.torch_functional's
  logprobs_from_logits / entropy_from_logits on the float64 logits): values, the three
  reductions, and both gradients under non-unit random upstream gradients;
* patch() / unpatch() on verl's module objects (idempotent, originals restored), and verl's
  own model forwards: forward_with_triton_backend (patched: spanhead) against
  forward_with_torch_backend on a tiny random Llama, values and every parameter's gradient;
* the version check (an unknown version raises, naming it and the range; nothing patched);
* ppo_loss against verl's ppo_loss math (the registry's vanilla / gspo / cispo, kl_penalty,
  agg_loss, the entropy term, global batch info, rollout IS weights) on verl's log-probs of the
  dense logits: loss, metrics, both gradients; the fallback (one warning, same loss).
"""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import frameworks  # noqa: E402

frameworks.load_verl()
import verl.utils.torch_functional as verl_F  # noqa: E402
import verl.utils.kernel.linear_cross_entropy as verl_lce  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402

import spanhead  # noqa: E402
import spanhead.integrations.verl as shv  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _framework_path_off_afterwards():
    yield from frameworks.off_sys_path_afterwards("verl")


Cfg = frameworks.ActorConfig


close = frameworks.close  # the shared rule (frameworks.py)


def make(rng, N=61, H=24, V=97):
    h = torch.tensor(rng.standard_normal((N, H)), dtype=torch.float32, requires_grad=True)
    w = torch.tensor(rng.standard_normal((V, H)) * 1.5 / H ** 0.5, dtype=torch.float32,
                     requires_grad=True)
    t = torch.tensor(rng.integers(0, V, N), dtype=torch.int64)
    return h, w, t


def verl_reference(h, w, t, temperature):
    hd = h.detach().double().requires_grad_(True)
    wd = w.detach().double().requires_grad_(True)
    logits = hd @ wd.T / temperature
    return hd, wd, verl_F.logprobs_from_logits(logits, t), verl_F.entropy_from_logits(logits)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_lce_matches_verl_torch_path(rng, reduction):
    h, w, t = make(rng)
    temp = float(rng.uniform(0.6, 1.4))
    lp, ent = shv.linear_cross_entropy(h, w, t, temp, reduction)
    hd, wd, rlp, rent = verl_reference(h, w, t, temp)
    assert ent.dtype == lp.dtype == torch.float32 and ent.shape == (h.shape[0],)
    if reduction == "none":
        assert lp.shape == (h.shape[0],)
        g1 = torch.tensor(rng.standard_normal(lp.shape), dtype=torch.float32)
    else:
        assert lp.shape == ()
        rlp = rlp.sum() if reduction == "sum" else rlp.mean()
        g1 = torch.tensor(float(rng.standard_normal()), dtype=torch.float32)
    g2 = torch.tensor(rng.standard_normal(ent.shape), dtype=torch.float32)
    close(lp, rlp, what="log_probs")
    close(ent, rent, what="entropy")
    ((lp * g1).sum() + (ent * g2).sum()).backward()
    ((rlp * g1.double()).sum() + (rent * g2.double()).sum()).backward()
    close(h.grad, hd.grad, what="d_hidden")
    close(w.grad, wd.grad, what="d_weight")


def test_lce_contract_3d_and_errors(rng):
    h, w, t = make(rng, N=2 * 13)
    h3 = h.detach().reshape(2, 13, -1).requires_grad_(True)
    lp, ent = shv.linear_cross_entropy(h3, w, t.reshape(2, 13), 1.0, "none")
    assert lp.shape == ent.shape == (26,)            # verl flattens the tokens
    (lp.sum() + ent.sum()).backward()
    assert h3.grad.shape == h3.shape and w.grad.shape == w.shape
    bad = t.clone()
    bad[5] = w.shape[0]
    with pytest.raises(spanhead.InvalidArgumentError, match=f"id {w.shape[0]}"):
        shv.linear_cross_entropy(h, w, bad)
    bad[5] = -100
    with pytest.raises(spanhead.InvalidArgumentError, match="-100"):
        shv.linear_cross_entropy(h, w, bad)
    with pytest.raises(spanhead.InvalidArgumentError, match="reduction"):
        shv.linear_cross_entropy(h, w, t, 1.0, "avg")
    with pytest.raises(spanhead.ShapeError, match="labels"):
        shv.linear_cross_entropy(h, w, t[:-1])


def test_patch_unpatch_roundtrip():
    orig = verl_lce.linear_cross_entropy
    assert orig == verl_lce.LinearCrossEntropy.apply
    # a verl module that imported the function by name at module level (as verl's Megatron
    # forwards do: their import needs megatron, so this one stands for them)
    import types
    import sys
    holder = types.ModuleType("verl._spanhead_test_holder")
    holder.linear_cross_entropy = orig
    holder.lce_alias = orig
    sys.modules[holder.__name__] = holder
    from verl.utils.experimental.torch_functional import FusedLinearForPPO
    torch_forward = FusedLinearForPPO.__dict__["forward"]
    try:
        shv.patch()
        shv.patch()                                       # idempotent
        assert verl_lce.linear_cross_entropy is shv.linear_cross_entropy
        assert FusedLinearForPPO.__dict__["forward"] is not torch_forward
        assert holder.linear_cross_entropy is shv.linear_cross_entropy
        assert holder.lce_alias is shv.linear_cross_entropy
        assert shv.is_patched()
        shv.unpatch()
        assert verl_lce.linear_cross_entropy is orig
        assert holder.linear_cross_entropy is orig and holder.lce_alias is orig
        assert FusedLinearForPPO.__dict__["forward"] is torch_forward
        assert not shv.is_patched()
        shv.unpatch()                                     # a no-op
        assert verl_lce.linear_cross_entropy is orig
    finally:
        shv.unpatch()
        del sys.modules[holder.__name__]


def test_version_check(monkeypatch):
    import importlib.metadata as md
    real = md.version
    orig = verl_lce.linear_cross_entropy
    for v in ("0.8.0", "0.10.1", "1.0.0"):
        monkeypatch.setattr(md, "version", lambda d, v=v: v if d == "verl" else real(d))
        with pytest.raises(spanhead.UnsupportedError) as e:
            shv.patch()
        assert f"verl {v}" in str(e.value) and ">=0.9.0,<0.10" in str(e.value)
        assert verl_lce.linear_cross_entropy is orig and not shv.is_patched()


def tiny_llama(seed):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    cfg = transformers.LlamaConfig(vocab_size=89, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).float()


def test_verl_model_forward_patched_vs_torch_backend(rng):
    from verl.models.transformers import dense_common as dc
    model = tiny_llama(int(rng.integers(1 << 30)))
    ids = torch.tensor(rng.integers(0, 89, (2, 19)))
    temp = 0.8
    ref = dc.forward_with_torch_backend(model, input_ids=ids, return_dict=True,
                                        temperature=temp)
    g1 = torch.tensor(rng.standard_normal((2, 19)), dtype=torch.float32)
    g2 = torch.tensor(rng.standard_normal((2, 19)), dtype=torch.float32)
    ((ref.log_probs.reshape(2, 19) * g1).sum() + (ref.entropy.reshape(2, 19) * g2).sum()).backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    shv.patch()
    try:
        out = dc.forward_with_triton_backend(model, input_ids=ids, return_dict=True,
                                             temperature=temp)
    finally:
        shv.unpatch()
    close(out.log_probs.reshape(2, 19), ref.log_probs.reshape(2, 19), what="log_probs")
    close(out.entropy.reshape(2, 19), ref.entropy.reshape(2, 19), what="entropy")
    ((out.log_probs.reshape(2, 19) * g1).sum() + (out.entropy.reshape(2, 19) * g2).sum()).backward()
    for n, p in model.named_parameters():
        close(p.grad, ref_grads[n], tol=5e-5, what=n)


def test_verl_torch_backend_patched_vs_unpatched(rng, monkeypatch):
    """verl's default fused backend (impl_backend=torch: FusedLinearForPPO) patched and not:
    the same log-probs, entropy (and their dtypes, shapes) and gradients; spanhead ran."""
    from verl.models.transformers import dense_common as dc
    calls = []
    real = shv.linear_cross_entropy
    monkeypatch.setattr(shv, "linear_cross_entropy", lambda *a: calls.append(1) or real(*a))
    model = tiny_llama(int(rng.integers(1 << 30)))
    ids = torch.tensor(rng.integers(0, 89, (3, 17)))
    g1 = torch.tensor(rng.standard_normal((3, 17)), dtype=torch.float32)
    g2 = torch.tensor(rng.standard_normal((3, 17)), dtype=torch.float32)
    res = {}
    for patched in (False, True):
        model.zero_grad()
        if patched:
            shv.patch()
        try:
            out = dc.forward_with_torch_backend(model, input_ids=ids, return_dict=True,
                                                temperature=1.1)
        finally:
            shv.unpatch()
        ((out.log_probs * g1).sum() + (out.entropy * g2).sum()).backward()
        res[patched] = (out.log_probs, out.entropy,
                        {n: p.grad.clone() for n, p in model.named_parameters()})
    assert calls == [1]
    (lp0, e0, gr0), (lp1, e1, gr1) = res[False], res[True]
    assert lp1.shape == lp0.shape and e1.shape == e0.shape
    assert lp1.dtype == lp0.dtype and e1.dtype == e0.dtype
    close(lp1, lp0, what="log_probs")
    close(e1, e0, what="entropy")
    for n in gr0:
        close(gr1[n], gr0[n], tol=5e-5, what=n)


# ---- ppo_loss ---------------------------------------------------------------------------

AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def ppo_case(rng, B=5, T=23, H=20, V=71):
    h = torch.tensor(rng.standard_normal((B, T, H)), dtype=torch.float32, requires_grad=True)
    w = torch.tensor(rng.standard_normal((V, H)) * 1.5 / H ** 0.5, dtype=torch.float32,
                     requires_grad=True)
    t = torch.tensor(rng.integers(0, V, (B, T)))
    lens = rng.integers(3, T + 1, B)
    mask = torch.tensor(np.arange(T)[None, :] < lens[:, None])
    mask[int(rng.integers(B)), :] = False                # a fully masked sequence
    adv = torch.tensor(rng.standard_normal((B, T)), dtype=torch.float32)
    old = torch.tensor(-4.3 + 0.8 * rng.standard_normal((B, T)), dtype=torch.float32)
    ref = torch.tensor(-4.3 + 0.8 * rng.standard_normal((B, T)), dtype=torch.float32)
    isw = torch.tensor(0.5 + rng.random((B, T)), dtype=torch.float32)
    return h, w, t, mask, adv, old, ref, isw


def verl_ppo_reference(cfg, h, w, t, mask, adv, old, ref, isw, temp):
    """verl's ppo_loss (workers/utils/losses.py) steps with verl's functions, float64."""
    hd = h.detach().double().requires_grad_(True)
    wd = w.detach().double().requires_grad_(True)
    logits = hd @ wd.T / temp
    lp = verl_F.logprobs_from_logits(logits, t)
    ent = verl_F.entropy_from_logits(logits)
    fn = core_algos.get_policy_loss_fn(cfg.policy_loss["loss_mode"])
    info = {k: v for k, v in cfg.global_batch_info.items() if v is not None}
    pg, met = fn(old_log_prob=old.double(), log_prob=lp, advantages=adv.double(),
                 response_mask=mask, loss_agg_mode=cfg.loss_agg_mode, config=cfg,
                 rollout_is_weights=None if isw is None else isw.double())
    ent_loss = core_algos.agg_loss(loss_mat=ent, loss_mask=mask, loss_agg_mode=cfg.loss_agg_mode,
                                   **info)
    loss = pg - cfg.entropy_coeff * ent_loss
    kl_loss = None
    if cfg.use_kl_loss:
        kld = core_algos.kl_penalty(logprob=lp, ref_logprob=ref.double(),
                                    kl_penalty=cfg.kl_loss_type)
        kl_loss = core_algos.agg_loss(loss_mat=kld, loss_mask=mask,
                                      loss_agg_mode=cfg.loss_agg_mode, **info)
        loss = loss + kl_loss * cfg.kl_loss_coef
    loss.backward()
    return loss, pg, ent_loss, kl_loss, met, hd.grad, wd.grad


CASES = [(mode, kl, agg) for mode in ("vanilla", "gspo", "cispo")
         for kl in (None, "kl", "mse", "low_var_kl") for agg in AGGS]


@pytest.mark.parametrize("mode,kl,agg", CASES)
def test_ppo_loss_matches_verl(rng, mode, kl, agg):
    h, w, t, mask, adv, old, ref, isw = ppo_case(rng)
    temp = 0.9
    cfg = Cfg(policy_loss={"loss_mode": mode}, loss_agg_mode=agg, clip_ratio=0.2,
              clip_ratio_high=0.28, entropy_coeff=0.013, use_kl_loss=kl is not None,
              kl_loss_type=kl or "low_var_kl", kl_loss_coef=0.07)
    use_isw = bool(rng.integers(2))
    ref_out = verl_ppo_reference(cfg, h, w, t, mask, adv, old, ref, isw if use_isw else None,
                                 temp)
    loss, met = shv.ppo_loss(cfg, h, w, t, mask, old, adv, ref_log_prob=ref,
                             rollout_is_weights=isw if use_isw else None, temperature=temp)
    rloss, rpg, rent, rkl, rmet, rgh, rgw = ref_out
    close(loss, rloss, what="loss")
    close(met["actor/pg_loss"], rpg, what="pg_loss")
    close(met["actor/entropy_loss"], rent, what="entropy_loss")
    if rkl is not None:
        close(met["kl_loss"], rkl, what="kl_loss")
    for k in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert abs(float(met[k]) - rmet[k]) <= 2e-5 * max(1.0, abs(rmet[k])), (k, met[k], rmet[k])
    loss.backward()
    close(h.grad, rgh, what="d_hidden")
    close(w.grad, rgw, what="d_weight")


@pytest.mark.parametrize("agg", AGGS)
def test_ppo_loss_global_batch_info(rng, agg):
    h, w, t, mask, adv, old, ref, isw = ppo_case(rng)
    gbi = {"dp_size": 2, "batch_num_tokens": int(mask.sum()) * 2 + 7,
           "global_batch_size": 13, "loss_scale_factor": 31}
    cfg = Cfg(policy_loss={"loss_mode": "vanilla"}, loss_agg_mode=agg, clip_ratio_c=2.5,
              entropy_coeff=0.01, use_kl_loss=True, kl_loss_type="low_var_kl",
              kl_loss_coef=0.05, global_batch_info=dict(gbi), loss_scale_factor=31)
    rloss, _, _, _, _, rgh, rgw = verl_ppo_reference(cfg, h, w, t, mask, adv, old, ref, None, 1.0)
    loss, _ = shv.ppo_loss(cfg, h, w, t, mask, old, adv, ref_log_prob=ref)
    close(loss, rloss, what="loss")
    loss.backward()
    close(h.grad, rgh, what="d_hidden")
    close(w.grad, rgw, what="d_weight")


@pytest.mark.parametrize("what", ["loss_mode", "agg", "kl"])
def test_ppo_loss_fallback_same_loss_one_warning(rng, what, monkeypatch):
    from spanhead import integrations
    monkeypatch.setattr(integrations, "_warned", set())
    kw = dict(policy_loss={"loss_mode": "vanilla"}, loss_agg_mode="token-mean",
              entropy_coeff=0.01, use_kl_loss=True, kl_loss_type="low_var_kl",
              kl_loss_coef=0.05)
    if what == "loss_mode":
        kw["policy_loss"] = {"loss_mode": "gpg"}
    elif what == "agg":
        kw["loss_agg_mode"] = "token-sum"
    else:
        kw["kl_loss_type"] = "k3+"
    cfg = Cfg(**kw)
    h, w, t, mask, adv, old, ref, isw = ppo_case(rng)
    rloss, _, _, _, _, rgh, rgw = verl_ppo_reference(cfg, h, w, t, mask, adv, old, ref, None, 1.0)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        loss, _ = shv.ppo_loss(cfg, h, w, t, mask, old, adv, ref_log_prob=ref)
        loss2, _ = shv.ppo_loss(cfg, h.detach(), w.detach(), t, mask, old, adv,
                                ref_log_prob=ref)
    msgs = [str(r.message) for r in rec if "not fused" in str(r.message)]
    assert len(msgs) == 1, msgs
    close(loss, rloss, what="loss")
    close(loss2, rloss, what="loss, second call")
    loss.backward()
    close(h.grad, rgh, what="d_hidden")
    close(w.grad, rgw, what="d_weight")


# ---- per-row temperature (issue 25: verl's dynamic temperature, PR 6110) -------------------

def test_lce_per_row_temperature(rng):
    h, w, t = make(rng, N=2 * 17)
    temp = torch.tensor(np.exp(rng.uniform(-1.0, 1.0, t.shape[0])), dtype=torch.float32)
    lp, ent = shv.linear_cross_entropy(h, w, t, temp, "none")
    hd, wd, rlp, rent = verl_reference(h, w, t, temp.double()[:, None])
    close(lp, rlp, what="log_probs")
    close(ent, rent, what="entropy")
    (lp.sum() + 0.5 * ent.sum()).backward()
    (rlp.sum() + 0.5 * rent.sum()).backward()
    close(h.grad, hd.grad, what="d_hidden")
    close(w.grad, wd.grad, what="d_weight")
    # one temperature per sample of a (B, T, H) batch: expanded to its tokens
    per_sample = torch.tensor([0.5, 1.7])
    h3 = h.detach().reshape(2, 17, -1)
    lp3, _ = shv.linear_cross_entropy(h3, w, t.reshape(2, 17), per_sample, "none")
    lpt, _ = shv.linear_cross_entropy(h3, w, t.reshape(2, 17),
                                      per_sample[:, None].expand(2, 17), "none")
    assert torch.equal(lp3, lpt)
    _, _, rlp3, _ = verl_reference(h, w, t, per_sample.double().repeat_interleave(17)[:, None])
    close(lp3, rlp3, what="per-sample log_probs")
    with pytest.raises(spanhead.ShapeError, match="temperature"):
        shv.linear_cross_entropy(h3, w, t.reshape(2, 17), torch.ones(3), "none")


def test_ppo_loss_per_sample_temperature(rng):
    h, w, t, mask, adv, old, ref, isw = ppo_case(rng)
    B = t.shape[0]
    temp = torch.tensor(np.exp(rng.uniform(-0.7, 0.7, B)), dtype=torch.float32)
    cfg = Cfg(policy_loss={"loss_mode": "vanilla"}, loss_agg_mode="token-mean", clip_ratio=0.2,
              clip_ratio_high=0.28, entropy_coeff=0.013, use_kl_loss=True,
              kl_loss_type="low_var_kl", kl_loss_coef=0.07)
    rloss, rpg, rent, rkl, rmet, rgh, rgw = verl_ppo_reference(
        cfg, h, w, t, mask, adv, old, ref, None, temp.double()[:, None, None])
    loss, met = shv.ppo_loss(cfg, h, w, t, mask, old, adv, ref_log_prob=ref, temperature=temp)
    close(loss, rloss, what="loss")
    close(met["actor/entropy_loss"], rent, what="entropy_loss")
    loss.backward()
    close(h.grad, rgh, what="d_hidden")
    close(w.grad, rgw, what="d_weight")
