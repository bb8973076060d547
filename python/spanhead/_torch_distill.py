"""``spanhead::distill_loss``: the fused distillation loss as a torch.library operator (the
pattern of ``_torch_policy.py``), and :func:`distill_loss`, re-exported by
:mod:`spanhead.torch`.

One spanhead call computes the loss and (when hidden / weight need gradients) dhidden and
dweight in the same sweep; the backward makes no spanhead call for reduction "mean" / "sum":
it hands the stored gradients over scaled by the loss's incoming gradient (as the policy loss
does). Reduction "none" has an (N,) incoming gradient that cannot scale a stored dweight: its
forward computes the losses only and its backward runs the call again with ``dloss`` = the
incoming gradient (a second sweep; docs/distill.md).
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from . import _spanhead as _ext
from . import _torch_ops as _ops
from ._errors import DTypeError, InvalidArgumentError, ShapeError
from .distill import config

_LIB = "spanhead"

# non-tensor arguments in two lists (see _torch_policy.py for why)
#   fl: beta, teacher_temperature, temperature, softcap
#   it: kind, reduction, need_dhidden, need_dweight, gap, vocab_start, vocab_total,
#       reduce_dhidden, comm, threads, allow_tf32, batch_invariant, chunk_rows, chunk_bytes,
#       num_tokens, seq_comm (the seq_group's key, 0 = none)
_IT_RED, _IT_NEED_H, _IT_NEED_W = 1, 2, 3


@torch.library.custom_op(f"{_LIB}::distill_loss", mutates_args=())
def distill_loss_op(hidden: torch.Tensor, weight: torch.Tensor, mask: Optional[torch.Tensor],
                    spans: Optional[torch.Tensor], th: Optional[torch.Tensor],
                    tw: Optional[torch.Tensor], ids: Optional[torch.Tensor],
                    lp: Optional[torch.Tensor], dloss: Optional[torch.Tensor],
                    ttrows: Optional[torch.Tensor], fl: List[float], it: List[int],
                    kernel: Optional[str], tune_cache: Optional[str],
                    trows: Optional[torch.Tensor]) -> List[torch.Tensor]:
    """(loss (0-d, or (N,) for reduction none), dhidden, dweight); the gradients are empty
    when not needed. ttrows, trows: the dense teacher's and the student's per-row temperatures
    (N,) float32, or None. ttrows sits before fl, not at the end: a trailing None argument is
    dropped on the way to the kernel by some torch versions (torch 2.11's autograd then saw 14
    inputs for the backward's 15 gradients; Inductor's call lacked it), and the one trailing
    optional (trows) keeps the place it has always had."""
    beta, tt, temperature, softcap = fl
    (kind, red, need_h, need_w, gap, vocab_start, vocab_total, reduce_dh, comm, threads,
     allow_tf32, batch_invariant, chunk_rows, chunk_bytes, num_tokens, seq_comm) = it
    N = hidden.shape[0]
    dev = hidden.device
    loss = torch.empty(N if red == 2 else 1, dtype=torch.float32, device=dev)
    dh = dw = None
    if need_h:
        dh = torch.empty(hidden.shape, dtype=torch.float32 if reduce_dh else hidden.dtype,
                         device=dev)
    if need_w:
        dw = torch.empty(weight.shape, dtype=weight.dtype, device=dev)
    m, sp = _ops.resolve_mask(hidden, mask, spans, gap)
    opts = _ops.Opts(threads, kernel, bool(allow_tf32), bool(batch_invariant), chunk_rows,
                     chunk_bytes, tune_cache)
    ctx = _ops.context_for(dev, _ops.comm_of(comm), **opts._asdict())
    group = _ops.comm_of(seq_comm)
    caps = tuple(_ops._cap(t) for t in (hidden, weight, m, dh, dw, th, tw, ids, lp, dloss, loss,
                                        trows, ttrows))

    def alloc(nbytes: int):
        return _ops._cap(torch.empty(nbytes, dtype=torch.uint8, device=dev))

    _ext.distill_loss(ctx._live(), caps, None if sp is None else sp.__dlpack__(), alloc,
                      vocab_start, vocab_total, temperature, softcap, 0, 0,
                      int(bool(reduce_dh) and dh is not None), (kind, beta, tt, red, num_tokens),
                      None if group is None else group._handle)
    if dh is not None and dh.dtype != hidden.dtype:
        dh = dh.to(hidden.dtype)
    empty_h = torch.empty(0, dtype=hidden.dtype, device=dev)
    empty_w = torch.empty(0, dtype=weight.dtype, device=dev)
    return [loss if red == 2 else loss[0].clone(), dh if dh is not None else empty_h,
            dw if dw is not None else empty_w]


@distill_loss_op.register_fake
def _distill_loss_fake(hidden, weight, mask, spans, th, tw, ids, lp, dloss, ttrows, fl, it,
                       *args):
    N = hidden.shape[0]
    red, need_h, need_w = it[_IT_RED], it[_IT_NEED_H], it[_IT_NEED_W]
    return [hidden.new_empty((N,) if red == 2 else (), dtype=torch.float32),
            hidden.new_empty(hidden.shape if need_h else (0,)),
            weight.new_empty(weight.shape if need_w else (0,))]


_N_INPUTS = 15


def _setup(ctx, inputs, output):
    _, dh, dw = output
    it = inputs[11]
    ctx.red = it[_IT_RED]
    ctx.need = (it[_IT_NEED_H], it[_IT_NEED_W])
    ctx.mark_non_differentiable(dh, dw)
    ctx.set_materialize_grads(False)
    ctx.used = False
    if ctx.red == 2:  # the backward runs the call again with dloss = the incoming gradient
        ctx.args = inputs
        ctx.ttrows = inputs[9]
        ctx.trows = inputs[14] if len(inputs) > 14 else None
        ctx.save_for_backward(*[x for x in inputs[:9] if isinstance(x, torch.Tensor)])
        ctx.slots = [isinstance(x, torch.Tensor) for x in inputs[:9]]
    else:
        ctx.save_for_backward(dh, dw)


def _backward(ctx, grads):
    g_loss = grads[0]
    none = (None,) * _N_INPUTS
    if getattr(ctx, "used", False):
        raise RuntimeError("distill_loss: backward called a second time; the gradients are "
                           "handed over once (retain_graph is not supported)")
    ctx.used = True
    if g_loss is None:
        return none
    want_h = ctx.needs_input_grad[0]
    want_w = ctx.needs_input_grad[1]
    if ctx.red == 2:
        saved = iter(ctx.saved_tensors)
        t = [next(saved) if s else None for s in ctx.slots]
        fl, it = ctx.args[10], list(ctx.args[11])
        it[_IT_NEED_H], it[_IT_NEED_W] = int(bool(want_h)), int(bool(want_w))
        if not (want_h or want_w):
            return none
        out = distill_loss_op(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7],
                              g_loss.detach().to(torch.float32).contiguous(), ctx.ttrows, fl,
                              it, ctx.args[12], ctx.args[13], ctx.trows)
        return (out[1] if want_h else None, out[2] if want_w else None) + none[2:]
    dh, dw = ctx.saved_tensors
    g = g_loss.reshape(())
    compiling = torch.compiler.is_compiling()
    gh = gw = None
    if ctx.need[0] and want_h:
        gh = dh * g.to(dh.dtype) if compiling else dh.mul_(g.to(dh.dtype))
    if ctx.need[1] and want_w:
        gw = dw * g.to(dw.dtype) if compiling else dw.mul_(g.to(dw.dtype))
    return (gh, gw) + none[2:]


distill_loss_op.register_autograd(_backward, setup_context=_setup)


def _teacher(x: Any, name: str, lead: tuple, device: torch.device,
             dtype: Optional[torch.dtype]) -> Optional[torch.Tensor]:
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        raise DTypeError(f"{name}: expected a torch tensor, got {type(x).__name__}")
    if x.dim() < 1 or tuple(x.shape[:-1]) != lead:
        raise ShapeError(f"{name}: shape is {tuple(x.shape)}, expected {lead} + (columns,) "
                         f"(hidden's leading dimensions)")
    if x.device != device:
        raise InvalidArgumentError(f"{name} is on {x.device} but hidden is on {device}")
    if dtype == torch.int64 and x.is_floating_point():
        raise DTypeError(f"{name}: dtype is {x.dtype}, expected integers (vocabulary ids)")
    x = x.detach().reshape(-1, x.shape[-1])
    return (x.to(dtype) if dtype is not None else x).contiguous()


def distill_loss(hidden: torch.Tensor, weight: torch.Tensor, *,
                 teacher_hidden: Optional[torch.Tensor] = None,
                 teacher_weight: Optional[torch.Tensor] = None,
                 teacher_topk_ids: Optional[torch.Tensor] = None,
                 teacher_topk_logprobs: Optional[torch.Tensor] = None, loss_mask: Any = None,
                 kind: str = "forward_kl", beta: float = 0.5, temperature: float = 1.0,
                 teacher_temperature: Any = None, reduction: str = "mean",
                 spans: Any = None, tp_group: Any = None, vocab_start: int = 0,
                 vocab_total: int = 0, num_tokens: Optional[int] = None,
                 seq_group: Any = None, **context_options: Any) -> torch.Tensor:
    """A distillation loss of the student's distribution (softmax of hidden . weight^T /
    temperature) against a teacher's, with its gradients computed inside spanhead's LM-head
    sweep (docs/distill.md): kind "forward_kl" KL(P||Q), "reverse_kl" KL(Q||P), "jsd"
    beta KL(P||M) + (1 - beta) KL(Q||M) (Liger's generalized JSD; beta 0 / 1 are the KLs).

    Args:
        hidden (..., H), weight (V_loc, H): the student (as :func:`logprobs`).
        teacher_hidden (..., H_T) + teacher_weight (V_loc, H_T), the same vocabulary shard:
            a dense teacher (no gradient flows to it); or teacher_topk_ids (..., K) global ids
            (-1 padding) + teacher_topk_logprobs (..., K): a sparse teacher with a tail bin.
        loss_mask, spans: the active rows (as :func:`logprobs`).
        temperature: the student's, a number or a tensor of hidden's leading shape (one per
            row); teacher_temperature: the dense teacher's, a number or a tensor of hidden's
            leading shape (None: the student's, row by row).
        reduction: "mean" over the active rows, "sum", or "none" (hidden's leading shape,
            0 on inactive rows; its backward is a second sweep).
        tp_group, vocab_start, vocab_total, context_options: as in :func:`logprobs`.
        num_tokens, seq_group: reduction "mean"'s divisor, as in :func:`policy_loss`: the T of
            a global batch (>= 1; None = the active rows counted), or a :class:`spanhead.Comm`
            over the ranks holding the other rows (context parallelism): the mean divides by
            the active rows of the whole group, each rank's loss is its share, and the ranks'
            losses and gradients add up to the global mean's.

    Returns:
        The loss: 0-dim for mean / sum, float32 of hidden's leading shape for none;
        differentiable to hidden and weight.
    """
    from .torch import _prepare, _temperature_rows
    kind_i, beta, tt, red, n_tok = config(kind, beta, teacher_temperature, reduction,
                                          num_tokens)
    from ._torch_policy import _seq_key
    seq_key = _seq_key(seq_group)
    softcap = context_options.pop("softcap", 0.0)
    reduce_dhidden = context_options.pop("reduce_dhidden", None)
    gap = context_options.pop("gap", 0)
    p = _prepare(hidden, weight, None, None, loss_mask, spans, gap, tp_group, vocab_start,
                 vocab_total, temperature, softcap, reduce_dhidden, context_options)
    h2 = p.hidden
    dev = h2.device
    th = _teacher(teacher_hidden, "teacher_hidden", p.lead, dev, None)
    tw = None
    if teacher_weight is not None:
        if not isinstance(teacher_weight, torch.Tensor) or teacher_weight.dim() != 2:
            raise ShapeError("teacher_weight: expected a 2-d torch tensor (V_loc, H_T)")
        tw = teacher_weight.detach().contiguous()
    if th is not None and tw is not None and th.dtype != tw.dtype:
        raise DTypeError(f"teacher_hidden {th.dtype} and teacher_weight {tw.dtype}: expected "
                         "one dtype")
    ttrows = None
    if isinstance(teacher_temperature, torch.Tensor):  # one per row (config's scalar is 0)
        ttrows = _temperature_rows(teacher_temperature, h2.shape[0], p.lead, dev,
                                   "teacher_temperature")
    ids = _teacher(teacher_topk_ids, "teacher_topk_ids", p.lead, dev, torch.int64)
    lp = _teacher(teacher_topk_logprobs, "teacher_topk_logprobs", p.lead, dev, torch.float32)
    grad = torch.is_grad_enabled()
    need_h = grad and h2.requires_grad
    need_w = grad and p.weight.requires_grad
    (gap, vocab_start, vocab_total, temperature, softcap, reduce_dh, comm, threads, kernel,
     allow_tf32, batch_invariant, chunk_rows, chunk_bytes, tune_cache) = p.tail
    fwd_grads = red != 2  # reduction none: the backward computes them (dloss)
    fl = [beta, tt, temperature, softcap]
    it = [kind_i, red, int(need_h and fwd_grads), int(need_w and fwd_grads), gap, vocab_start,
          vocab_total, int(reduce_dh), comm, threads, int(allow_tf32), int(batch_invariant),
          chunk_rows, chunk_bytes, n_tok, seq_key]
    out = distill_loss_op(h2, p.weight, p.mask, p.spans, th, tw, ids, lp, None, ttrows, fl, it,
                          kernel, tune_cache, p.trows)
    loss = out[0]
    return loss.reshape(p.lead) if red == 2 else loss


__all__ = ["distill_loss", "distill_loss_op"]
