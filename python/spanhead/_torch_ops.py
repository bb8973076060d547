"""The torch.library operators behind :mod:`spanhead.torch` (namespace ``spanhead``).

Every spanhead call that PyTorch sees is one of these custom operators, registered with
``torch.library.custom_op`` (the real implementation: DLPack into the C library), a fake
implementation (``register_fake``: output shapes and dtypes only, so ``torch.compile`` traces
them without data and without a graph break) and an autograd formula (``register_autograd``).

    spanhead::head_fwd     forward: logprob, entropy, lse, logit_mean (each (N,) or empty), stats,
                           sum_p2, topk_ids, topk_logprobs (opt-in, no gradient)
    spanhead::head_bwd     backward: dhidden, dweight from stats and the upstream gradients
    spanhead::weighted_loss one-pass: the loss  sum_i w_i (c_lp lp_i + c_lse lse_i + c_mean mu_i)
                            + c_ent sum_i H_i  with dhidden, dweight from the same sweep

The pattern for a new operator (e.g. a policy loss):
  1. its tensors are op arguments (``Tensor`` / ``Tensor?``), host metadata too (spans are a CPU
     int64 (n, 2) tensor; a host mask is a CPU tensor and becomes spans + a device copy inside
     the implementation, where data may be read);
  2. everything else travels packed: one ``float[]`` and one ``int[]`` (bools as 0/1, a
     communicator as its integer key, :func:`comm_key`) plus the two ``str?`` context options
     (:func:`pack_tail`). Few schema arguments keep the per-call cost down: torch's autograd
     wrapper of a custom op with a setup_context runs ``torch._library.utils.fill_defaults``
     on every forward, which reads ``schema.arguments`` (a fresh list of n Argument objects)
     2n + 1 times: ~230 us at 27 arguments, ~30 us at 10, measured on the CPU;
  3. the implementation calls :func:`run` (one spanhead call on the context of the inputs'
     device and torch's current stream); the fake returns empty tensors of the output shapes;
  4. ``register_autograd``: saved tensors through ``ctx.save_for_backward``; a one-pass
     operator returns its gradients as extra outputs and its backward scales them by the
     incoming gradient (in place in eager mode, a new tensor under compile).
"""

from __future__ import annotations

import threading
from typing import Any, List, NamedTuple, Optional, Sequence

import numpy as np
import torch

from . import _spanhead as _ext
from . import _tensors as _T
from ._errors import InvalidArgumentError
from .comm import Comm
from .head import BACKWARD, FORWARD, Context
from .meta import spans_from_mask

_LIB = "spanhead"

# ---- contexts and communicators, cached per thread -----------------------------------------

_local = threading.local()


def _cache() -> dict:
    c = getattr(_local, "cache", None)
    if c is None:
        c = _local.cache = {}
    return c


# communicators by key: operators take the key (an int), not the object
_COMMS: dict = {}
_comm_lock = threading.Lock()


def comm_key(comm: Optional[Comm]) -> int:
    """The integer an operator takes for a communicator (0: none): the Comm's own key. A
    communicator that reached an operator this way stays alive in the registry for the life of
    the process (the context cache holds it anyway)."""
    if comm is None:
        return 0
    with _comm_lock:
        _COMMS[comm._key] = comm
    return comm._key


def comm_of(key: int) -> Optional[Comm]:
    """The communicator of a key: registered by comm_key, or (a key read from the Comm under
    torch.compile) any live Comm."""
    if key == 0:
        return None
    comm = _COMMS.get(key)
    if comm is None:
        from .comm import _by_key
        comm = _by_key.get(key)
        if comm is None:
            raise InvalidArgumentError(f"tp_group: communicator key {key} is not registered "
                                       "(the spanhead.Comm was garbage collected)")
        with _comm_lock:
            _COMMS[key] = comm
    return comm


class Opts(NamedTuple):
    """The context options an operator carries (spanhead.Context's keyword arguments)."""

    threads: int = 0
    kernel: Optional[str] = None
    allow_tf32: bool = False
    batch_invariant: bool = False
    chunk_rows: int = 0
    chunk_bytes: int = 0
    tune_cache: Optional[str] = None


