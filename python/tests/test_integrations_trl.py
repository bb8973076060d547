"""spanhead.integrations.trl against TRL's own GRPOTrainer (trl 1.16.x from PyPI with
accelerate and datasets, installed by scripts/setup.sh into build-integrations/trl; skips
visibly without it), CPU: a GRPOTrainer over a tiny random Llama (built from a config, no
hub) computes one training loss on the same batch with TRL's own code and patched, for each
loss_type (grpo, bnpo, dr_grpo, dapo), token and sequence importance sampling, with and
without the KL term, with and without old log-probs: the same loss and the same gradient of
every parameter (fp32 tolerance), the same logged metrics, then one optimizer step gives the
same parameters; unsupported configs run TRL's code after one warning; the version check.
"""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import frameworks  # noqa: E402

frameworks.use("trl")
transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl", reason="trl's dependencies are not installed")
datasets = pytest.importorskip("datasets", reason="datasets is not installed")

import spanhead  # noqa: E402
import spanhead.integrations.trl as sh_trl  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _framework_path_off_afterwards():
    yield from frameworks.off_sys_path_afterwards("trl")


V, P, K, B = 61, 5, 9, 4


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<pad>": 0, "<eos>": 1}
    vocab.update({f"w{i}": i for i in range(2, V)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                                eos_token="<eos>")


def make_trainer(tmp_path, seed, **cfg):
    cfg_m = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, max_position_embeddings=64,
                                     pad_token_id=0, eos_token_id=1, bos_token_id=1)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg_m).float()
    # saved and given by path: with beta != 0 TRL loads the reference model from the same path
    path = tmp_path / "model"
    model.save_pretrained(path)
    tok = tokenizer()
    tok.save_pretrained(path)
    args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=B,
                          num_generations=2, max_completion_length=K + 3, report_to=[],
                          use_cpu=True, bf16=False, logging_steps=1, temperature=0.9, **cfg)
    # an explicit fingerprint: datasets' own fingerprinting pickles pyarrow's types, which
    # fails here (dill cannot locate pyarrow's MonthDayNano), and the loss needs no cache
    import pyarrow
    ds = datasets.Dataset(pyarrow.table({"prompt": ["w3 w4 w5"] * 8}), fingerprint="sph")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = trl.GRPOTrainer(model=str(path), reward_funcs=lambda completions, **kw: [0.0] * len(
            completions), args=args, train_dataset=ds, processing_class=tok)
    tr.model.train()
    tr.current_gradient_accumulation_steps = 3
    return tr


def batch(rng, tr, old, kl, adv_per_token=False):
    pm = torch.ones(B, P, dtype=torch.long)
    pm[1, :2] = 0                                    # left padding
    pid = torch.tensor(rng.integers(2, V, (B, P))) * pm
    lens = rng.integers(3, K + 1, B)
    cm = torch.tensor((np.arange(K)[None, :] < lens[:, None]).astype(np.int64))
    cm[2] = 0                     # a completion without tokens (grpo still averages over B)
    cid = torch.tensor(rng.integers(2, V, (B, K))) * cm
    adv = torch.tensor(rng.standard_normal((B, K) if adv_per_token else B), dtype=torch.float32)
    inp = {"prompt_ids": pid, "prompt_mask": pm, "completion_ids": cid, "completion_mask": cm,
           "advantages": adv, "num_items_in_batch": cm.sum().float() * 2}
    if old or kl:
        with torch.no_grad():
            lp, _, _ = tr._get_per_token_logps_and_entropies(
                tr.model, torch.cat([pid, cid], 1), torch.cat([pm, cm], 1), K)
    if old:
        inp["old_per_token_logps"] = lp + 0.4 * torch.tensor(rng.standard_normal((B, K)),
                                                             dtype=torch.float32)
    if kl:
        inp["ref_per_token_logps"] = lp + 0.3 * torch.tensor(rng.standard_normal((B, K)),
                                                            dtype=torch.float32)
    return inp


def loss_and_grads(tr, inp):
    tr.model.zero_grad()
    for v in tr._metrics["train"].values():
        v.clear()
    loss = tr.compute_loss(tr.model, inp)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in tr.model.named_parameters() if p.grad is not None}
    metrics = {k: list(v) for k, v in tr._metrics["train"].items()}
    return loss.detach(), grads, metrics


close = frameworks.close  # the shared rule (frameworks.py)


CASES = [(lt, lvl, old, kl) for lt in ("grpo", "bnpo", "dr_grpo", "dapo")
         for lvl in ("token", "sequence") for old, kl in ((True, True), (False, False))]


