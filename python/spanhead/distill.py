"""The fused distillation losses (``sph_distill_loss``): forward KL, reverse KL and Liger's
generalized JSD of the student's distribution Q against a teacher's P, computed with their
gradients inside spanhead's LM-head sweep, without materializing logits.

    import spanhead
    res = spanhead.distill_loss(hidden, weight, teacher_topk_ids=ids,
                                teacher_topk_logprobs=lps, kind="jsd", beta=0.5)
    res.loss, res.dhidden, res.dweight

Q = softmax(z) of the student (softcap, then / temperature); P = the teacher's: dense
(teacher_hidden (N, H_T), teacher_weight (V_loc, H_T), P = softmax(. / T_T), T_T =
teacher_temperature (a number or one per row) or temperature) or sparse (teacher_topk_ids (N, K) global ids, -1 padding,
teacher_topk_logprobs (N, K); the rest of the vocabulary is one tail bin of mass
1 - sum P_k). Per active row: forward_kl KL(P||Q), reverse_kl KL(Q||P), jsd
beta KL(P||M) + (1 - beta) KL(Q||M), M = beta P + (1 - beta) Q (beta 0: forward KL, 1: reverse
KL, as Liger). reduction "mean" (over active rows; or over num_tokens / the active rows of a
seq_group, for micro-batches and context parallelism), "sum" or "none"; no T^2 factor. The
math: docs/distill.md.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from . import _spanhead as _ext
from . import _tensors as T
from ._errors import InvalidArgumentError
from .head import Context, HeadResult, _check_devices, _current_stream, _grad_dtype, _out
from .head import _rows_shape, _spans_array, _temperature, default_context
from .policy import _count, _name, _real

KINDS = {"forward_kl": 0, "reverse_kl": 1, "jsd": 2}
REDUCTIONS = {"mean": 0, "sum": 1, "none": 2}


def config(kind: str = "forward_kl", beta: float = 0.5,
           teacher_temperature: Any = None, reduction: str = "mean",
           num_tokens: Optional[int] = None) -> tuple:
    """The 5-tuple of scalars the extension takes (names checked; domains are the library's
    to check, with its messages). ``kind`` accepts "forward-kl" spellings too; num_tokens None
    = 0 (count the active rows); a per-row teacher_temperature (an array) leaves the scalar 0
    (the caller passes the array as teacher_temperature_rows)."""
    k = kind.replace("-", "_") if isinstance(kind, str) else kind
    if _temperature(teacher_temperature)[1] is not None:
        teacher_temperature = None  # per-row values: a tensor slot of their own, the scalar 0
    tt = 0.0 if teacher_temperature is None else _real(teacher_temperature, "teacher_temperature")
    if teacher_temperature is not None and tt == 0.0:
        # 0 is the C API's "unset"; here that is None, so an explicit 0 is a bad temperature
        raise InvalidArgumentError("teacher_temperature: 0, expected T > 0 (None = the "
                                   "student's temperature)")
    return (_name(KINDS, k, "kind"), _real(beta, "beta"), tt,
            _name(REDUCTIONS, reduction, "reduction"), _count(num_tokens, "num_tokens"))


class DistillResult(HeadResult):
    """Outputs of :func:`distill_loss` by name: loss (a float for host arrays with reduction
    mean / sum, the float32 (N,) array for none), loss_tensor, dhidden, dweight."""


def distill_loss(hidden: Any, weight: Any, *, teacher_hidden: Any = None,
                 teacher_weight: Any = None, teacher_topk_ids: Any = None,
                 teacher_topk_logprobs: Any = None, loss_mask: Any = None,
                 kind: str = "forward_kl", beta: float = 0.5, temperature: float = 1.0,
                 teacher_temperature: Any = None, reduction: str = "mean",
                 dloss: Any = None, spans: Any = None, vocab_start: int = 0,
                 vocab_total: int = 0, softcap: float = 0.0, dhidden: Any = True,
                 dweight: Any = True, grad_dtype: Any = None, accumulate_dhidden: bool = False,
                 accumulate_dweight: bool = False, allreduce_dhidden: bool = False,
                 num_tokens: Optional[int] = None, seq_group: Any = None,
                 context: Optional[Context] = None) -> DistillResult:
    """The distillation loss of the module docstring and its gradients in one call.

    Args:
        hidden (N, H), weight (V_loc, H): the student, as in :func:`spanhead.head_forward`.
        teacher_hidden + teacher_weight (dense) or teacher_topk_ids + teacher_topk_logprobs
            (sparse; ids int64 or int32, log-probs float32): exactly one teacher.
        loss_mask: (N,) uint8/bool active rows; spans: host (n, 2) runs of active rows.
        temperature: a number or an (N,) float32 array of per-row temperatures (the dense
            teacher then takes row i's unless teacher_temperature is given).
        teacher_temperature: the dense teacher's, a number or an (N,) float32 array of
            per-row values (None: the student's; a sparse teacher takes none).
        dloss: reduction "none" only: (N,) float32 upstream gradient of each row's loss (the
            gradients are then of sum_i dloss_i loss_i; None = 1).
        dhidden, dweight: True (allocate), False (skip) or a tensor.
        num_tokens: reduction mean's divisor T of a global batch (>= 1; None = the active rows
            counted), so that the calls of its micro-batches add up to the global mean.
        seq_group: a :class:`spanhead.Comm` over the ranks holding the other rows (context
            parallelism; :func:`spanhead.sequence_group`): the mean then divides by the active
            rows of the whole group, and the ranks' losses and gradients add up to it.
        context: as in :func:`spanhead.head_forward`; its communicator is the TP group.
    """
    cfg = config(kind, beta, teacher_temperature, reduction, num_tokens)
    group = None
    if seq_group is not None:
        group = getattr(seq_group, "_handle", None)
        if group is None:
            raise InvalidArgumentError("seq_group: expected an open spanhead.Comm (or None), "
                                       f"got {type(seq_group).__name__}")
    if hidden is None or weight is None:
        raise InvalidArgumentError("hidden and weight are required")
    hs, ws = _rows_shape(hidden, "hidden"), _rows_shape(weight, "weight")
    if len(hs) != 2 or len(ws) != 2:
        raise InvalidArgumentError(f"hidden {hs} and weight {ws}: expected (N, H) and (V_loc, H)")
    n = hs[0]
    if isinstance(teacher_topk_logprobs, np.ndarray) and teacher_topk_logprobs.dtype != np.float32:
        teacher_topk_logprobs = np.ascontiguousarray(teacher_topk_logprobs, dtype=np.float32)
    if isinstance(dloss, np.ndarray) and dloss.dtype != np.float32:
        dloss = np.ascontiguousarray(dloss, dtype=np.float32)
    temperature, trows = _temperature(temperature)
    ttrows = _temperature(teacher_temperature)[1]
    if isinstance(ttrows, np.ndarray) and ttrows.dtype != np.float32:
        ttrows = np.ascontiguousarray(ttrows, dtype=np.float32)
    _check_devices({"hidden": hidden, "weight": weight, "active_mask": loss_mask,
                    "temperature_rows": trows, "teacher_temperature_rows": ttrows}, context)
    for k in ("dhidden", "dweight"):
        spec = locals()[k]
        if locals()[f"accumulate_{k}"] and (spec is True or spec is None or spec is False):
            raise InvalidArgumentError(f"accumulate_{k}: needs a {k} tensor to add into")
    res = DistillResult()
    gdt = None
    if dhidden is True or dweight is True:
        gdt = _grad_dtype(grad_dtype, hidden)
    res["dhidden"] = _out(dhidden, hidden, hs, gdt, "dhidden")
    res["dweight"] = _out(dweight, weight, ws, gdt, "dweight")
    loss = T.empty(hidden, (n,) if cfg[3] == 2 else (1,), T.F32, "loss")
    dev = T.device_of(hidden, "hidden")
    if context is None:
        stream = _current_stream(hidden, dev) if dev[0] == T.CUDA else 0
        context = default_context(dev, stream)
    s = context._dlpack_stream()
    order = (("hidden", hidden), ("weight", weight), ("loss_mask", loss_mask),
             ("dhidden", res["dhidden"]), ("dweight", res["dweight"]),
             ("teacher_hidden", teacher_hidden), ("teacher_weight", teacher_weight),
             ("teacher_topk_ids", teacher_topk_ids),
             ("teacher_topk_logprobs", teacher_topk_logprobs), ("dloss", dloss), ("loss", loss),
             ("temperature_rows", trows), ("teacher_temperature_rows", ttrows))
    caps = tuple(T.export(x, name, s) for name, x in order)
    sp = _spans_array(spans)
    res["workspace_bytes"] = _ext.distill_loss(
        context._live(), caps, None if sp is None else T.export(sp, "spans"),
        context._workspace_alloc(hidden), vocab_start, vocab_total, temperature, softcap,
        int(bool(accumulate_dhidden)), int(bool(accumulate_dweight)),
        int(bool(allreduce_dhidden)), cfg, group)
    res["loss_tensor"] = loss
    if cfg[3] == 2:
        res["loss"] = loss
    else:
        res["loss"] = float(loss[0]) if T.framework(loss) == "numpy" else loss[0]
    return res


__all__ = ["distill_loss", "DistillResult", "config", "KINDS", "REDUCTIONS"]
