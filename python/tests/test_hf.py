"""spanhead.hf on tiny Hugging Face causal LMs built from configs with random weights (no hub):
the patched forward returns the unpatched loss and gradients without logits, for each
supported family (Gemma with its final-logit softcap); spanhead.hf.logprobs equals the
log-softmax of the unpatched logits; unsupported classes are refused by name. CPU here; the
device script runs the same module on CUDA (SPH_HF_DEVICE=cuda)."""

import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import spanhead  # noqa: E402
import spanhead.hf  # noqa: E402

DEV = os.environ.get("SPH_HF_DEVICE", "cpu")
if DEV.startswith("cuda") and not torch.cuda.is_available():
    pytest.skip("SPH_HF_DEVICE=cuda but torch sees no GPU", allow_module_level=True)

F32 = 2e-5
COMMON = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=157, max_position_embeddings=64,
              attn_implementation="eager")

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               {"head_dim": 8, "final_logit_softcapping": 3.0, "query_pre_attn_scalar": 8}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               {"head_dim": 8, "final_logit_softcapping": 2.5, "query_pre_attn_scalar": 8}),
}


def build(family, seed=0):
    cfg_name, cls_name, extra = FAMILIES[family]
    cfg = getattr(transformers, cfg_name)(**COMMON, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(cfg).to(DEV).float()
    with torch.no_grad():  # random weights of a useful scale: logits far from flat
        model.lm_head.weight.normal_(0.0, 1.0)
    return model


def batch(seed, B=3, S=11, V=157):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, S), generator=g)
    am = torch.ones(B, S, dtype=torch.long)
    am[1, 8:] = 0  # right padding on one row
    labels = ids.clone()
    labels[am == 0] = -100
    labels[0, :4] = -100  # a prompt
    return ids.to(DEV), am.to(DEV), labels.to(DEV)


def loss_and_grads(model, **kw):
    model.zero_grad(set_to_none=True)
    out = model(**kw)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    return out, grads


def assert_close(name, got, want, tol=F32):
    err = (got.double() - want.double()).abs().max().item()
    bound = tol * max(1.0, want.abs().max().item())
    assert err <= bound, f"{name}: max |diff| {err:.3e} > {bound:.3e}"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_patched_loss_and_gradients_equal_unpatched(family):
    model = build(family)
    ids, am, labels = batch(1)
    ref, ref_g = loss_and_grads(model, input_ids=ids, attention_mask=am, labels=labels)
    assert ref.logits is not None
    spanhead.hf.patch(model)
    assert spanhead.hf.is_patched(model)
    got, got_g = loss_and_grads(model, input_ids=ids, attention_mask=am, labels=labels)
    assert got.logits is None
    assert_close(f"{family} loss", got.loss, ref.loss)
    assert set(got_g) == set(ref_g)
    for n in ref_g:
        assert_close(f"{family} d{n}", got_g[n], ref_g[n])

    # the trainer's num_items_in_batch (sum / count over the whole accumulation)
    spanhead.hf.unpatch(model)
    ref2, _ = loss_and_grads(model, input_ids=ids, attention_mask=am, labels=labels,
                             num_items_in_batch=torch.tensor(40))
    spanhead.hf.patch(model)
    got2, _ = loss_and_grads(model, input_ids=ids, attention_mask=am, labels=labels,
                             num_items_in_batch=torch.tensor(40))
    assert_close(f"{family} loss / num_items_in_batch", got2.loss, ref2.loss)
    # return_dict=False: a tuple that starts with the loss
    tup = model(input_ids=ids, attention_mask=am, labels=labels, return_dict=False)
    assert isinstance(tup, tuple)
    assert_close(f"{family} tuple loss", tup[0], got.loss)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_without_labels_is_the_original_forward(family):
    model = build(family)
    ids, am, _ = batch(2)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=am).logits
        spanhead.hf.patch(model)
        spanhead.hf.patch(model)  # idempotent
        got = model(input_ids=ids, attention_mask=am).logits
    assert torch.equal(got, ref)
    spanhead.hf.unpatch(model)
    assert not spanhead.hf.is_patched(model)


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_helper(family, temperature):
    model = build(family)
    ids, am, _ = batch(3)
    resp = torch.zeros_like(am)
    resp[:, 5:] = 1  # score the "response" only
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=am).logits.double() / temperature
    lsm = torch.log_softmax(logits, -1)
    nxt = torch.nn.functional.pad(ids[:, 1:], (0, 1))
    valid = torch.nn.functional.pad(am[:, 1:], (0, 1)).bool() & resp.bool()
    want_lp = lsm.gather(-1, nxt[..., None])[..., 0] * valid
    want_ent = -(lsm.exp() * lsm).sum(-1) * valid

    out = spanhead.hf.logprobs(model, ids, attention_mask=am, loss_mask=resp,
                               temperature=temperature, entropy=True)
    assert out.logprob.shape == ids.shape
    assert_close("logprob", out.logprob, want_lp)
    assert_close("entropy", out.entropy, want_ent)
    # differentiable: the gradient of sum(logprob) equals the dense path's
    model.zero_grad(set_to_none=True)
    spanhead.hf.logprobs(model, ids, attention_mask=am, loss_mask=resp,
                         temperature=temperature).sum().backward()
    g = model.lm_head.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    dense = torch.log_softmax(model(input_ids=ids, attention_mask=am).logits.float()
                              / temperature, -1)
    (dense.gather(-1, nxt[..., None])[..., 0] * valid).sum().backward()
    assert_close("dlm_head", g, model.lm_head.weight.grad)