@pytest.mark.parametrize("loss_type,level,old,kl", CASES)
def test_grpo_loss_patched_equals_trl(tmp_path, rng, loss_type, level, old, kl):
    tr = make_trainer(tmp_path, int(rng.integers(1 << 30)), loss_type=loss_type,
                      importance_sampling_level=level, epsilon=0.2, epsilon_high=0.28,
                      beta=0.04 if kl else 0.0, use_bias_correction_kl=False)
    inp = batch(rng, tr, old, kl)
    ref_loss, ref_grads, ref_metrics = loss_and_grads(tr, inp)
    sh_trl.patch_grpo(tr)
    sh_trl.patch_grpo(tr)                                  # idempotent
    with warnings.catch_warnings():
        warnings.simplefilter("error")                     # no fallback warning
        loss, grads, metrics = loss_and_grads(tr, inp)
    close(loss, ref_loss, what="loss")
    assert grads.keys() == ref_grads.keys()
    for n in ref_grads:
        close(grads[n], ref_grads[n], tol=5e-5, what=n)
    assert metrics.keys() == ref_metrics.keys(), (metrics.keys(), ref_metrics.keys())
    for k in ref_metrics:
        np.testing.assert_allclose(metrics[k], ref_metrics[k], rtol=1e-4, atol=1e-6, err_msg=k)
    # one optimizer step from the same parameters gives the same parameters
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    steps = {}
    for which, g in (("ref", ref_grads), ("spanhead", grads)):
        with torch.no_grad():
            for n, p in tr.model.named_parameters():
                p.copy_(before[n])
                p.grad = g.get(n)
        opt = torch.optim.SGD(tr.model.parameters(), lr=0.5)
        opt.step()
        steps[which] = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    for n in before:
        close(steps["spanhead"][n], steps["ref"][n], tol=1e-5, what=f"step {n}")
    sh_trl.unpatch_grpo(tr)
    assert "_compute_loss" not in tr.__dict__


def test_entropy_bonus_bnpo_fused(tmp_path, rng):
    tr = make_trainer(tmp_path, int(rng.integers(1 << 30)), loss_type="bnpo", entropy_coef=0.05,
                      beta=0.0)
    inp = batch(rng, tr, True, False)
    ref_loss, ref_grads, _ = loss_and_grads(tr, inp)
    sh_trl.patch_grpo(tr)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss, grads, _ = loss_and_grads(tr, inp)
    close(loss, ref_loss, what="loss")
    for n in ref_grads:
        close(grads[n], ref_grads[n], tol=5e-5, what=n)


@pytest.mark.parametrize("what", ["cispo", "bias_kl", "delta", "entropy_grpo"])
def test_unsupported_falls_back_once(tmp_path, rng, what, monkeypatch):
    from spanhead import integrations
    monkeypatch.setattr(integrations, "_warned", set())
    cfg = dict(loss_type="grpo", beta=0.0)
    if what == "cispo":
        cfg.update(loss_type="cispo", epsilon_high=5.0)
    elif what == "bias_kl":
        cfg.update(beta=0.04, use_bias_correction_kl=True)
    elif what == "delta":
        cfg.update(delta=1.5)
    else:
        cfg.update(entropy_coef=0.05)
    tr = make_trainer(tmp_path, int(rng.integers(1 << 30)), **cfg)
    inp = batch(rng, tr, True, cfg["beta"] != 0.0)
    ref_loss, ref_grads, _ = loss_and_grads(tr, inp)
    sh_trl.patch_grpo(tr)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        loss, grads, _ = loss_and_grads(tr, inp)
        loss_and_grads(tr, inp)
    assert len([r for r in rec if "not fused" in str(r.message)]) == 1
    assert torch.equal(loss, ref_loss)
    for n in ref_grads:
        assert torch.equal(grads[n], ref_grads[n]), n


def test_patch_errors_and_version(tmp_path, rng, monkeypatch):
    with pytest.raises(spanhead.InvalidArgumentError, match="GRPOTrainer"):
        sh_trl.patch_grpo(object())
    tr = make_trainer(tmp_path, 1)
    import importlib.metadata as md
    real = md.version
    monkeypatch.setattr(md, "version", lambda d: "1.15.0" if d == "trl" else real(d))
    with pytest.raises(spanhead.UnsupportedError) as e:
        sh_trl.patch_grpo(tr)
    assert "trl 1.15.0" in str(e.value) and ">=1.16.0,<1.17" in str(e.value)
    assert "_compute_loss" not in tr.__dict__
