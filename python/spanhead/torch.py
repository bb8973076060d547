"""PyTorch adapter: a ``torch.autograd.Function`` over the spanhead forward and backward.

    import spanhead.torch as sht
    logp = sht.logprobs(hidden, lm_head.weight, targets, loss_mask=mask)      # (N,)
    loss = -(logp * advantages).sum() / mask.sum()
    loss.backward()            # dhidden and dweight from the spanhead backward

Tensors stay on their device and are passed through DLPack without copies. The calls are
enqueued on PyTorch's current CUDA stream and never synchronize with the host, so a forward and
backward can be captured in a CUDA graph (warm up once on the capture stream first, as PyTorch
asks for any captured code: the first call on a stream creates its spanhead context).

Masks and spans: a *host* loss mask (CPU tensor or NumPy array) is turned into spans on the
host, then copied to the device asynchronously (from pinned memory); a *device* mask is used as
it is (no spans: the library derives the active tiles from it). Pass ``spans=`` (a host (n, 2)
int64 array, e.g. from :func:`spanhead.spans`) together with a device mask to get both without
any host work in the step.

One-pass losses: when the loss is a fixed weighting of the per-token log-probs (SFT,
REINFORCE, + an entropy bonus), :func:`weighted_logprob_loss` returns the scalar loss with its
gradients already computed by the same sweep (6NHV flops instead of 8NHV):

    loss = sht.weighted_logprob_loss(hidden, lm_head.weight, targets, advantages / n,
                                     loss_mask=mask)
    loss.backward()            # no second spanhead call: the forward's dhidden and dweight

Importing :mod:`spanhead` never imports torch; importing :mod:`spanhead.torch` does.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple, Optional

import numpy as np
import torch

from . import _spanhead as _ext
from .comm import Comm
from .head import BACKWARD, FORWARD, Context
from ._errors import DTypeError, InvalidArgumentError, ShapeError
from .meta import spans_from_mask
from ._tensors import int64_pairs

__all__ = ["logprobs", "HeadFunction", "HeadOutputs", "context_for", "weighted_logprob_loss",
           "OnePassLossFunction", "LossOutputs"]

_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class HeadOutputs(NamedTuple):
    """Per-row outputs of :func:`logprobs` (float32, shaped like targets); None when not
    requested."""

    logprob: Optional[torch.Tensor]
    entropy: Optional[torch.Tensor]
    lse: Optional[torch.Tensor]
    logit_mean: Optional[torch.Tensor]


# ---- contexts and communicators, cached per thread -----------------------------------------

_local = threading.local()


def _cache() -> dict:
    c = getattr(_local, "cache", None)
    if c is None:
        c = _local.cache = {}
    return c


def context_for(device: torch.device, comm: Optional[Comm] = None, **options: Any) -> Context:
    """This thread's spanhead context for a torch device, bound to the current CUDA stream
    (contexts are cached per device, stream, communicator and options)."""
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        stream = torch.cuda.current_stream(idx).cuda_stream
        key = ("cuda", idx, stream, id(comm), tuple(sorted(options.items())))
        make = lambda: Context(("cuda", idx), stream=stream or None, comm=comm,  # noqa: E731
                               **options)
    elif device.type == "cpu":
        key = ("cpu", 0, 0, id(comm), tuple(sorted(options.items())))
        make = lambda: Context("cpu", comm=comm, **options)  # noqa: E731
    else:
        raise InvalidArgumentError(f"device: spanhead runs on cpu and cuda, not {device}")
    cache = _cache()
    ctx = cache.get(key)
    if ctx is None:
        ctx = cache[key] = make()
    return ctx


def _comm_for(group: Any, vocab_total: int, vocab_start: int, vocab_local: int,
              dtype: torch.dtype, temperature: float) -> Comm:
    key = ("comm", id(group), vocab_total, vocab_start, vocab_local, str(dtype), temperature)
    cache = _cache()
    comm = cache.get(key)
    if comm is None:
        comm = cache[key] = Comm.from_torch(group, vocab_total=vocab_total,
                                            vocab_start=vocab_start, vocab_local=vocab_local,
                                            dtype=dtype, temperature=temperature)
    return comm


# ---- DLPack -------------------------------------------------------------------------------

_to_dlpack = getattr(torch.utils.dlpack, "to_dlpack", None)


def _cap(t: Optional[torch.Tensor]) -> Any:
    """A DLPack capsule of t without any stream synchronization (everything runs on the
    context's stream, which is the current stream)."""
    if t is None:
        return None
    t = t.detach()
    if _to_dlpack is not None:
        return _to_dlpack(t)
    return t.__dlpack__(stream=-1 if t.is_cuda else None)


def _call(pass_: int, cfg: "_Config", ctx: Context, tensors: dict) -> None:
    order = ("hidden", "weight", "targets", "candidates", "active_mask", "logprob", "entropy",
             "lse", "logit_mean", "stats", "dlogprob", "dentropy", "dlse", "dlogit_mean",
             "dhidden", "dweight")
    caps = tuple(_cap(tensors.get(k)) for k in order)
    dev = tensors["hidden"].device

    def alloc(nbytes: int):
        # torch's caching allocator: stream-ordered, no host sync, graph-capture safe
        return _cap(torch.empty(nbytes, dtype=torch.uint8, device=dev))

    spans = None if cfg.spans is None else _ext_spans(cfg.spans)
    # the TP all-reduce of dhidden: wherever dhidden is written (the backward, or a one-pass
    # forward); never without a dhidden output (the library refuses that)
    allreduce = bool(cfg.reduce_dhidden) and tensors.get("dhidden") is not None
    _ext.head(ctx._live(), pass_, caps, spans, alloc, cfg.vocab_start, cfg.vocab_total,
              cfg.temperature, cfg.softcap, 0, 0, int(allreduce))


def _ext_spans(spans: np.ndarray) -> Any:
    return spans.__dlpack__()


class _Config:
    """Non-tensor arguments of one call (carried from forward to backward)."""

    __slots__ = ("spans", "vocab_start", "vocab_total", "temperature", "softcap", "want",
                 "comm", "reduce_dhidden", "options", "entropy_coef", "want_entropy")

    def __init__(self, **kw: Any):
        for k, v in kw.items():
            setattr(self, k, v)


class HeadFunction(torch.autograd.Function):
    """autograd.Function: (hidden, weight, targets, candidates, active_mask, config) ->
    (logprob, entropy, lse, logit_mean). Outputs that were not requested are empty tensors
    marked non-differentiable. Use :func:`logprobs` rather than calling this directly."""

    @staticmethod
    def forward(fctx, hidden, weight, targets, candidates, active_mask, cfg):  # noqa: D102
        N = hidden.shape[0]
        f32 = dict(dtype=torch.float32, device=hidden.device)
        outs = {name: (torch.empty(N, **f32) if want else None)
                for name, want in zip(("logprob", "entropy", "lse", "logit_mean"), cfg.want)}
        stats = torch.empty((N, 3), **f32)
        ctx = context_for(hidden.device, cfg.comm, **cfg.options)
        _call(FORWARD, cfg, ctx, dict(hidden=hidden, weight=weight, targets=targets,
                                      candidates=candidates, active_mask=active_mask,
                                      stats=stats, **outs))
        fctx.save_for_backward(hidden, weight, targets, candidates, active_mask, stats)
        fctx.cfg = cfg
        fctx.set_materialize_grads(False)
        result, unused = [], []
        for name in ("logprob", "entropy", "lse", "logit_mean"):
            t = outs[name]
            if t is None:
                t = torch.empty(0, **f32)
                unused.append(t)
            result.append(t)
        if unused:
            fctx.mark_non_differentiable(*unused)  # one call: each call replaces the last
        return tuple(result)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(fctx, g_lp, g_ent, g_lse, g_mean):  # noqa: D102
        hidden, weight, targets, candidates, active_mask, stats = fctx.saved_tensors
        cfg = fctx.cfg
        need_h, need_w = fctx.needs_input_grad[0], fctx.needs_input_grad[1]
        ups = {}
        for name, g, want in zip(("dlogprob", "dentropy", "dlse", "dlogit_mean"),
                                 (g_lp, g_ent, g_lse, g_mean), cfg.want):
            if g is not None and want:
                ups[name] = g.to(torch.float32).contiguous()
        if not (need_h or need_w) or not ups:
            return None, None, None, None, None, None
        dh = dw = None
        if need_h:
            # the TP all-reduce of dhidden runs in float32 (the library's requirement)
            dt = torch.float32 if cfg.reduce_dhidden else hidden.dtype
            dh = torch.empty(hidden.shape, dtype=dt, device=hidden.device)
        if need_w:
            dw = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)
        ctx = context_for(hidden.device, cfg.comm, **cfg.options)
        _call(BACKWARD, cfg, ctx, dict(hidden=hidden, weight=weight, targets=targets,
                                       candidates=candidates, active_mask=active_mask,
                                       stats=stats, dhidden=dh, dweight=dw, **ups))
        if dh is not None and dh.dtype != hidden.dtype:
            dh = dh.to(hidden.dtype)
        return dh, dw, None, None, None, None