def opts_from(options: dict) -> Opts:
    unknown = set(options) - set(Opts._fields)
    if unknown:
        raise TypeError(f"unknown context option(s) {sorted(unknown)}; expected some of "
                        f"{list(Opts._fields)}")
    o = Opts(**options)
    for name in ("threads", "chunk_rows", "chunk_bytes"):  # before torch's List[int] sees them
        _T.check_int64(getattr(o, name), name)
    return o


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


# ---- one spanhead call ----------------------------------------------------------------------

_to_dlpack = getattr(torch.utils.dlpack, "to_dlpack", None)
_ORDER = ("hidden", "weight", "targets", "candidates", "active_mask", "logprob", "entropy",
          "lse", "logit_mean", "stats", "dlogprob", "dentropy", "dlse", "dlogit_mean",
          "dhidden", "dweight", "sum_p2", "temperature_rows", "topk_ids", "topk_logprobs")


def _cap(t: Optional[torch.Tensor]) -> Any:
    """A DLPack capsule of t without any stream synchronization (everything runs on the
    context's stream, which is the current stream)."""
    if t is None:
        return None
    t = t.detach()
    if _to_dlpack is not None:
        return _to_dlpack(t)
    return t.__dlpack__(stream=-1 if t.is_cuda else None)


def resolve_mask(hidden: torch.Tensor, mask: Optional[torch.Tensor],
                 spans: Optional[torch.Tensor], gap: int):
    """(device mask or None, host spans array or None). A host mask on a CUDA hidden becomes
    spans (built here, on the host) and a device copy from pinned memory (no host sync); a
    device mask is used as it is."""
    host_spans = None
    if spans is not None:
        host_spans = np.ascontiguousarray(spans.detach().to(torch.int64).numpy())
    if mask is None:
        return None, host_spans
    if mask.device.type == "cpu":
        t = mask.detach()
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()  # no NumPy dtype: the values are what the rule reads
        hm = torch.from_numpy(_T.host_mask_u8(t.numpy(), "loss_mask"))
        if host_spans is None:
            host_spans = spans_from_mask(hm.numpy(), gap)
        if hidden.is_cuda:
            hm = hm.pin_memory().to(hidden.device, non_blocking=True)
        return hm, host_spans
    if mask.device != hidden.device:
        raise InvalidArgumentError(f"loss_mask is on {mask.device} but hidden is on "
                                   f"{hidden.device}")
    return (mask if mask.dtype in (torch.bool, torch.uint8) else mask != 0), host_spans


def run(pass_: int, tensors: dict, spans: Optional[np.ndarray], vocab_start: int,
        vocab_total: int, temperature: float, softcap: float, allreduce: bool, comm: int,
        opts: Sequence) -> None:
    """One spanhead call on this thread's context for the inputs' device and torch's current
    stream; the workspace comes from torch's caching allocator (stream-ordered, no host sync,
    capturable in a CUDA graph)."""
    dev = tensors["hidden"].device
    ctx = context_for(dev, comm_of(comm), **Opts(*opts)._asdict())
    caps = tuple(_cap(tensors.get(k)) for k in _ORDER)

    def alloc(nbytes: int):
        return _cap(torch.empty(nbytes, dtype=torch.uint8, device=dev))

    _ext.head(ctx._live(), pass_, caps, None if spans is None else spans.__dlpack__(), alloc,
              vocab_start, vocab_total, temperature, softcap, 0, 0, int(allreduce))


def scale_stored(g: torch.Tensor, dh: Optional[torch.Tensor],
                 dw: Optional[torch.Tensor]) -> None:
    """The eager backward of a one-pass operator: the gradients its forward stored, times the
    upstream gradient g of the loss, in place, in one library call on the current stream
    (sph_scale_inplace): no host synchronization, and where g is exactly 1 (a plain
    loss.backward()) no element is read or written. One launch instead of torch's two casts
    and two multiplications over dhidden and dweight (issue 23, the small-batch rows)."""
    ts = tuple(t for t in (dh, dw) if t is not None and t.numel())
    if not ts:
        return
    dev = ts[0].device
    gs = g.detach().reshape(1)
    if gs.dtype != torch.float32 or gs.device != dev:
        gs = gs.to(device=dev, dtype=torch.float32)
    ctx = context_for(dev)
    _ext.scale(ctx._live(), _cap(gs), tuple(_cap(t) for t in ts))


