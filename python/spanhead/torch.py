"""PyTorch adapter: spanhead's LM head as torch.library operators, with autograd.

    import spanhead.torch as sht
    logp = sht.logprobs(hidden, lm_head.weight, targets, loss_mask=mask)      # (N,)
    loss = -(logp * advantages).sum() / mask.sum()
    loss.backward()            # dhidden and dweight from the spanhead backward

    loss = sht.linear_cross_entropy(hidden, lm_head.weight, labels)          # F.cross_entropy
                                                                              # on the logits

Every call is a custom operator (``torch.ops.spanhead.*``, see ``_torch_ops.py``) with a fake
implementation and an autograd formula, so ``torch.compile(fullgraph=True)`` traces code that
calls these functions without a graph break, with host or device masks and spans, and the
compiled step computes what the eager one does. Tensors stay on their device and are passed
through DLPack without copies. The calls are enqueued on PyTorch's current CUDA stream and
never synchronize with the host, so a forward and backward can be captured in a CUDA graph
(warm up once on the capture stream first, as PyTorch asks for any captured code: the first
call on a stream creates its spanhead context).

Autocast: inside ``torch.autocast`` the hidden states and the weight are cast to the autocast
dtype as ``F.linear`` would cast them (float32 master weight -> bf16); the weight's gradient
flows back through the cast, so it keeps the weight's dtype.

Masks and spans: a *host* loss mask (CPU tensor or NumPy array) is turned into spans on the
host, then copied to the device asynchronously (from pinned memory); a *device* mask is used as
it is (no spans: the library derives the active tiles from it). Pass ``spans=`` (a host (n, 2)
int64 array or CPU tensor, e.g. from :func:`spanhead.spans`) together with a device mask to get
both without any host work in the step.

One-pass losses: when the loss is a fixed weighting of the per-token log-probs (SFT,
REINFORCE, + an entropy bonus, cross-entropy with label smoothing),
:func:`weighted_logprob_loss` and :func:`linear_cross_entropy` return the scalar loss with its
gradients already computed by the same sweep (6NHV flops instead of 8NHV).

Importing :mod:`spanhead` never imports torch; importing :mod:`spanhead.torch` does.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import numpy as np
import torch

from . import _torch_ops as _ops
from ._errors import DeviceError, DTypeError, InvalidArgumentError, ShapeError, SizeOverflowError
from ._tensors import int64_pairs
from ._torch_ops import context_for
from .comm import Comm
from .head import TOPK_MAX

__all__ = ["logprobs", "HeadOutputs", "HeadOutputsSumP2", "HeadOutputsTopK", "context_for",
           "weighted_logprob_loss",
           "LossOutputs", "linear_cross_entropy", "LinearCrossEntropyLoss", "policy_loss",
           "PolicyOutputs", "PolicyOutputsExtras", "distill_loss"]

_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


class HeadOutputs(NamedTuple):
    """Per-row outputs of :func:`logprobs` (float32, shaped like targets); None when not
    requested."""

    logprob: Optional[torch.Tensor]
    entropy: Optional[torch.Tensor]
    lse: Optional[torch.Tensor]
    logit_mean: Optional[torch.Tensor]

    @property
    def sum_p2(self) -> Optional[torch.Tensor]:
        """Not requested (see :class:`HeadOutputsSumP2`)."""
        return None

    @property
    def topk_ids(self) -> Optional[torch.Tensor]:
        """Not requested (see :class:`HeadOutputsTopK`)."""
        return None

    @property
    def topk_logprobs(self) -> Optional[torch.Tensor]:
        """Not requested (see :class:`HeadOutputsTopK`)."""
        return None


class HeadOutputsSumP2(NamedTuple):
    """:class:`HeadOutputs` plus sum_p2 (float32, no gradient), what :func:`logprobs` returns
    with ``sum_p2=True`` (a separate type so that the 4-tuple of the others stays as it was)."""

    logprob: Optional[torch.Tensor]
    entropy: Optional[torch.Tensor]
    lse: Optional[torch.Tensor]
    logit_mean: Optional[torch.Tensor]
    sum_p2: torch.Tensor

    @property
    def topk_ids(self) -> Optional[torch.Tensor]:
        """Not requested (see :class:`HeadOutputsTopK`)."""
        return None

    @property
    def topk_logprobs(self) -> Optional[torch.Tensor]:
        """Not requested (see :class:`HeadOutputsTopK`)."""
        return None


class HeadOutputsTopK(NamedTuple):
    """What :func:`logprobs` returns with ``topk=K``: the four outputs of
    :class:`HeadOutputs`, sum_p2 (None unless ``sum_p2=True``), and the top-k of each row's
    distribution: ``topk_ids`` int64 (..., K) global ids (descending probability, ties the
    lower id first; -1 on inactive rows) and ``topk_logprobs`` float32 (..., K) (0 on
    inactive rows), both detached (no gradient)."""

    logprob: Optional[torch.Tensor]
    entropy: Optional[torch.Tensor]
    lse: Optional[torch.Tensor]
    logit_mean: Optional[torch.Tensor]
    sum_p2: Optional[torch.Tensor]
    topk_ids: torch.Tensor
    topk_logprobs: torch.Tensor


class LossOutputs(NamedTuple):
    """What :func:`weighted_logprob_loss` returns when per-row outputs are asked for: the
    differentiable scalar loss and the detached float32 per-row log-probs / entropy (shaped
    like targets; None when not requested)."""

    loss: torch.Tensor
    logprob: Optional[torch.Tensor]
    entropy: Optional[torch.Tensor]


# ---- argument preparation (traceable by torch.compile: metadata and torch ops only) ---------

def _i64(v: Any, name: str) -> int:
    if isinstance(v, torch.SymInt):
        return v  # under torch.compile with dynamic shapes: checked by the operator
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise DTypeError(f"{name}: expected an integer, got {v!r}")
    if not -2**63 <= int(v) < 2**63:
        raise SizeOverflowError(f"{name}: {int(v)} does not fit in a signed 64-bit integer")
    return int(v)


def _real(v: Any, name: str) -> float:
    if isinstance(v, (torch.SymFloat, torch.SymInt)):
        return v  # under torch.compile: a symbolic scalar (the operator checks it)
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise DTypeError(f"{name}: expected a real number, got {v!r}")
    try:
        return float(v)
    except OverflowError:
        raise InvalidArgumentError(f"{name}: {v} is too large for a double") from None


def _autocast(hidden: torch.Tensor, weight: torch.Tensor):
    """hidden and weight as F.linear sees them under torch.autocast (both in the autocast
    dtype; float64 is left alone, as autocast does)."""
    dev = hidden.device.type
    if dev not in ("cuda", "cpu"):
        return hidden, weight
    try:
        on = torch.is_autocast_enabled(dev)
    except TypeError:  # torch < 2.4: no device_type argument
        on = torch.is_autocast_enabled() if dev == "cuda" else torch.is_autocast_cpu_enabled()
    if not on:
        return hidden, weight
    try:
        dt = torch.get_autocast_dtype(dev)
    except AttributeError:
        dt = torch.get_autocast_gpu_dtype() if dev == "cuda" else torch.get_autocast_cpu_dtype()
    if hidden.is_floating_point() and hidden.dtype not in (dt, torch.float64):
        hidden = hidden.to(dt)
    if weight.is_floating_point() and weight.dtype not in (dt, torch.float64):
        weight = weight.to(dt)
    return hidden, weight


def _spans_tensor(spans: Any) -> Optional[torch.Tensor]:
    """Spans as a host int64 (n, 2) tensor; floats are refused, never truncated."""
    if spans is None:
        return None
    if not isinstance(spans, torch.Tensor):
        if torch.compiler.is_compiling():
            t = torch.from_numpy(spans) if isinstance(spans, np.ndarray) else torch.tensor(spans)
        else:
            t = torch.from_numpy(int64_pairs(spans, "spans"))
    else:
        t = spans
    if t.dtype not in _INT_DTYPES:
        raise DTypeError(f"spans: dtype is {t.dtype}, expected integers (row indices)")
    if t.device.type != "cpu":
        raise DeviceError(f"spans: on {t.device}; spans are host metadata (a CPU tensor or "
                          f"NumPy array)")
    if t.numel() == 0:
        return t.new_zeros((0, 2), dtype=torch.int64)
    if t.dim() != 2 or t.shape[1] != 2:
        raise ShapeError(f"spans: shape is {tuple(t.shape)}, expected (n_spans, 2)")
    return t.to(torch.int64)


def _mask_tensor(mask: Any, N: int, lead: tuple, device: torch.device) -> Optional[torch.Tensor]:
    if mask is None:
        return None
    if isinstance(mask, torch.Tensor):
        m = mask
    elif isinstance(mask, np.ndarray):
        m = torch.from_numpy(mask)
    else:
        m = torch.as_tensor(mask)
    if m.numel() != N:
        raise ShapeError(f"loss_mask: shape is {tuple(m.shape)} ({m.numel()} rows), expected "
                         f"{tuple(lead)} ({N} rows, hidden's leading dimensions)")
    m = m.reshape(-1)
    if m.device.type != "cpu" and m.device != device:
        raise InvalidArgumentError(f"loss_mask is on {m.device} but hidden is on {device}")
    return m


def _comm_for(group: Any, vocab_total: int, vocab_start: int, vocab_local: int,
              dtype: torch.dtype, temperature: float) -> Comm:
    key = ("comm", id(group), vocab_total, vocab_start, vocab_local, str(dtype), temperature)
    cache = _ops._cache()
    comm = cache.get(key)
    if comm is None:
        comm = cache[key] = Comm.from_torch(group, vocab_total=vocab_total,
                                            vocab_start=vocab_start, vocab_local=vocab_local,
                                            dtype=dtype, temperature=temperature)
    return comm


def _tp_constant(fn):
    """torch.compile runs the communicator lookup at trace time and keeps its result (an int
    key and vocab_total) as a constant of the graph: the lookup calls into the extension and
    torch.distributed, which dynamo cannot trace; the result is fixed for a given group."""
    mark = getattr(getattr(torch, "_dynamo", None), "assume_constant_result", None)
    return mark(fn) if mark is not None else fn


def _tp(tp_group: Any, vocab_total: int, vocab_start: int, vocab_local: int,
        dtype: torch.dtype, temperature: float):
    """(communicator key, vocab_total) of a tp_group (None, a spanhead.Comm or a
    torch.distributed group). A Comm's key and size are attributes (constants under
    torch.compile, which takes no Comm as a constant argument); a torch group goes through
    the trace-time lookup."""
    if tp_group is None:
        return 0, vocab_total
    if isinstance(tp_group, Comm):
        return tp_group._key, vocab_total or vocab_local * tp_group._size
    return _tp_group(tp_group, vocab_total, vocab_start, vocab_local, dtype, temperature)


@_tp_constant
def _tp_group(tp_group: Any, vocab_total: int, vocab_start: int, vocab_local: int,
              dtype: torch.dtype, temperature: float):
    import torch.distributed as dist
    if not vocab_total:
        vocab_total = vocab_local * dist.get_world_size(tp_group)
    comm = _comm_for(tp_group, vocab_total, vocab_start, vocab_local, dtype, temperature)
    return _ops.comm_key(comm), vocab_total


class _Prepared(NamedTuple):
    lead: tuple
    hidden: torch.Tensor          # (N, H), rows contiguous
    weight: torch.Tensor          # (V_loc, H), rows contiguous
    targets: Optional[torch.Tensor]
    candidates: Optional[torch.Tensor]
    mask: Optional[torch.Tensor]  # (N,): on the host (-> spans in the operator) or hidden's device
    spans: Optional[torch.Tensor]  # host (n, 2) int64
    tail: tuple                   # the operators' trailing arguments (_ops._FWD_TAIL)
    trows: Optional[torch.Tensor] = None  # (N,) float32 per-row temperatures (tail's is 1)


def _temperature_rows(temperature: torch.Tensor, N: int, lead: tuple, device: torch.device,
                      name: str = "temperature") -> torch.Tensor:
    """A per-row ``temperature=`` tensor (or the distillation's ``teacher_temperature=``,
    name) as the operators take it: targets' shape (hidden's leading dimensions), on hidden's
    device, a floating dtype (converted to float32: the kernels multiply by float(1 / T_i)
    anyway); no gradient flows to it."""
    if tuple(temperature.shape) != lead:
        raise ShapeError(f"{name}: shape is {tuple(temperature.shape)}, expected {lead} "
                         f"(targets' shape: one temperature per row) or a number")
    if temperature.device != device:
        raise InvalidArgumentError(f"{name} is on {temperature.device} but hidden is on "
                                   f"{device}")
    if not temperature.is_floating_point():
        raise DTypeError(f"{name}: dtype is {temperature.dtype}, expected a floating "
                         f"dtype (float32; others are converted)")
    return temperature.detach().reshape(N).to(torch.float32).contiguous()


def _prepare(hidden: Any, weight: Any, targets: Optional[torch.Tensor],
             candidates: Optional[torch.Tensor], loss_mask: Any, spans: Any, gap: int,
             tp_group: Any, vocab_start: int, vocab_total: int, temperature: float,
             softcap: float, reduce_dhidden: Optional[bool], options: dict) -> _Prepared:
    """The checks and conversions every entry point shares: autocast, 2-D views, mask and
    spans as tensors, communicator key, context options."""
    if not isinstance(hidden, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise DTypeError("hidden and weight must be torch tensors")
    hidden, weight = _autocast(hidden, weight)
    if hidden.dtype not in _INPUT_DTYPES:
        raise DTypeError(f"hidden: dtype is {hidden.dtype}, expected float32, bfloat16 or "
                         f"float16 (cast float64 inputs with .float())")
    if weight.dim() != 2 or hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ShapeError(f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)}: "
                         f"expected (..., H) and (V_loc, H)")
    lead = tuple(hidden.shape[:-1])
    H = hidden.shape[-1]
    h2 = hidden.reshape(-1, H)
    if h2.stride(-1) != 1:
        h2 = h2.contiguous()
    w2 = weight if weight.stride(-1) == 1 else weight.contiguous()
    N = h2.shape[0]
    t1 = None
    if targets is not None:
        if not isinstance(targets, torch.Tensor):
            raise DTypeError(f"targets: expected a torch tensor, got {type(targets).__name__}")
        if tuple(targets.shape) != lead:
            raise ShapeError(f"targets: shape is {tuple(targets.shape)}, expected "
                             f"{lead} (hidden's leading dimensions)")
        t1 = targets.reshape(-1)
    c2 = None
    if candidates is not None:
        if tuple(candidates.shape[:-1]) != lead:
            raise ShapeError(f"candidates: shape is {tuple(candidates.shape)}, expected "
                             f"{lead} + (K,)")
        c2 = candidates.reshape(N, candidates.shape[-1])
    mask = _mask_tensor(loss_mask, N, lead, h2.device)
    sp = _spans_tensor(spans)
    vocab_start = _i64(vocab_start, "vocab_start")
    trows = None
    if isinstance(temperature, torch.Tensor):
        trows = _temperature_rows(temperature, N, lead, h2.device)
        temperature = 1.0  # the library takes one or the other
    temperature = _real(temperature, "temperature")
    softcap = 0.0 if softcap is None else _real(softcap, "softcap")
    vocab_total = _i64(vocab_total, "vocab_total")
    key = 0
    if tp_group is not None:
        # plain Python values for the trace-time lookup (a symbolic size or temperature is
        # specialized here: a communicator is made for one configuration)
        key, vocab_total = _tp(tp_group, int(vocab_total), int(vocab_start), int(w2.shape[0]),
                               h2.dtype, float(temperature))
    if reduce_dhidden is None:
        reduce_dhidden = key != 0
    opts = _ops.opts_from(options)
    tail = (_i64(gap, "gap"), vocab_start, vocab_total, temperature, softcap,
            bool(reduce_dhidden), key) + tuple(opts)
    return _Prepared(lead, h2, w2, t1, c2, mask, sp, tail, trows)


# ---- logprobs --------------------------------------------------------------------------------

def logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: Optional[torch.Tensor],
             loss_mask: Any = None, spans: Any = None, temperature: float = 1.0,
             entropy: bool = False, tp_group: Any = None, vocab_start: int = 0, *,
             vocab_total: int = 0, lse: bool = False, logit_mean: bool = False,
             softcap: Optional[float] = 0.0, candidates: Optional[torch.Tensor] = None, gap: int = 0,
             reduce_dhidden: Optional[bool] = None, sum_p2: bool = False, topk: int = 0,
             **context_options: Any) -> Any:
    """Per-token log-probs of ``targets`` under ``softmax((hidden @ weight.T) / temperature)``,
    differentiable w.r.t. hidden and weight, without materializing the logits.

    Args:
        hidden: (..., H) float32 / bfloat16 / float16 (rows must be contiguous in H).
        weight: (V_loc, H), same dtype: the full LM head, or this rank's vocabulary shard.
        targets: (...) int32/int64 global token ids; negative ids are ignored (0, no gradient).
            May be None when only entropy / lse / logit_mean are wanted.
        loss_mask: (...) active rows (bool or 0/1). On the host: spans are built from it there,
            then it is copied to the device. On the device: used as it is. Rows with mask 0 get
            exactly 0 outputs and no gradient, and cost nothing.
        spans: host (n, 2) int64 [start, end) runs of active rows (e.g. spanhead.spans()).
        temperature, softcap: z = (softcap * tanh(u / softcap) if softcap else u) / temperature.
            temperature is a number or a tensor of targets' shape on hidden's device (one
            temperature per row, e.g. verl's per-sample dynamic temperature expanded to its
            tokens; floating dtypes are converted to float32; no gradient flows to it).
        entropy, lse, logit_mean: also return these per-row quantities (all differentiable).
        tp_group: a torch.distributed NCCL process group over the vocabulary shards (see
            spanhead.Comm.from_torch), or a spanhead.Comm (e.g. Comm.from_mpi4py for CPU
            tensors); the softmax statistics are combined across it.
        vocab_start, vocab_total: this shard's first id and the full vocabulary (default with
            tp_group: V_loc * group size).
        candidates: (..., K) sample-support ids padded with -1 (softmax over them only).
        gap: span coalescing gap for a host loss mask. The default 0 gives exact spans, the
            fastest input for spanhead's kernels (they gather active rows, so coalescing only
            adds inactive rows to compute); a larger gap merges runs for callers that want
            few spans.
        reduce_dhidden: sum dhidden over tp_group in the backward (default True with tp_group:
            the gradient of the replicated hidden is the sum of the shards' partials; pass
            False when a surrounding layer already all-reduces it, as Megatron's does).
        sum_p2: also return sum_j p_ij^2 per row (float32, no gradient; 0 on inactive rows;
            on CUDA not with candidates).
        topk: K in [1, 256] (K <= vocab_total): also return the K most probable ids of each
            row's distribution and their log-probs (no gradient; not with candidates).
        context_options: passed to spanhead.Context (threads, kernel, batch_invariant, ...).

    Returns:
        logprob (float32, targets' shape) when only logprobs are requested, else a
        :class:`HeadOutputs` (logprob, entropy, lse, logit_mean) with None for the others
        (with ``sum_p2=True``: a :class:`HeadOutputsSumP2`, the same plus sum_p2; with
        ``topk=K``: a :class:`HeadOutputsTopK`, the same plus sum_p2 or None, topk_ids and
        topk_logprobs).
    """
    if isinstance(topk, bool) or not isinstance(topk, int) or not 0 <= topk <= TOPK_MAX:
        raise InvalidArgumentError(f"topk: {topk!r}, expected an int 1 <= K <= {TOPK_MAX} "
                                   "(0 = none)")
    p = _prepare(hidden, weight, targets, candidates, loss_mask, spans, gap, tp_group,
                 vocab_start, vocab_total, temperature, softcap, reduce_dhidden,
                 context_options)
    want = [p.targets is not None, bool(entropy), bool(lse), bool(logit_mean), bool(sum_p2)]
    fl, it, kernel, tune_cache = _ops.pack_tail(p.tail)
    if topk:
        it = it + [topk]  # head_fwd's eleventh integer (see _torch_ops.head_fwd)
    outs = _ops.head_fwd(p.hidden, p.weight, p.targets, p.candidates, p.mask, p.spans, want,
                         fl, it, kernel, tune_cache, p.trows)
    res = [o.reshape(p.lead) if w else None for o, w in zip(outs[:4], want)]
    sp2 = outs[5].detach().reshape(p.lead) if sum_p2 else None
    if topk:
        return HeadOutputsTopK(*res, sum_p2=sp2,
                               topk_ids=outs[6].detach().reshape(p.lead + (topk,)),
                               topk_logprobs=outs[7].detach().reshape(p.lead + (topk,)))
    if sum_p2:
        return HeadOutputsSumP2(*res, sum_p2=sp2)
    if not (want[1] or want[2] or want[3]):
        return res[0]
    return HeadOutputs(*res)


# ---- one-pass weighted log-prob loss -------------------------------------------------------

def weighted_logprob_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          weights: Any, loss_mask: Any = None, spans: Any = None,
                          temperature: float = 1.0, softcap: float = 0.0,
                          entropy_coef: float = 0.0, tp_group: Any = None,
                          vocab_start: int = 0, *, vocab_total: int = 0, gap: int = 0,
                          reduce_dhidden: Optional[bool] = None, return_logprobs: bool = False,
                          return_entropy: bool = False, **context_options: Any) -> Any:
    """The scalar loss ``L = -sum_i weights_i * logprob_i - entropy_coef * sum_i entropy_i``
    over the active rows, its gradients computed in the same call as the forward (spanhead's
    one-pass mode: each chunk of logits is computed once, 6*N*H*V flops instead of the
    8*N*H*V of :func:`logprobs` + backward, where the chunks of staged logits fit the
    workspace budget; on very wide vocabularies the CUDA backend recomputes them instead,
    see docs/cuda.md).

    For losses whose gradient w.r.t. the per-token log-probs is known before the forward:

        SFT:        weights = mask / mask.sum()           (L = mean token NLL)
        REINFORCE:  weights = advantages / num_tokens     (L = -mean A_i log p_i)
        + entropy bonus: entropy_coef > 0 *subtracts* coef * sum entropy (maximizes entropy)

    (PPO / GRPO with ratio clipping need the log-probs before their gradient: use
    :func:`logprobs`.) The backward makes no spanhead call: the forward stores dhidden and
    dweight (so dweight, V_loc x H, is held from the forward to the backward, as in
    liger-kernel's fused linear cross entropy) and the backward hands them over scaled by
    the loss's incoming gradient. The backward can run once (no ``retain_graph``).

    Args:
        hidden, weight, targets, loss_mask, spans, temperature, softcap, tp_group,
            vocab_start, vocab_total, gap, reduce_dhidden, context_options: as in
            :func:`logprobs` (targets are required; negative ids are ignored: logprob 0,
            no gradient). Inactive rows (mask 0 / outside spans) add nothing to the loss
            whatever their weight.
        weights: per-token weights, a tensor of targets' shape on hidden's device (cast to
            float32), or a Python number for every token. Differentiable: dL/dweights_i =
            -logprob_i.
        entropy_coef: the entropy term's coefficient (0: entropy is not computed).
        return_logprobs, return_entropy: also return the detached per-row log-probs /
            entropy (float32, targets' shape; 0 on inactive rows).

    With tp_group the loss is the same on every rank (the statistics are global); each
    rank's dweight is its shard's and dhidden is summed over the group (reduce_dhidden).

    Returns:
        the loss, a float32 0-dim tensor; with return_logprobs or return_entropy a
        :class:`LossOutputs` (loss, logprob, entropy) with None for what was not asked for.
    """
    if targets is None:
        raise InvalidArgumentError("targets: required (the loss weights log-probs of targets)")
    coef = _real(entropy_coef, "entropy_coef")
    if not (coef == coef and -math.inf < coef < math.inf):  # finite (traceable: no isfinite)
        raise InvalidArgumentError(f"entropy_coef: {entropy_coef}, expected a finite number")
    loss, lp, ent = _one_pass(hidden, weight, targets, weights, loss_mask, spans, temperature,
                              softcap, tp_group, vocab_start, vocab_total, gap, reduce_dhidden,
                              context_options, c_lp=-1.0, c_lse=0.0, c_mean=0.0, c_ent=-coef,
                              want_entropy=bool(return_entropy))
    if not (return_logprobs or return_entropy):
        return loss
    return LossOutputs(loss, lp if return_logprobs else None, ent if return_entropy else None)


def _one_pass(hidden, weight, targets, weights, loss_mask, spans, temperature, softcap,
              tp_group, vocab_start, vocab_total, gap, reduce_dhidden, options, *, c_lp,
              c_lse, c_mean, c_ent, want_entropy):
    """spanhead::weighted_loss with the checks of the weights; (loss, logprob, entropy)."""
    p = _prepare(hidden, weight, targets, None, loss_mask, spans, gap, tp_group, vocab_start,
                 vocab_total, temperature, softcap, reduce_dhidden, options)
    h2 = p.hidden
    N = h2.shape[0]
    if isinstance(weights, torch.Tensor):
        if tuple(weights.shape) != p.lead:
            raise ShapeError(f"weights: shape is {tuple(weights.shape)}, expected "
                             f"{p.lead} (targets' shape)")
        if weights.device != h2.device:
            raise InvalidArgumentError(f"weights are on {weights.device} but hidden is on "
                                       f"{h2.device}")
        if not (weights.is_floating_point() or weights.dtype == torch.bool):
            raise DTypeError(f"weights: dtype is {weights.dtype}, expected a floating dtype")
        w1 = weights.reshape(N).to(torch.float32).contiguous()
    elif isinstance(weights, (int, float)) and not isinstance(weights, bool):
        w1 = torch.full((N,), float(weights), dtype=torch.float32, device=h2.device)
    else:
        raise DTypeError(f"weights: expected a tensor of targets' shape or a number, got "
                         f"{type(weights).__name__}")
    grad = torch.is_grad_enabled()
    need_h = grad and h2.requires_grad
    need_w = grad and p.weight.requires_grad
    out = _ops.weighted_loss(h2, p.weight, p.targets, p.mask, p.spans, w1,
                             *_ops.pack_loss(p.tail, c_lp, c_lse, c_mean, c_ent, want_entropy,
                                             need_h, need_w), p.trows)
    loss, lp, ent = out[0], out[1], out[2]
    return (loss, lp.detach().reshape(p.lead),
            ent.detach().reshape(p.lead) if ent.numel() or N == 0 else None)


# ---- drop-in cross-entropy -------------------------------------------------------------------

_REDUCTIONS = ("mean", "sum", "none")


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         ignore_index: int = -100, reduction: str = "mean",
                         temperature: float = 1.0, softcap: Optional[float] = None,
                         label_smoothing: float = 0.0, *, loss_mask: Any = None,
                         tp_group: Any = None, vocab_start: int = 0, vocab_total: int = 0,
                         reduce_dhidden: Optional[bool] = None,
                         **context_options: Any) -> torch.Tensor:
    """``F.cross_entropy(logits, targets, ignore_index=, reduction=, label_smoothing=)`` of
    ``logits = z(hidden @ weight.T)`` (with ``softcap``: ``softcap * tanh(u / softcap)``, then
    divided by ``temperature``), without materializing the logits and computed on the
    non-ignored rows only.

    ``hidden`` (..., H), ``weight`` (V, H), ``targets`` (...) int ids; rows whose target equals
    ``ignore_index`` cost nothing, add 0 and get no gradient (other negative ids are ignored
    too, where F.cross_entropy would raise). ``reduction="mean"`` divides by the number of
    non-ignored rows (NaN when there are none, as F.cross_entropy), ``"sum"`` adds them, both in
    spanhead's one-pass mode (the gradients come out of the forward; the backward can run
    once); ``"none"`` returns the per-row losses (targets' shape, 0 on ignored rows) through
    :func:`logprobs`. ``label_smoothing`` eps mixes in the mean over the vocabulary of
    -log p: ``(1 - eps) * nll + eps * (lse - mean_j z_j)``. ``loss_mask`` (optional) further
    restricts the rows (rows outside it are treated as ignored). ``tp_group`` and the rest:
    as :func:`logprobs`.
    """
    if reduction not in _REDUCTIONS:
        raise InvalidArgumentError(f"reduction: {reduction!r}, expected one of {_REDUCTIONS}")
    if not isinstance(targets, torch.Tensor):
        raise DTypeError(f"targets: expected a torch tensor, got {type(targets).__name__}")
    eps = _real(label_smoothing, "label_smoothing")
    if not 0.0 <= eps <= 1.0:
        raise InvalidArgumentError(f"label_smoothing: {label_smoothing}, expected 0 <= eps <= 1")
    ignore = _i64(ignore_index, "ignore_index")
    valid = targets != ignore
    if loss_mask is not None:
        m = loss_mask if isinstance(loss_mask, torch.Tensor) else torch.as_tensor(loss_mask)
        valid = valid & (m.to(valid.device).reshape(valid.shape) != 0)
    tgt = torch.where(valid, targets, torch.full_like(targets, -1)) if ignore >= 0 else targets
    if reduction == "none":
        out = logprobs(hidden, weight, tgt, loss_mask=valid, temperature=temperature,
                       softcap=softcap, lse=eps != 0.0, logit_mean=eps != 0.0,
                       tp_group=tp_group, vocab_start=vocab_start, vocab_total=vocab_total,
                       reduce_dhidden=reduce_dhidden, **context_options)
        if eps == 0.0:
            return -out
        return -(1.0 - eps) * out.logprob + eps * (out.lse - out.logit_mean)
    w = valid.to(torch.float32)
    if reduction == "mean":
        w = w / valid.sum()   # on the device: no host sync (0/0 = NaN when every row is ignored)
    loss, _, _ = _one_pass(hidden, weight, tgt, w, valid, None, temperature, softcap, tp_group,
                           vocab_start, vocab_total, 0, reduce_dhidden, context_options,
                           c_lp=-(1.0 - eps), c_lse=eps, c_mean=-eps, c_ent=0.0,
                           want_entropy=False)
    return loss


class LinearCrossEntropyLoss(torch.nn.Module):
    """``nn.Module`` form of :func:`linear_cross_entropy` (the fused ``lm_head`` +
    ``nn.CrossEntropyLoss``): ``LinearCrossEntropyLoss(ignore_index=-100)(hidden, weight,
    targets)``. Keyword arguments as the function's; context options (``threads=``,
    ``kernel=``, ...) are passed through."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean",
                 temperature: float = 1.0, softcap: Optional[float] = None,
                 label_smoothing: float = 0.0, **context_options: Any):
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise InvalidArgumentError(f"reduction: {reduction!r}, expected one of "
                                       f"{_REDUCTIONS}")
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.temperature = temperature
        self.softcap = softcap
        self.label_smoothing = label_smoothing
        self.context_options = context_options

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor,
                targets: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy(hidden, weight, targets, self.ignore_index, self.reduction,
                                    self.temperature, self.softcap, self.label_smoothing,
                                    **self.context_options)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"temperature={self.temperature}, softcap={self.softcap}, "
                f"label_smoothing={self.label_smoothing}")


# ---- the fused RL policy loss (spanhead::policy_loss, _torch_policy.py) ---------------------

from ._torch_policy import PolicyOutputs, PolicyOutputsExtras, policy_loss  # noqa: E402

# ---- the fused distillation losses (spanhead::distill_loss, _torch_distill.py) --------------

from ._torch_distill import distill_loss  # noqa: E402
