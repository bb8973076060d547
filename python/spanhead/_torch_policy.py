"""``spanhead::policy_loss``: the fused RL policy loss as a torch.library operator (the pattern
of ``_torch_ops.py``), and :func:`policy_loss`, re-exported by :mod:`spanhead.torch`.

One spanhead call computes logprob, entropy, the loss, its metrics and (when hidden / weight
need gradients) dhidden and dweight: ppo and cispo inside the head's one-pass sweep, gspo as
forward + rho + backward in the same call. The backward makes no spanhead call: it hands the
stored gradients over scaled by the loss's incoming gradient (as ``weighted_loss`` does). With
``sum_p2=True`` / ``topk=K`` the same call also returns the head's extras of the loss's rows
(no gradient).
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional

import torch

from . import _spanhead as _ext
from . import _torch_ops as _ops
from ._errors import DTypeError, InvalidArgumentError, ShapeError
from .policy import METRICS, config

_LIB = "spanhead"


# The operator's non-tensor arguments travel in two lists (torch's custom-op dispatch walks its
# schema once per argument per call: with 38 scalar arguments that walk alone measured 0.86 ms
# of host time per call here, more than the pre-pass and metrics kernels of a 16K-row step).
#   fl: clip_low, clip_high, clip_ratio_c, kl_coef, entropy_coef, norm_length, temperature,
#       softcap
#   it: loss_type, kl_type, agg, num_tokens, num_seqs, need_dhidden, need_dweight, seq_comm,
#       gap, vocab_start, vocab_total, reduce_dhidden, comm, threads, allow_tf32,
#       batch_invariant, chunk_rows, chunk_bytes, sum_p2, topk (the head's extras: 0 = none)
_IT_NEED_H, _IT_NEED_W, _IT_SP2, _IT_TOPK = 5, 6, 18, 19


@torch.library.custom_op(f"{_LIB}::policy_loss", mutates_args=())
def policy_loss_op(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   mask: Optional[torch.Tensor], spans: Optional[torch.Tensor],
                   advantages: torch.Tensor, old: torch.Tensor, ref: Optional[torch.Tensor],
                   isw: Optional[torch.Tensor], seq: Optional[torch.Tensor], fl: List[float],
                   it: List[int], kernel: Optional[str], tune_cache: Optional[str],
                   trows: Optional[torch.Tensor]) -> List[torch.Tensor]:
    """(loss (0-d), metrics (9,), logprob (N,), entropy (N,), dhidden, dweight, sum_p2 (N,),
    topk_ids (N, K), topk_logprobs (N, K)); the gradients and the extras are empty when not
    needed. trows: per-row temperatures (N,) float32 or None."""
    clip_low, clip_high, clip_ratio_c, kl_coef, entropy_coef, norm_length, temperature, \
        softcap = fl
    (loss_type, kl_type, agg, num_tokens, num_seqs, need_dhidden, need_dweight, seq_comm, gap,
     vocab_start, vocab_total, reduce_dhidden, comm, threads, allow_tf32, batch_invariant,
     chunk_rows, chunk_bytes, want_sp2, K) = it
    N = hidden.shape[0]
    dev = hidden.device
    f32 = dict(dtype=torch.float32, device=dev)
    lp, ent = torch.empty(N, **f32), torch.empty(N, **f32)
    met = torch.empty(len(METRICS), **f32)
    sp2 = torch.empty(N, **f32) if want_sp2 else None
    tki = torch.empty((N, K), dtype=torch.int64, device=dev) if K else None
    tkl = torch.empty((N, K), **f32) if K else None
    dh = dw = None
    if need_dhidden:
        dt = torch.float32 if reduce_dhidden else hidden.dtype
        dh = torch.empty(hidden.shape, dtype=dt, device=dev)
    if need_dweight:
        dw = torch.empty(weight.shape, dtype=weight.dtype, device=dev)
    m, sp = _ops.resolve_mask(hidden, mask, spans, gap)
    opts = _ops.Opts(threads, kernel, bool(allow_tf32), bool(batch_invariant), chunk_rows,
                     chunk_bytes, tune_cache)
    ctx = _ops.context_for(dev, _ops.comm_of(comm), **opts._asdict())
    group = _ops.comm_of(seq_comm)
    caps = tuple(_ops._cap(t) for t in (hidden, weight, targets, m, lp, ent, None, dh, dw,
                                        advantages, old, ref, isw, seq, met, trows, sp2,
                                        tki, tkl))

    def alloc(nbytes: int):
        return _ops._cap(torch.empty(nbytes, dtype=torch.uint8, device=dev))

    cfg = (loss_type, clip_low, clip_high, clip_ratio_c, kl_type, kl_coef, entropy_coef, agg,
           num_tokens, num_seqs, norm_length)
    _ext.policy_loss(ctx._live(), caps, None if sp is None else sp.__dlpack__(), alloc,
                     vocab_start, vocab_total, temperature, softcap, 0, 0,
                     int(bool(reduce_dhidden) and dh is not None), cfg,
                     None if group is None else group._handle)
    if dh is not None and dh.dtype != hidden.dtype:
        dh = dh.to(hidden.dtype)
    empty_h = torch.empty(0, dtype=hidden.dtype, device=dev)
    empty_w = torch.empty(0, dtype=weight.dtype, device=dev)
    # (each absent output its own empty tensor: a custom op's outputs may not alias)
    return [met[0].clone(), met, lp, ent, dh if dh is not None else empty_h,
            dw if dw is not None else empty_w,
            sp2 if sp2 is not None else torch.empty(0, **f32),
            tki if tki is not None else torch.empty(0, dtype=torch.int64, device=dev),
            tkl if tkl is not None else torch.empty(0, **f32)]


@policy_loss_op.register_fake
def _policy_loss_fake(hidden, weight, targets, mask, spans, advantages, old, ref, isw, seq,
                      fl, it, *args):
    N = hidden.shape[0]
    need_h, need_w, sp2, K = it[_IT_NEED_H], it[_IT_NEED_W], it[_IT_SP2], it[_IT_TOPK]
    return [hidden.new_empty((), dtype=torch.float32),
            hidden.new_empty((len(METRICS),), dtype=torch.float32),
            hidden.new_empty((N,), dtype=torch.float32),
            hidden.new_empty((N,), dtype=torch.float32),
            hidden.new_empty(hidden.shape if need_h else (0,)),
            weight.new_empty(weight.shape if need_w else (0,)),
            hidden.new_empty((N,) if sp2 else (0,), dtype=torch.float32),
            hidden.new_empty((N, K) if K else (0,), dtype=torch.int64),
            hidden.new_empty((N, K) if K else (0,), dtype=torch.float32)]


_N_INPUTS = 15


def _setup(ctx, inputs, output):
    _, met, lp, ent, dh, dw = output[:6]
    ctx.save_for_backward(dh, dw)
    ctx.mark_non_differentiable(met, lp, ent, dh, dw, *output[6:])
    ctx.set_materialize_grads(False)
    ctx.need = (inputs[11][_IT_NEED_H], inputs[11][_IT_NEED_W])
    ctx.used = False


def _backward(ctx, grads):
    g_loss = grads[0]
    none = (None,) * _N_INPUTS
    if getattr(ctx, "used", False):
        raise RuntimeError("policy_loss: backward called a second time; the gradients were "
                           "computed in the forward and are handed over once (retain_graph "
                           "is not supported)")
    ctx.used = True
    dh, dw = ctx.saved_tensors
    if g_loss is None:
        return none
    g = g_loss.reshape(())
    # traced (torch.compile's AOT backward: fake / functional tensors, which torch 2.11 does
    # not flag through is_compiling()) takes the torch ops; real tensors the library call
    compiling = torch.compiler.is_compiling() or type(dh) is not torch.Tensor or \
        type(dw) is not torch.Tensor
    gh = gw = None
    # the stored gradients are this operator's own outputs, held only here: eager mode scales
    # them in place; g stays on the device (no host sync)
    want_h = ctx.need[0] and ctx.needs_input_grad[0]
    want_w = ctx.need[1] and ctx.needs_input_grad[1]
    if compiling:
        gh = dh * g.to(dh.dtype) if want_h else None
        gw = dw * g.to(dw.dtype) if want_w else None
    elif want_h or want_w:
        gh, gw = (dh if want_h else None), (dw if want_w else None)
        _ops.scale_stored(g, gh, gw)
    return (gh, gw) + none[2:]


policy_loss_op.register_autograd(_backward, setup_context=_setup)


class PolicyOutputs(NamedTuple):
    """What :func:`policy_loss` returns: the differentiable 0-dim loss, the detached float32
    per-row log-probs and entropies (targets' shape; 0 on inactive rows) and the metrics
    (name -> detached 0-dim float32 tensor on hidden's device: no host sync)."""

    loss: torch.Tensor
    logprob: torch.Tensor
    entropy: torch.Tensor
    metrics: Dict[str, torch.Tensor]


class PolicyOutputsExtras(NamedTuple):
    """What :func:`policy_loss` returns with ``sum_p2=True`` or ``topk=K`` (a separate type,
    so that the 4-tuple of :class:`PolicyOutputs` stays as it was): its four fields, then the
    head's extras of the loss's rows, detached (no gradient): sum_p2 float32 (targets' shape;
    None unless asked), topk_ids int64 (..., K) global ids (descending probability, ties the
    lower id first) and topk_logprobs float32 (..., K) (None unless ``topk=K``); rows without
    loss get 0, -1 and 0."""

    loss: torch.Tensor
    logprob: torch.Tensor
    entropy: torch.Tensor
    metrics: Dict[str, torch.Tensor]
    sum_p2: Optional[torch.Tensor]
    topk_ids: Optional[torch.Tensor]
    topk_logprobs: Optional[torch.Tensor]


def _row(x: Any, name: str, N: int, lead: tuple, device: torch.device,
         dtype: torch.dtype) -> Optional[torch.Tensor]:
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        raise DTypeError(f"{name}: expected a torch tensor, got {type(x).__name__}")
    if tuple(x.shape) != lead:
        raise ShapeError(f"{name}: shape is {tuple(x.shape)}, expected {lead} (targets' shape)")
    if x.device != device:
        raise InvalidArgumentError(f"{name} is on {x.device} but hidden is on {device}")
    if dtype == torch.int64 and x.is_floating_point():
        raise DTypeError(f"{name}: dtype is {x.dtype}, expected integers (sequence ids)")
    return x.detach().reshape(N).to(dtype).contiguous()


def _seq_key(seq_group: Any) -> int:
    """The operator's integer for seq_group (a spanhead.Comm or None): the Comm's own key, an
    attribute read that torch.compile traces as a constant."""
    if seq_group is None:
        return 0
    from .comm import Comm
    if not isinstance(seq_group, Comm):
        raise InvalidArgumentError(f"seq_group: {type(seq_group).__name__}, expected a "
                                   "spanhead.Comm or None")
    return seq_group._key


def policy_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                advantages: torch.Tensor, old_logprobs: torch.Tensor, *, loss_mask: Any,
                loss_type: str = "ppo", clip_low: float = 0.2, clip_high: float = 0.2,
                clip_ratio_c: Optional[float] = None, ref_logprobs: Optional[torch.Tensor] = None,
                kl_type: str = "none", kl_coef: float = 0.0, entropy_coef: float = 0.0,
                agg: str = "token-mean", seq_ids: Optional[torch.Tensor] = None,
                num_tokens: Optional[int] = None, num_seqs: Optional[int] = None,
                norm_length: Optional[float] = None, is_weights: Optional[torch.Tensor] = None,
                spans: Any = None, temperature: float = 1.0, softcap: float = 0.0,
                tp_group: Any = None, vocab_start: int = 0, vocab_total: int = 0,
                seq_group: Any = None, gap: int = 0, reduce_dhidden: Optional[bool] = None,
                sum_p2: bool = False, topk: int = 0, **context_options: Any) -> PolicyOutputs:
    """An RL policy loss (PPO / GRPO / DAPO / Dr. GRPO clipping, CISPO, GSPO, with a KL
    penalty and an entropy bonus) of the per-token log-probs of ``targets``, computed with its
    gradients inside spanhead's LM-head sweep: ppo and cispo cost what the one-pass weighted
    loss costs (6 N H V flops: no second logits pass), gspo runs forward, per-sequence ratio
    and backward in the same call (8 N H V). The math: :mod:`spanhead.policy` and
    docs/policy.md; it matches verl's ``compute_policy_loss`` + ``kl_penalty`` +
    ``agg_loss`` written in torch on top of :func:`logprobs` (ties as torch's autograd).

    Args:
        hidden, weight, targets, loss_mask, spans, temperature, softcap, tp_group,
            vocab_start, vocab_total, gap, reduce_dhidden, context_options: as in
            :func:`logprobs`. A row carries loss when loss_mask is 1 and targets >= 0.
        advantages, old_logprobs: per-token constants, targets' shape, on hidden's device.
        loss_type: "ppo" | "cispo" | "gspo"; clip_low, clip_high: the clip range
            [1 - clip_low, 1 + clip_high]; clip_ratio_c: dual-clip bound (> 1; None = none).
        ref_logprobs, kl_type ("none" | "k1" | "k2" | "k3"; also "kl", "mse", "low_var_kl"),
            kl_coef: the KL penalty; entropy_coef: the entropy bonus (subtracted).
        agg: "token-mean" | "seq-mean-token-sum" | "seq-mean-token-mean" |
            "seq-mean-token-sum-norm"; seq_ids (int, targets' shape; required by the seq-*
            aggregations and gspo), num_tokens / num_seqs (a global batch's T / S: the
            micro-batches' losses and metrics then add up), norm_length (seq-mean-token-sum-norm).
        is_weights: optional per-token constant multipliers of the policy term.
        seq_group: a spanhead.Comm over the ranks holding other rows of the same sequences
            (context parallelism; :func:`spanhead.sequence_group`).
        sum_p2, topk: the head's extras of the loss's rows, as in :func:`logprobs` (no
            gradient; computed in the same sweep, merged over the TP group): sum_j p_ij^2 and
            the K (1..256, <= vocab_total) most probable ids with their log-probs.

    Returns:
        :class:`PolicyOutputs` (loss, logprob, entropy, metrics); with sum_p2 or topk a
        :class:`PolicyOutputsExtras` (the same plus sum_p2, topk_ids, topk_logprobs).
        ``loss.backward()`` hands the gradients computed in the forward to hidden and weight
        (once; no retain_graph).
    """
    from .torch import _prepare
    if targets is None:
        raise InvalidArgumentError("targets: required (the loss needs the log-probs of targets)")
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 0:
        raise InvalidArgumentError(f"topk: {topk!r}, expected an int K >= 1 (0 = none)")
    cfg = config(loss_type, clip_low, clip_high, clip_ratio_c, kl_type, kl_coef, entropy_coef,
                 agg, num_tokens, num_seqs, norm_length)
    p = _prepare(hidden, weight, targets, None, loss_mask, spans, gap, tp_group, vocab_start,
                 vocab_total, temperature, softcap, reduce_dhidden, context_options)
    h2 = p.hidden
    N, dev = h2.shape[0], h2.device
    rows = [_row(advantages, "advantages", N, p.lead, dev, torch.float32),
            _row(old_logprobs, "old_logprobs", N, p.lead, dev, torch.float32),
            _row(ref_logprobs, "ref_logprobs", N, p.lead, dev, torch.float32),
            _row(is_weights, "is_weights", N, p.lead, dev, torch.float32),
            _row(seq_ids, "seq_ids", N, p.lead, dev, torch.int64)]
    if rows[0] is None or rows[1] is None:
        raise InvalidArgumentError("advantages and old_logprobs are required")
    grad = torch.is_grad_enabled()
    need_h = grad and h2.requires_grad
    need_w = grad and p.weight.requires_grad
    (loss_type, clip_low, clip_high, clip_ratio_c, kl_type, kl_coef, entropy_coef, agg,
     num_tokens, num_seqs, norm_length) = cfg
    (gap, vocab_start, vocab_total, temperature, softcap, reduce_dh, comm, threads, kernel,
     allow_tf32, batch_invariant, chunk_rows, chunk_bytes, tune_cache) = p.tail
    fl = [clip_low, clip_high, clip_ratio_c, kl_coef, entropy_coef, norm_length, temperature,
          softcap]
    it = [loss_type, kl_type, agg, num_tokens, num_seqs, int(need_h), int(need_w),
          _seq_key(seq_group), gap, vocab_start, vocab_total, int(reduce_dh), comm,
          threads, int(allow_tf32), int(batch_invariant), chunk_rows, chunk_bytes,
          int(bool(sum_p2)), topk]
    out = policy_loss_op(h2, p.weight, p.targets, p.mask, p.spans, *rows, fl, it, kernel,
                         tune_cache, p.trows)
    loss, met, lp, ent = out[0], out[1], out[2], out[3]
    metrics = {k: met[i] for i, k in enumerate(METRICS)}
    res = (loss, lp.reshape(p.lead), ent.reshape(p.lead), metrics)
    if not sum_p2 and not topk:
        return PolicyOutputs(*res)
    return PolicyOutputsExtras(*res, sum_p2=out[6].reshape(p.lead) if sum_p2 else None,
                               topk_ids=out[7].reshape(p.lead + (topk,)) if topk else None,
                               topk_logprobs=out[8].reshape(p.lead + (topk,)) if topk else None)


__all__ = ["policy_loss", "PolicyOutputs", "PolicyOutputsExtras", "policy_loss_op"]