def _empty(ref: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return torch.empty(0, dtype=dtype, device=ref.device)


# ---- the operators' packed scalar arguments -------------------------------------------------

# The tail every entry point prepares (spanhead.torch._prepare), in this order, and how it
# travels: fl = [temperature, softcap], it = [gap, vocab_start, vocab_total, reduce_dhidden,
# comm, threads, allow_tf32, batch_invariant, chunk_rows, chunk_bytes], kernel, tune_cache.
_FWD_TAIL = ("gap", "vocab_start", "vocab_total", "temperature", "softcap", "reduce_dhidden",
             "comm", "threads", "kernel", "allow_tf32", "batch_invariant", "chunk_rows",
             "chunk_bytes", "tune_cache")
_N_FL, _N_IT = 2, 10


def pack_tail(tail: Sequence) -> tuple:
    """(fl, it, kernel, tune_cache) of a _FWD_TAIL tuple: the operators' last four arguments."""
    (gap, vocab_start, vocab_total, temperature, softcap, reduce_dh, comm, threads, kernel,
     allow_tf32, batch_invariant, chunk_rows, chunk_bytes, tune_cache) = tail
    return ([temperature, softcap],
            [gap, vocab_start, vocab_total, int(reduce_dh), comm, threads, int(allow_tf32),
             int(batch_invariant), chunk_rows, chunk_bytes], kernel, tune_cache)


class _Tail(NamedTuple):
    gap: int
    vocab_start: int
    vocab_total: int
    temperature: float
    softcap: float
    reduce_dhidden: bool
    comm: int
    opts: tuple  # Opts fields, for run()


def _unpack(fl: Sequence[float], it: Sequence[int], kernel: Optional[str],
            tune_cache: Optional[str]) -> _Tail:
    gap, vs, vt, red, comm, threads, tf32, bi, rows, cbytes = it[:_N_IT]
    return _Tail(int(gap), int(vs), int(vt), float(fl[0]), float(fl[1]), bool(red), int(comm),
                 (int(threads), kernel, bool(tf32), bool(bi), int(rows), int(cbytes),
                  tune_cache))


# ---- spanhead::head_fwd / head_bwd ----------------------------------------------------------

@torch.library.custom_op(f"{_LIB}::head_fwd", mutates_args=())
def head_fwd(hidden: torch.Tensor, weight: torch.Tensor, targets: Optional[torch.Tensor],
             candidates: Optional[torch.Tensor], mask: Optional[torch.Tensor],
             spans: Optional[torch.Tensor], want: List[bool], fl: List[float], it: List[int],
             kernel: Optional[str], tune_cache: Optional[str],
             trows: Optional[torch.Tensor]) -> List[torch.Tensor]:
    """(logprob, entropy, lse, logit_mean, stats, sum_p2, topk_ids, topk_logprobs): each
    per-row output (N,) float32 when wanted (want[0..4); want[4], when given, asks for sum_p2,
    which has no gradient), else empty; stats (N, 3); topk (no gradient) when it carries an
    eleventh entry K > 0 (after pack_tail's ten): topk_ids (N, K) int64 and topk_logprobs
    (N, K) float32, else empty. fl, it, kernel, tune_cache: pack_tail's. trows: per-row
    temperatures (N,) float32 on hidden's device (then fl's temperature is 1), or None."""
    a = _unpack(fl, it, kernel, tune_cache)
    N = hidden.shape[0]
    K = _topk_of(it)
    f32 = dict(dtype=torch.float32, device=hidden.device)
    outs = [torch.empty(N, **f32) if w else None for w in want[:4]]
    sp2 = torch.empty(N, **f32) if len(want) > 4 and want[4] else None
    tki = torch.empty((N, K), dtype=torch.int64, device=hidden.device) if K else None
    tkl = torch.empty((N, K), **f32) if K else None
    stats = torch.empty((N, 3), **f32)
    m, sp = resolve_mask(hidden, mask, spans, a.gap)
    run(FORWARD, dict(hidden=hidden, weight=weight, targets=targets, candidates=candidates,
                      active_mask=m, logprob=outs[0], entropy=outs[1], lse=outs[2],
                      logit_mean=outs[3], stats=stats, sum_p2=sp2, temperature_rows=trows,
                      topk_ids=tki, topk_logprobs=tkl),
        sp, a.vocab_start, a.vocab_total, a.temperature, a.softcap, False, a.comm, a.opts)
    def e32(o):  # a distinct empty tensor for each absent output (outputs must not alias)
        return o if o is not None else torch.empty(0, **f32)
    return ([e32(o) for o in outs] + [stats, e32(sp2),
            tki if tki is not None else torch.empty(0, dtype=torch.int64, device=hidden.device),
            e32(tkl)])


def _topk_of(it: Sequence[int]) -> int:
    """K of head_fwd's topk: the entry after pack_tail's ten, 0 when absent."""
    return int(it[_N_IT]) if len(it) > _N_IT else 0


@head_fwd.register_fake
def _head_fwd_fake(hidden, weight, targets, candidates, mask, spans, want, fl, it, *args):
    N, K = hidden.shape[0], _topk_of(it)
    outs = [hidden.new_empty((N,) if w else (0,), dtype=torch.float32) for w in want[:4]]
    sp2 = len(want) > 4 and want[4]
    return outs + [hidden.new_empty((N, 3), dtype=torch.float32),
                   hidden.new_empty((N,) if sp2 else (0,), dtype=torch.float32),
                   hidden.new_empty((N, K) if K else (0,), dtype=torch.int64),
                   hidden.new_empty((N, K) if K else (0,), dtype=torch.float32)]


@torch.library.custom_op(f"{_LIB}::head_bwd", mutates_args=())
def head_bwd(hidden: torch.Tensor, weight: torch.Tensor, targets: Optional[torch.Tensor],
             candidates: Optional[torch.Tensor], mask: Optional[torch.Tensor],
             spans: Optional[torch.Tensor], stats: torch.Tensor,
             dlogprob: Optional[torch.Tensor], dentropy: Optional[torch.Tensor],
             dlse: Optional[torch.Tensor], dlogit_mean: Optional[torch.Tensor],
             need_dhidden: bool, need_dweight: bool, fl: List[float], it: List[int],
             kernel: Optional[str], tune_cache: Optional[str],
             trows: Optional[torch.Tensor]) -> List[torch.Tensor]:
    """(dhidden, dweight) in hidden's and weight's dtypes; empty when not needed. trows: the
    forward's per-row temperatures (the same tensor), or None."""
    a = _unpack(fl, it, kernel, tune_cache)
    reduce_dhidden = a.reduce_dhidden
    dh = dw = None
    if need_dhidden:
        # the TP all-reduce of dhidden runs in float32 (the library's requirement)
        dt = torch.float32 if reduce_dhidden else hidden.dtype
        dh = torch.empty(hidden.shape, dtype=dt, device=hidden.device)
    if need_dweight:
        dw = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)
    if dh is not None or dw is not None:
        m, sp = resolve_mask(hidden, mask, spans, a.gap)
        run(BACKWARD, dict(hidden=hidden, weight=weight, targets=targets, candidates=candidates,
                           active_mask=m, stats=stats, dlogprob=dlogprob, dentropy=dentropy,
                           dlse=dlse, dlogit_mean=dlogit_mean, dhidden=dh, dweight=dw,
                           temperature_rows=trows),
            sp, a.vocab_start, a.vocab_total, a.temperature, a.softcap,
            reduce_dhidden and dh is not None, a.comm, a.opts)
    if dh is not None and dh.dtype != hidden.dtype:
        dh = dh.to(hidden.dtype)
    return [dh if dh is not None else _empty(hidden, hidden.dtype),
            dw if dw is not None else _empty(weight, weight.dtype)]


