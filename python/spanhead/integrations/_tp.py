"""Vocabulary-parallel log-probs and entropy over a torch.distributed group that spanhead does
not drive itself (gloo, for one: spanhead's TP path needs NCCL or a spanhead.Comm).

Each rank runs spanhead on its shard for the shard's log-sum-exp ``l_r`` and entropy ``H_r``
(every row), and gathers the target logits it owns with a row gather (O(N H)); three
all-reduces combine them:

    L = log sum_r exp(l_r)                   (after a max-shift)
    logprob = sum_r [target in shard r] z_t - L
    entropy = L - sum_r exp(l_r - L) (l_r - H_r)      (E_p[z] = sum_r p(shard r) E_{p_r}[z])

(each all-reduce sums rank-local terms only; what follows it is computed alike on every rank)

The all-reduce is Megatron's ``reduce_from_tensor_model_parallel_region``: a sum forward and
the identity backward, because every rank computes the same downstream loss from the
combined values; so each rank's gradients are its shard's: ``d_weight`` of the shard and the
partial ``d_hidden`` (verl's and SkyRL's contract: their callers reduce it).
"""
from __future__ import annotations

from typing import Any, Tuple

import torch

from .. import torch as _sht


def uses_torch_combine(group: Any) -> bool:
    """True for a torch.distributed group of more than one rank whose backend is not NCCL."""
    if group is None:
        return False
    import torch.distributed as dist
    if not isinstance(group, dist.ProcessGroup) or dist.get_world_size(group) < 2:
        return False
    return dist.get_backend(group) != "nccl"


class _ReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        import torch.distributed as dist
        y = x.clone()
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=group)
        return y

    @staticmethod
    def backward(ctx, g):
        return g, None


def logprob_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                    vocab_start: int, group: Any, temperature: Any = 1.0,
                    want_entropy: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """(logprob, entropy) of ``targets`` (global ids, (N,); < 0: ignored, logprob 0) under the
    softmax over every rank's shard; float32 (N,). ``hidden`` (N, H), ``weight`` this rank's
    (V_loc, H) rows ``[vocab_start, vocab_start + V_loc)``. ``temperature``: a number or a
    per-row (N,) tensor."""
    import torch.distributed as dist
    v_loc = weight.shape[0]
    out = _sht.logprobs(hidden, weight, None, lse=True, entropy=want_entropy,
                        temperature=temperature)
    lse_r = out.lse
    m = lse_r.detach().clone()
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    s = _ReduceSum.apply(torch.exp(lse_r - m), group)
    L = torch.log(s) + m
    own = (targets >= vocab_start) & (targets < vocab_start + v_loc)
    idx = torch.where(own, targets - vocab_start, torch.zeros_like(targets))
    if isinstance(temperature, torch.Tensor):  # per row: z_t / T_i in float32, as the kernels
        zt = (hidden.float() * weight.float().index_select(0, idx)).sum(-1) * \
            (1.0 / temperature.detach().to(torch.float32))
    else:
        zt = (hidden.float() * weight.float().index_select(0, idx)).sum(-1) / temperature
    zt = torch.where(own, zt, torch.zeros_like(zt))
    z_target = _ReduceSum.apply(zt, group)
    lp = torch.where(targets >= 0, z_target - L, torch.zeros_like(L))
    ent = None
    if want_entropy:
        # E_p[z] = sum_r e^(l_r - m) E_{p_r}[z] / s: both sums of rank-local terms (m is a
        # constant), so the identity backward is exact (a replicated L inside a rank's term
        # would not be: its gradient would need the other ranks' terms)
        ez = _ReduceSum.apply(torch.exp(lse_r - m) * (lse_r - out.entropy), group) / s
        ent = L - ez
    return lp, ent