def test_unsupported_model_is_refused_by_name():
    cfg = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=16)
    model = transformers.GPT2LMHeadModel(cfg)
    fwd = model.forward
    with pytest.raises(spanhead.UnsupportedError, match="GPT2LMHeadModel"):
        spanhead.hf.patch(model)
    assert model.forward == fwd and not spanhead.hf.is_patched(model)
    with pytest.raises(spanhead.UnsupportedError, match="GPT2LMHeadModel"):
        spanhead.hf.logprobs(model, torch.zeros(1, 4, dtype=torch.long))


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_unpatch_restores_logits_and_the_original_loss(family):
    """After unpatch a forward with labels is the unpatched model's again: logits come back,
    the same loss and gradients as before the patch (and the patched one in between had
    none)."""
    model = build(family)
    ids, am, labels = batch(4)
    ref, ref_g = loss_and_grads(model, input_ids=ids, attention_mask=am, labels=labels)
    spanhead.hf.patch(model)
    mid, mid_g = loss_and_grads(model, input_ids=ids, attention_mask=am, labels=labels)
    assert mid.logits is None
    spanhead.hf.unpatch(model)
    spanhead.hf.unpatch(model)  # idempotent
    assert not spanhead.hf.is_patched(model)
    got, got_g = loss_and_grads(model, input_ids=ids, attention_mask=am, labels=labels)
    assert got.logits is not None and got.logits.shape == ref.logits.shape
    assert torch.equal(got.logits, ref.logits)
    assert torch.equal(got.loss, ref.loss)
    for n in ref_g:
        assert torch.equal(got_g[n], ref_g[n]), f"{family} d{n} after unpatch"
        assert_close(f"{family} patched d{n}", mid_g[n], ref_g[n])


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_generation_without_labels_patched_equals_unpatched(family):
    """generate() (no labels; the KV cache and logits_to_keep forwarded) gives the same tokens
    and scores patched as unpatched, greedy, with a padded batch."""
    model = build(family, seed=5).eval()
    ids, am, _ = batch(6, S=7)
    left = torch.ones_like(am)
    left[1, :2] = 0  # left padding for generation
    kw = dict(input_ids=ids, attention_mask=left, max_new_tokens=6, do_sample=False,
              pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        ref = model.generate(**kw)
        spanhead.hf.patch(model)
        got = model.generate(**kw)
        nocache = model.generate(**kw, use_cache=False)
    assert spanhead.hf.is_patched(model)
    assert torch.equal(got.sequences, ref.sequences)
    assert torch.equal(nocache.sequences, ref.sequences)
    for a, b in zip(got.scores, ref.scores):
        assert torch.equal(a, b)
    spanhead.hf.unpatch(model)