def _host_mask(mask: Any) -> Optional[np.ndarray]:
    """The mask as a host uint8 NumPy array, or None when it lives on a GPU."""
    if isinstance(mask, np.ndarray):
        return (mask.reshape(-1) != 0).astype(np.uint8)
    if isinstance(mask, torch.Tensor) and mask.device.type == "cpu":
        return (mask.detach().reshape(-1) != 0).to(torch.uint8).numpy()
    if isinstance(mask, (list, tuple)):
        return (np.asarray(mask).reshape(-1) != 0).astype(np.uint8)
    return None


class _Prepared(NamedTuple):
    lead: tuple
    hidden: torch.Tensor          # (N, H), rows contiguous
    weight: torch.Tensor          # (V_loc, H), rows contiguous
    targets: Optional[torch.Tensor]
    candidates: Optional[torch.Tensor]
    mask: Optional[torch.Tensor]  # (N,) on hidden's device
    spans: Optional[np.ndarray]   # host (n, 2) int64
    comm: Optional[Comm]
    vocab_total: int
    reduce_dhidden: Optional[bool]


def _prepare(hidden: Any, weight: Any, targets: Optional[torch.Tensor],
             candidates: Optional[torch.Tensor], loss_mask: Any, spans: Any, gap: int,
             tp_group: Any, vocab_start: int, vocab_total: int, temperature: float,
             reduce_dhidden: Optional[bool]) -> _Prepared:
    """The checks and conversions shared by :func:`logprobs` and
    :func:`weighted_logprob_loss`: 2-D views, host mask -> host spans + device mask,
    communicator."""
    if not isinstance(hidden, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise DTypeError("hidden and weight must be torch tensors")
    if hidden.dtype not in _INPUT_DTYPES:
        raise DTypeError(f"hidden: dtype is {hidden.dtype}, expected float32, bfloat16 or "
                         f"float16 (cast float64 inputs with .float())")
    if weight.dim() != 2 or hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ShapeError(f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)}: "
                         f"expected (..., H) and (V_loc, H)")
    lead = hidden.shape[:-1]
    H = hidden.shape[-1]
    h2 = hidden.reshape(-1, H)
    if h2.stride(-1) != 1:
        h2 = h2.contiguous()
    w2 = weight if weight.stride(-1) == 1 else weight.contiguous()
    N = h2.shape[0]
    t1 = None
    if targets is not None:
        if tuple(targets.shape) != tuple(lead):
            raise ShapeError(f"targets: shape is {tuple(targets.shape)}, expected "
                             f"{tuple(lead)} (hidden's leading dimensions)")
        t1 = targets.reshape(-1)
    c2 = None
    if candidates is not None:
        if tuple(candidates.shape[:-1]) != tuple(lead):
            raise ShapeError(f"candidates: shape is {tuple(candidates.shape)}, expected "
                             f"{tuple(lead)} + (K,)")
        c2 = candidates.reshape(N, candidates.shape[-1])
    mask_dev = None
    host_spans = None
    if spans is not None:
        host_spans = int64_pairs(spans, "spans")
    if loss_mask is not None:
        numel = loss_mask.numel() if isinstance(loss_mask, torch.Tensor) else \
            int(np.asarray(loss_mask).size)
        if numel != N:
            shape = tuple(getattr(loss_mask, "shape", (numel,)))
            raise ShapeError(f"loss_mask: shape is {shape} ({numel} rows), expected "
                             f"{tuple(lead)} ({N} rows, hidden's leading dimensions)")
        hm = _host_mask(loss_mask)
        if hm is not None:
            if host_spans is None:
                host_spans = spans_from_mask(hm, gap)
            mt = torch.from_numpy(hm)
            if h2.is_cuda:
                mt = mt.pin_memory().to(h2.device, non_blocking=True)
            mask_dev = mt
        else:
            m = loss_mask.reshape(-1)
            if m.device != h2.device:
                raise InvalidArgumentError(f"loss_mask is on {m.device} but hidden is on "
                                           f"{h2.device}")
            mask_dev = m if m.dtype in (torch.bool, torch.uint8) else (m != 0)
    comm = None
    if isinstance(tp_group, Comm):
        comm = tp_group  # e.g. Comm.from_mpi4py: CPU tensor parallelism over MPI
        if not vocab_total:
            vocab_total = w2.shape[0] * comm.info()[2]
    elif tp_group is not None:
        import torch.distributed as dist
        if not vocab_total:
            vocab_total = w2.shape[0] * dist.get_world_size(tp_group)
        comm = _comm_for(tp_group, vocab_total, vocab_start, w2.shape[0], h2.dtype,
                         temperature)
    if comm is not None and reduce_dhidden is None:
        reduce_dhidden = True
    return _Prepared(tuple(lead), h2, w2, t1, c2, mask_dev, host_spans, comm, int(vocab_total),
                     reduce_dhidden)


def logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: Optional[torch.Tensor],
             loss_mask: Any = None, spans: Any = None, temperature: float = 1.0,
             entropy: bool = False, tp_group: Any = None, vocab_start: int = 0, *,
             vocab_total: int = 0, lse: bool = False, logit_mean: bool = False,
             softcap: float = 0.0, candidates: Optional[torch.Tensor] = None, gap: int = 0,
             reduce_dhidden: Optional[bool] = None, **context_options: Any) -> Any:
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
        context_options: passed to spanhead.Context (threads, kernel, batch_invariant, ...).

    Returns:
        logprob (float32, targets' shape) when only logprobs are requested, else a
        :class:`HeadOutputs` (logprob, entropy, lse, logit_mean) with None for the others.
    """
    p = _prepare(hidden, weight, targets, candidates, loss_mask, spans, gap, tp_group,
                 vocab_start, vocab_total, temperature, reduce_dhidden)
    lead, h2, w2, t1, c2, mask_dev, host_spans, comm, vocab_total, reduce_dhidden = p
    want = (t1 is not None, bool(entropy), bool(lse), bool(logit_mean))
    cfg = _Config(spans=host_spans, vocab_start=int(vocab_start), vocab_total=int(vocab_total),
                  temperature=float(temperature), softcap=float(softcap), want=want, comm=comm,
                  reduce_dhidden=bool(reduce_dhidden), options=context_options)
    outs = HeadFunction.apply(h2, w2, t1, c2, mask_dev, cfg)
    outs = [o.reshape(lead) if w else None for o, w in zip(outs, want)]
    if want[1:] == (False, False, False):
        return outs[0]
    return HeadOutputs(*outs)


# ---- one-pass weighted log-prob loss -------------------------------------------------------


class LossOutputs(NamedTuple):
    """What :func:`weighted_logprob_loss` returns when per-row outputs are asked for: the
    differentiable scalar loss and the detached float32 per-row log-probs / entropy (shaped
    like targets; None when not requested)."""

    loss: torch.Tensor
    logprob: Optional[torch.Tensor]
    entropy: Optional[torch.Tensor]


class OnePassLossFunction(torch.autograd.Function):
    """autograd.Function: (hidden, weight, targets, active_mask, weights, cfg) -> (loss,
    logprob, entropy). The forward makes ONE spanhead call in one-pass mode: the upstream
    gradients of the loss are known before it (dlogprob = -weights, dentropy =
    -entropy_coef), so dhidden and dweight come out of the forward's sweep and are kept until
    the backward, which only scales them by the loss's incoming gradient. logprob and entropy
    are detached outputs. Use :func:`weighted_logprob_loss` rather than calling this."""

    @staticmethod
    def forward(fctx, hidden, weight, targets, active_mask, weights, cfg):  # noqa: D102
        N = hidden.shape[0]
        dev = hidden.device
        f32 = dict(dtype=torch.float32, device=dev)
        need_h, need_w, need_wt = (fctx.needs_input_grad[0], fctx.needs_input_grad[1],
                                   fctx.needs_input_grad[4])
        coef = cfg.entropy_coef
        lp = torch.empty(N, **f32)
        ent = torch.empty(N, **f32) if (coef != 0.0 or cfg.want_entropy) else None
        stats = torch.empty((N, 3), **f32)
        t = dict(hidden=hidden, weight=weight, targets=targets, active_mask=active_mask,
                 logprob=lp, entropy=ent, stats=stats)
        dh = dw = None
        if need_h or need_w:
            # one-pass mode: L = -sum w_i logprob_i - coef sum entropy_i, so the upstream
            # gradients are dL/dlogprob = -w and dL/dentropy = -coef, known before the sweep
            t["dlogprob"] = torch.neg(weights)
            if coef != 0.0:
                t["dentropy"] = torch.full((N,), -coef, **f32)
            if need_h:
                # the TP all-reduce of dhidden runs in float32 (the library's requirement)
                dt = torch.float32 if cfg.reduce_dhidden else hidden.dtype
                dh = t["dhidden"] = torch.empty(hidden.shape, dtype=dt, device=dev)
            if need_w:
                dw = t["dweight"] = torch.empty(weight.shape, dtype=weight.dtype, device=dev)
        ctx = context_for(dev, cfg.comm, **cfg.options)
        _call(FORWARD, cfg, ctx, t)
        # the loss over the active rows (the library writes 0 on inactive / ignored rows)
        loss = -torch.dot(weights, lp)
        if coef != 0.0:
            loss = loss - coef * ent.sum()
        if dh is not None and dh.dtype != hidden.dtype:
            dh = dh.to(hidden.dtype)
        fctx.grads = (dh, dw)
        fctx.logprob = lp if need_wt else None     # dL/dw_i = -logprob_i
        fctx.used = False
        ent_out = ent if ent is not None else torch.empty(0, **f32)
        fctx.mark_non_differentiable(lp, ent_out)
        return loss, lp, ent_out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(fctx, g_loss, g_lp, g_ent):  # noqa: D102
        if fctx.used:
            raise RuntimeError("weighted_logprob_loss: backward called a second time; the "
                               "one-pass gradients were computed in the forward and are "
                               "handed over once (retain_graph is not supported)")
        fctx.used = True
        dh, dw = fctx.grads
        lp = fctx.logprob
        fctx.grads, fctx.logprob = (None, None), None
        if g_loss is None:
            return None, None, None, None, None, None
        # the stored gradients are this Function's own tensors: scale them in place (no second
        # dweight-sized allocation); g_loss stays on the device (no host sync)
        g = g_loss.reshape(())
        if dh is not None:
            dh = dh.mul_(g.to(dh.dtype))
        if dw is not None:
            dw = dw.mul_(g.to(dw.dtype))
        dwt = None if lp is None else lp * -g.to(torch.float32)   # lp is also the caller's
        return dh, dw, None, None, dwt, None


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
    if not isinstance(targets, torch.Tensor):
        raise DTypeError(f"targets: expected a torch tensor, got {type(targets).__name__}")
    p = _prepare(hidden, weight, targets, None, loss_mask, spans, gap, tp_group, vocab_start,
                 vocab_total, temperature, reduce_dhidden)
    h2 = p.hidden
    N = h2.shape[0]
    if isinstance(weights, torch.Tensor):
        if tuple(weights.shape) != tuple(p.lead):
            raise ShapeError(f"weights: shape is {tuple(weights.shape)}, expected "
                             f"{tuple(p.lead)} (targets' shape)")
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
    coef = float(entropy_coef)
    if not np.isfinite(coef):
        raise InvalidArgumentError(f"entropy_coef: {entropy_coef}, expected a finite number")
    cfg = _Config(spans=p.spans, vocab_start=int(vocab_start), vocab_total=p.vocab_total,
                  temperature=float(temperature), softcap=float(softcap),
                  want=(True, coef != 0.0 or bool(return_entropy), False, False), comm=p.comm,
                  reduce_dhidden=bool(p.reduce_dhidden), options=context_options,
                  entropy_coef=coef, want_entropy=bool(return_entropy))
    loss, lp, ent = OnePassLossFunction.apply(h2, p.weight, p.targets, p.mask, w1, cfg)
    if not (return_logprobs or return_entropy):
        return loss
    return LossOutputs(loss, lp.reshape(p.lead) if return_logprobs else None,
                       ent.reshape(p.lead) if return_entropy else None)
