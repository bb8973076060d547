#!/usr/bin/env python3
"""GRPO and DAPO steps through spanhead.torch.policy_loss, checked against the same loss
written in PyTorch the way verl writes it (dense logits, log_softmax, compute_policy_loss,
kl_penalty, agg_loss).

The toy: a frozen body gives the hidden states of G sampled responses for each of P prompts
(a packed batch, prompt rows masked out), a trainable LM head W (V x H) and a frozen reference
head. Rewards are per response; GRPO advantages are the group-normalized rewards, broadcast to
the response's tokens. Each step is a few PPO epochs of mini-batch updates of W, the old
log-probs fixed at the start of the step (so the ratio moves away from 1 and clipping starts):

    GRPO: clip 0.2 / 0.2, k3 KL to the reference (0.001), seq-mean-token-mean
    DAPO: clip-higher 0.2 / 0.28, dual clip 3, no KL, token-mean (over the global batch:
          num_tokens of the whole step, so the mini-batches' losses add up)

For every update the script prints spanhead's loss and metrics and the agreement with the
torch formulation: |loss difference| and the max relative difference of dL/dW and dL/dhidden.

    python examples/grpo_step.py                      # CPU, float32
    python examples/grpo_step.py --device cuda --dtype bfloat16
"""

import argparse
import sys

import torch

import spanhead.torch as sht

V, H, PROMPT = 96, 48, 5