@head_bwd.register_fake
def _head_bwd_fake(hidden, weight, targets, candidates, mask, spans, stats, dlogprob, dentropy,
                   dlse, dlogit_mean, need_dhidden, need_dweight, *args):
    return [hidden.new_empty(hidden.shape if need_dhidden else (0,)),
            weight.new_empty(weight.shape if need_dweight else (0,))]


def _head_setup(ctx, inputs, output):
    hidden, weight, targets, candidates, mask, spans, want = inputs[:7]
    trows = inputs[11] if len(inputs) > 11 else None  # per-row temperatures: the backward's too
    ctx.save_for_backward(hidden, weight, targets, candidates, mask, spans, output[4], trows)
    # stats, sum_p2, topk_ids, topk_logprobs (no gradient)
    ctx.mark_non_differentiable(output[4], output[5], output[6], output[7])
    ctx.set_materialize_grads(False)
    ctx.want = want
    ctx.tail = inputs[7:11]  # fl, it, kernel, tune_cache: passed on to head_bwd


def _head_backward(ctx, grads):
    hidden, weight, targets, candidates, mask, spans, stats, trows = ctx.saved_tensors
    need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    ups = [g.to(torch.float32).contiguous() if (g is not None and w) else None
           for g, w in zip(grads[:4], ctx.want)]
    none = (None,) * 12
    if not (need_h or need_w) or all(u is None for u in ups):
        return none
    dh, dw = head_bwd(hidden, weight, targets, candidates, mask, spans, stats, *ups,
                      need_h, need_w, *ctx.tail, trows)
    return (dh if need_h else None, dw if need_w else None) + none[2:]


