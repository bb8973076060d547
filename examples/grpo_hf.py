"""One GRPO step on a tiny Hugging Face model with spanhead's LM head, against the same step in
plain torch.

A Qwen3-style causal LM is built from a config with random weights (no hub access). Each of
P prompts gets G sampled responses; a toy reward (how many response tokens fall in the upper
half of the vocabulary) gives group-normalized advantages, A = (r - mean_group) /
(std_group + 1e-6); the PPO-clipped policy loss (clip range [1 - 0.2, 1 + 0.28]: DAPO's
asymmetric clip) is averaged over the response tokens (token-mean), with old log-probs from
the sampling policy. Three ways to the same loss and gradients:

  torch     the model's full logits -> log_softmax -> gather -> clipped loss (what a
            framework does without a fused head)
  general   spanhead.hf.logprobs (no logits) -> the same clipped loss in torch
  fused     spanhead.torch.policy_loss: logprobs, the clipped loss and its gradients in one
            LM-head sweep (when this spanhead has it)

The script checks that the spanhead paths give the torch loss and gradients (float32
tolerance), then takes an optimizer step with the fused (or general) path and prints the loss
before and after. Exit status 1 on a mismatch.

    python examples/grpo_hf.py [--device cuda] [--steps 3]
"""

import argparse
import sys

import torch
import torch.nn.functional as F

import spanhead.hf
import spanhead.torch as sht

CLIP_LOW, CLIP_HIGH = 0.2, 0.28


def tiny_model(device, seed=0):
    import transformers
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   vocab_size=503, max_position_embeddings=128,
                                   attn_implementation="eager")
    torch.manual_seed(seed)
    return transformers.Qwen3ForCausalLM(cfg).to(device).float()


@torch.no_grad()
def rollout(model, P, G, prompt_len, resp_len, device, gen):
    """Samples G responses per prompt; returns input_ids (P*G, S), the response mask over the
    *predicting* positions (position t predicts token t+1) and the sampler's log-probs."""
    V = model.config.vocab_size
    prompts = torch.randint(0, V, (P, prompt_len), generator=gen).to(device)
    ids = prompts.repeat_interleave(G, 0)
    for _ in range(resp_len):
        logits = model(input_ids=ids).logits[:, -1].float()
        nxt = torch.multinomial(torch.softmax(logits, -1).cpu(), 1, generator=gen).to(device)
        ids = torch.cat([ids, nxt], 1)
    S = ids.shape[1]
    mask = torch.zeros(P * G, S, dtype=torch.bool, device=device)
    mask[:, prompt_len - 1:S - 1] = True
    targets = F.pad(ids[:, 1:], (0, 1), value=0)
    old = spanhead.hf.logprobs(model, ids, targets=targets, loss_mask=mask)  # no grad
    return ids, targets, mask, old


def advantages(ids, P, G, prompt_len, V):
    r = (ids[:, prompt_len:] >= V // 2).float().sum(1).reshape(P, G)
    a = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)
    return a.reshape(-1)


def clipped_loss(lp, old, adv_tok, mask):
    ratio = torch.exp(lp - old)
    pg = torch.maximum(-adv_tok * ratio, -adv_tok * ratio.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH))
    m = mask.float()
    return (pg * m).sum() / m.sum()


def loss_torch(model, ids, targets, mask, old, adv_tok):
    logits = model(input_ids=ids).logits.float()
    lp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0] * mask
    return clipped_loss(lp, old, adv_tok, mask)


def loss_general(model, ids, targets, mask, old, adv_tok):
    lp = spanhead.hf.logprobs(model, ids, targets=targets, loss_mask=mask)
    return clipped_loss(lp, old, adv_tok, mask)


def loss_fused(model, ids, targets, mask, old, adv_tok):
    hidden = model.model(input_ids=ids).last_hidden_state
    out = sht.policy_loss(hidden, model.lm_head.weight, targets, adv_tok, old, loss_mask=mask,
                          loss_type="ppo", clip_low=CLIP_LOW, clip_high=CLIP_HIGH,
                          agg="token-mean")
    return out.loss


def grads_of(model, fn, *args):
    model.zero_grad(set_to_none=True)
    loss = fn(model, *args)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()
                           if p.grad is not None}


def compare(name, got, want, tol=5e-5):
    loss_g, g_g = got
    loss_w, g_w = want
    worst = abs(loss_g.item() - loss_w.item()) / max(1.0, abs(loss_w.item()))
    for n, g in g_w.items():
        d = (g_g[n].double() - g.double()).abs().max().item() / max(1.0, g.abs().max().item())
        worst = max(worst, d)
    ok = worst <= tol
    print(f"{name:8s} loss {loss_g.item():+.6f} (torch {loss_w.item():+.6f})  worst relative "
          f"diff over loss and {len(g_w)} gradients {worst:.2e}  {'ok' if ok else 'MISMATCH'}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    gen = torch.Generator().manual_seed(a.seed)
    model = tiny_model(a.device, a.seed)
    V = model.config.vocab_size
    prompt_len, resp_len = 6, 10
    ids, targets, mask, old = rollout(model, a.prompts, a.group, prompt_len, resp_len,
                                      a.device, gen)
    # the policy moved since sampling (as after a first mini-batch): perturb the old log-probs
    # so some ratios leave the clip range and the clipped branch is exercised
    old = old + 0.3 * torch.randn(old.shape, generator=gen).to(a.device) * mask
    adv = advantages(ids, a.prompts, a.group, prompt_len, V)
    adv_tok = adv[:, None].expand_as(mask).contiguous()
    args = (ids, targets, mask, old, adv_tok)

    ref = grads_of(model, loss_torch, *args)
    ok = compare("general", grads_of(model, loss_general, *args), ref)
    fused = hasattr(sht, "policy_loss")
    if fused:
        ok &= compare("fused", grads_of(model, loss_fused, *args), ref)
    else:
        print("fused    spanhead.torch.policy_loss is not in this spanhead: skipped")
    step_fn = loss_fused if fused else loss_general
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for s in range(a.steps):
        opt.zero_grad(set_to_none=True)
        loss = step_fn(model, *args)
        loss.backward()
        opt.step()
        print(f"step {s}: loss {loss.item():+.6f} ({'fused' if fused else 'general'} path)")
    after = step_fn(model, *args).item()
    print(f"after {a.steps} steps: loss {after:+.6f} (lower is better: the clipped surrogate)")
    if not ok:
        print("grpo_hf: spanhead and torch disagree", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