def toy_batch(gen, P, G, device, dtype):
    """Packed rows of P prompts x G responses: hidden (N, H), targets, loss mask (response
    rows), sequence ids, rewards per sequence."""
    hs, ts, ms, ss, rewards = [], [], [], [], []
    for p in range(P):
        for g in range(G):
            n = PROMPT + int(torch.randint(4, 13, (1,), generator=gen))
            hs.append(torch.tanh(torch.randn(n, H, generator=gen)))
            tok = torch.randint(0, V, (n,), generator=gen)
            t = tok.roll(-1)
            t[-1] = -100                       # the last row predicts nothing
            ts.append(t)
            m = torch.zeros(n, dtype=torch.bool)
            m[PROMPT - 1:n - 1] = True         # rows predicting the response tokens
            ms.append(m)
            ss.append(torch.full((n,), p * G + g))
            # reward: share of "good" tokens (the first quarter of the vocabulary)
            rewards.append(((tok[PROMPT:] < V // 4).float().mean()).item())
    cat = torch.cat
    return (cat(hs).to(device, dtype), cat(ts).to(device), cat(ms).to(device),
            cat(ss).to(device), torch.tensor(rewards))


def grpo_advantages(rewards, P, G, seq):
    r = rewards.view(P, G)
    a = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)
    return a.reshape(-1).to(seq.device)[seq]


def torch_formulation(h, W, t, mask, adv, old, ref, seq, cfg):
    """verl's policy loss on dense logits (float32), flattened rows with a mask."""
    logits = h.float() @ W.float().T
    logp_all = torch.log_softmax(logits, -1)
    act = (mask & (t >= 0)).float()
    logp = logp_all.gather(-1, t.clamp(min=0)[:, None])[:, 0] * act
    ent = -(logp_all.exp() * logp_all).sum(-1) * act
    neg_kl = logp - old
    ratio = torch.exp(torch.clamp(neg_kl, -20.0, 20.0))
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1 - cfg["clip_low"], 1 + cfg["clip_high"])
    pg = torch.maximum(pg1, pg2)
    if cfg.get("clip_ratio_c") is not None:
        pg3 = -adv * cfg["clip_ratio_c"]
        pg = torch.where(adv < 0, torch.min(pg3, pg), pg)
    kl = torch.zeros_like(logp)
    if cfg.get("kl_type", "none") == "k3":
        x = torch.clamp(ref - logp, -20, 20)
        kl = torch.clamp(torch.exp(x) - x - 1, -10, 10)
    row = pg + cfg.get("kl_coef", 0.0) * kl - cfg.get("entropy_coef", 0.0) * ent
    if cfg["agg"] == "token-mean":
        T = cfg.get("num_tokens") or act.sum()
        return (row * act).sum() / T
    uniq, inv = torch.unique(seq, return_inverse=True)
    cnt = torch.zeros(len(uniq), device=h.device).index_add_(0, inv, act)
    S = (cnt > 0).sum()
    return (row * act / cnt[inv].clamp(min=1)).sum() / S  # seq-mean-token-mean


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-12)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--minibatches", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--kernel", default=None, help="spanhead kernel (ref, generic, avx2, ...)")
    args = ap.parse_args()
    dev, dt = torch.device(args.device), getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(1234)
    W = (torch.randn(V, H, generator=gen) * 0.3).to(dev, dt).requires_grad_(True)
    W_ref = W.detach().clone()
    opts = {"kernel": args.kernel} if args.kernel else {}
    configs = {
        "GRPO": dict(loss_type="ppo", clip_low=0.2, clip_high=0.2, kl_type="k3", kl_coef=0.001,
                     agg="seq-mean-token-mean"),
        "DAPO": dict(loss_type="ppo", clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0,
                     agg="token-mean"),
    }
    tol_loss = 1e-4 if dt == torch.float32 else 2e-2
    worst = 0.0
    for name, cfg in configs.items():
        print(f"== {name}: {cfg}")
        for step in range(args.steps):
            h, t, mask, seq, rewards = toy_batch(gen, args.prompts, args.group, dev, dt)
            adv = grpo_advantages(rewards, args.prompts, args.group, seq)
            with torch.no_grad():  # the sampler's and the reference's log-probs
                old = sht.logprobs(h, W, t, loss_mask=mask, **opts).float()
                ref = sht.logprobs(h, W_ref, t, loss_mask=mask, **opts).float()
            n_seq = args.prompts * args.group
            step_cfg = dict(cfg)
            if cfg["agg"] == "token-mean":
                step_cfg["num_tokens"] = int((mask & (t >= 0)).sum())  # the step's tokens
            for epoch in range(args.epochs):
                for mb in range(args.minibatches):
                    rows = (seq % args.minibatches) == mb  # whole sequences per mini-batch
                    hb = h[rows].detach().requires_grad_(True)
                    sl = dict(loss_mask=mask[rows], ref_logprobs=ref[rows], seq_ids=seq[rows])
                    loss, logp, ent, met = sht.policy_loss(hb, W, t[rows], adv[rows], old[rows],
                                                           **sl, **step_cfg, **opts)
                    loss.backward()
                    gW, gh = W.grad.clone(), hb.grad.clone()
                    W.grad = None
                    # the same loss in torch (dense logits), its gradients by autograd
                    W2 = W.detach().clone().requires_grad_(True)
                    h2 = h[rows].detach().clone().requires_grad_(True)
                    tl = torch_formulation(h2, W2, t[rows], mask[rows], adv[rows], old[rows],
                                           ref[rows], seq[rows], step_cfg)
                    tl.backward()
                    d_loss = abs(loss.item() - tl.item())
                    d_w, d_h = rel(gW, W2.grad), rel(gh, h2.grad)
                    worst = max(worst, d_loss / max(1.0, abs(tl.item())))
                    m = {k: round(v.item(), 5) for k, v in met.items()
                         if k in ("pg_loss", "kl_loss", "pg_clipfrac", "pg_clipfrac_lower",
                                  "ppo_kl")}
                    print(f"step {step} epoch {epoch} mb {mb}  loss {loss.item():+.6f}  "
                          f"torch {tl.item():+.6f}  |d loss| {d_loss:.1e}  dW rel {d_w:.1e}  "
                          f"dh rel {d_h:.1e}  {m}")
                    with torch.no_grad():
                        W -= args.lr * gW
            print(f"step {step}: mean reward {rewards.mean().item():.3f}")
    ok = worst <= tol_loss
    print(f"agreement with the torch formulation: worst relative loss difference {worst:.2e} "
          f"({'PASS' if ok else 'FAIL'}, tolerance {tol_loss:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