head_fwd.register_autograd(_head_backward, setup_context=_head_setup)


# ---- spanhead::weighted_loss (one pass) -----------------------------------------------------

@torch.library.custom_op(f"{_LIB}::weighted_loss", mutates_args=())
def weighted_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                  mask: Optional[torch.Tensor], spans: Optional[torch.Tensor],
                  weights: torch.Tensor, fl: List[float], it: List[int],
                  kernel: Optional[str], tune_cache: Optional[str],
                  trows: Optional[torch.Tensor]) -> List[torch.Tensor]:
    """(loss, logprob, entropy, lse, logit_mean, dhidden, dweight) of
    L = sum_i w_i (c_lp lp_i + c_lse lse_i + c_mean mu_i) + c_ent sum_i H_i over the active
    rows, in ONE spanhead call: the upstream gradients (c_lp w, c_ent, c_lse w, c_mean w) are
    known before the sweep, so dhidden and dweight come out of the forward (empty when not
    needed; so are entropy, lse, logit_mean when their coefficient is 0 and they are not
    asked for). fl = pack_tail's + [c_lp, c_lse, c_mean, c_ent], it = pack_tail's +
    [want_entropy, need_dhidden, need_dweight] (pack_loss). trows: per-row temperatures or
    None."""
    a = _unpack(fl, it, kernel, tune_cache)
    c_lp, c_lse, c_mean, c_ent = (float(x) for x in fl[_N_FL:_N_FL + 4])
    want_entropy, need_dhidden, need_dweight = (bool(x) for x in it[_N_IT:_N_IT + 3])
    reduce_dhidden = a.reduce_dhidden
    N = hidden.shape[0]
    dev = hidden.device
    f32 = dict(dtype=torch.float32, device=dev)
    lp = torch.empty(N, **f32)
    ent = torch.empty(N, **f32) if (c_ent != 0.0 or want_entropy) else None
    lse = torch.empty(N, **f32) if c_lse != 0.0 else None
    mu = torch.empty(N, **f32) if c_mean != 0.0 else None
    stats = torch.empty((N, 3), **f32)
    t = dict(hidden=hidden, weight=weight, targets=targets, logprob=lp, entropy=ent, lse=lse,
             logit_mean=mu, stats=stats, temperature_rows=trows)
    dh = dw = None
    if need_dhidden or need_dweight:
        t["dlogprob"] = weights * c_lp
        if c_ent != 0.0:
            t["dentropy"] = torch.full((N,), c_ent, **f32)
        if c_lse != 0.0:
            t["dlse"] = weights * c_lse
        if c_mean != 0.0:
            t["dlogit_mean"] = weights * c_mean
        if need_dhidden:
            dt = torch.float32 if reduce_dhidden else hidden.dtype
            dh = t["dhidden"] = torch.empty(hidden.shape, dtype=dt, device=dev)
        if need_dweight:
            dw = t["dweight"] = torch.empty(weight.shape, dtype=weight.dtype, device=dev)
    m, sp = resolve_mask(hidden, mask, spans, a.gap)
    t["active_mask"] = m
    run(FORWARD, t, sp, a.vocab_start, a.vocab_total, a.temperature, a.softcap,
        reduce_dhidden and dh is not None, a.comm, a.opts)
    # the loss over the active rows (the library writes 0 on inactive / ignored rows)
    per_row = lp * c_lp
    if lse is not None:
        per_row = per_row + lse * c_lse
    if mu is not None:
        per_row = per_row + mu * c_mean
    loss = torch.dot(weights, per_row)
    if c_ent != 0.0:
        loss = loss + c_ent * ent.sum()
    if dh is not None and dh.dtype != hidden.dtype:
        dh = dh.to(hidden.dtype)
    return [loss, lp, ent if ent is not None else _empty(hidden),
            lse if lse is not None else _empty(hidden), mu if mu is not None else _empty(hidden),
            dh if dh is not None else _empty(hidden, hidden.dtype),
            dw if dw is not None else _empty(weight, weight.dtype)]


def pack_loss(tail: Sequence, c_lp: float, c_lse: float, c_mean: float, c_ent: float,
              want_entropy: bool, need_dhidden: bool, need_dweight: bool) -> tuple:
    """weighted_loss's (fl, it, kernel, tune_cache) of a _FWD_TAIL tuple and its own scalars."""
    fl, it, kernel, tune_cache = pack_tail(tail)
    return (fl + [c_lp, c_lse, c_mean, c_ent],
            it + [int(want_entropy), int(need_dhidden), int(need_dweight)], kernel, tune_cache)


@weighted_loss.register_fake
def _weighted_loss_fake(hidden, weight, targets, mask, spans, weights, fl, it, *args):
    N = hidden.shape[0]
    c_lse, c_mean, c_ent = fl[_N_FL + 1], fl[_N_FL + 2], fl[_N_FL + 3]
    want_entropy, need_dhidden, need_dweight = it[_N_IT], it[_N_IT + 1], it[_N_IT + 2]

    def f32(n):
        return hidden.new_empty((n,), dtype=torch.float32)
    return [hidden.new_empty((), dtype=torch.float32), f32(N),
            f32(N if (c_ent != 0.0 or want_entropy) else 0), f32(N if c_lse != 0.0 else 0),
            f32(N if c_mean != 0.0 else 0),
            hidden.new_empty(hidden.shape if need_dhidden else (0,)),
            weight.new_empty(weight.shape if need_dweight else (0,))]


def _loss_setup(ctx, inputs, output):
    _, lp, ent, lse, mu, dh, dw = output
    ctx.save_for_backward(dh, dw, lp, lse, mu)
    # only the loss is differentiable; no zero gradients of the (N, H) / (V, H) outputs either
    ctx.mark_non_differentiable(lp, ent, lse, mu, dh, dw)
    ctx.set_materialize_grads(False)
    fl, it = inputs[6], inputs[7]
    ctx.coefs = tuple(fl[_N_FL:_N_FL + 3])  # c_lp, c_lse, c_mean
    ctx.need = (bool(it[_N_IT + 1]), bool(it[_N_IT + 2]))  # need_dhidden, need_dweight
    ctx.used = False


def _loss_backward(ctx, grads):
    g_loss = grads[0]
    none = (None,) * 11
    if getattr(ctx, "used", False):
        raise RuntimeError("weighted_logprob_loss: backward called a second time; the "
                           "one-pass gradients were computed in the forward and are handed "
                           "over once (retain_graph is not supported)")
    ctx.used = True
    dh, dw, lp, lse, mu = ctx.saved_tensors
    if g_loss is None:
        return none
    g = g_loss.reshape(())
    # traced (torch.compile's AOT backward: fake / functional tensors, which torch 2.11 does
    # not flag through is_compiling()) takes the torch ops; real tensors the library call
    compiling = torch.compiler.is_compiling() or type(dh) is not torch.Tensor or \
        type(dw) is not torch.Tensor
    gh = gw = gwt = None
    # the stored gradients are this operator's own outputs, held only here: eager mode scales
    # them in place (no second dweight-sized allocation); g stays on the device (no sync)
    want_h = ctx.need[0] and ctx.needs_input_grad[0]
    want_w = ctx.need[1] and ctx.needs_input_grad[1]
    if compiling:
        gh = dh * g.to(dh.dtype) if want_h else None
        gw = dw * g.to(dw.dtype) if want_w else None
    elif want_h or want_w:
        gh, gw = (dh if want_h else None), (dw if want_w else None)
        scale_stored(g, gh, gw)
    if ctx.needs_input_grad[5]:
        c_lp, c_lse, c_mean = ctx.coefs
        d = lp * c_lp
        if lse.numel():
            d = d + lse * c_lse
        if mu.numel():
            d = d + mu * c_mean
        gwt = d * g.to(torch.float32)
    return (gh, gw, None, None, None, gwt) + none[6:]


weighted_loss.register_autograd(_loss_backward, setup_context=_loss_setup)
