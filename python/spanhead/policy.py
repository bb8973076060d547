"""The fused RL policy loss (``sph_policy_loss``): PPO-family clipped losses (GRPO, DAPO,
Dr. GRPO), CISPO, GSPO, a KL penalty and an entropy bonus computed inside the LM head's sweep.

    import spanhead
    res = spanhead.policy_loss(hidden, weight, targets, advantages, old_logprobs,
                               loss_mask=mask, loss_type="ppo", clip_low=0.2, clip_high=0.28)
    res.loss, res.metrics["pg_clipfrac"], res.dhidden, res.dweight

Per active row (mask 1 and target >= 0), with delta = logp - old:
    ppo:   pg = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)), r = exp(clamp(delta, +-20)),
           and with clip_ratio_c and A < 0: pg = min(pg, -A clip_ratio_c)
    cispo: pg = -A sg(clip(r, ...)) logp
    gspo:  the ratio of the sequence: log r = logp - sg(logp) + sg(mean delta of the sequence),
           clamped above at 10; then as ppo
    kl:    x = ref - logp; k1 = -x, k2 = x^2 / 2, k3 = clamp(e^x - x - 1, -10, 10) (x clamped)
    loss = sum_i c_i (is_weight_i pg_i + kl_coef KL_i - entropy_coef H_i), c_i by ``agg``:
           token-mean 1/T, seq-mean-token-sum 1/S, seq-mean-token-mean 1/(S T_j),
           seq-mean-token-sum-norm 1/(S norm_length)  (T = num_tokens or the active rows,
           S = num_seqs or the sequences with an active row, T_j = a sequence's active rows).
ppo and cispo cost one sweep of the one-pass head (6 N H V flops); gspo runs forward + rho +
backward in the same call (8 N H V). The math is in spanhead.h (sph_policy_args) and
docs/policy.md.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from . import _spanhead as _ext
from . import _tensors as T
from ._errors import DTypeError, InvalidArgumentError
from .head import Context, HeadResult, _check_devices, _current_stream, _grad_dtype, _out
from .head import _rows_shape, _spans_array, _temperature, _topk_outputs, default_context

#: loss_type, kl_type and agg names (kl_type also takes verl's names: kl, mse, low_var_kl)
LOSS_TYPES = {"ppo": 0, "cispo": 1, "gspo": 2}
KL_TYPES = {"none": 0, "k1": 1, "k2": 2, "k3": 3, "kl": 1, "mse": 2, "low_var_kl": 3}
AGGS = {"token-mean": 0, "seq-mean-token-sum": 1, "seq-mean-token-mean": 2,
        "seq-mean-token-sum-norm": 3}
#: the metrics, in the order of the library's metrics tensor (sph_policy_metric)
METRICS = ("loss", "pg_loss", "kl_loss", "entropy_loss", "pg_clipfrac", "pg_clipfrac_lower",
           "ppo_kl", "tokens", "seqs")


def _name(table: dict, value: Any, what: str) -> int:
    if not isinstance(value, str) or value not in table:
        raise InvalidArgumentError(f"{what}: {value!r}, expected one of "
                                   f"{', '.join(repr(k) for k in table)}")
    return table[value]


def _real(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise DTypeError(f"{name}: expected a real number, got {v!r}")
    try:
        return float(v)
    except OverflowError:
        raise InvalidArgumentError(f"{name}: {v} is too large for a double") from None


def _count(v: Any, name: str) -> int:
    """An optional positive count: None -> 0 (the library counts); explicit values >= 1."""
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise DTypeError(f"{name}: expected an integer, got {v!r}")
    if int(v) < 1:
        raise InvalidArgumentError(f"{name}: {int(v)}, expected >= 1 (or None to count)")
    return T.check_int64(v, name)


def config(loss_type: str = "ppo", clip_low: float = 0.2, clip_high: float = 0.2,
           clip_ratio_c: Optional[float] = None, kl_type: str = "none", kl_coef: float = 0.0,
           entropy_coef: float = 0.0, agg: str = "token-mean", num_tokens: Optional[int] = None,
           num_seqs: Optional[int] = None, norm_length: Optional[float] = None) -> tuple:
    """The 11-tuple of scalars the extension takes (names checked, None defaults resolved;
    domains are the library's to check, with its messages)."""
    c = math.inf if clip_ratio_c is None else _real(clip_ratio_c, "clip_ratio_c")
    L = 0.0
    if norm_length is not None:
        L = _real(norm_length, "norm_length")
        if not L > 0:
            raise InvalidArgumentError(f"norm_length: {norm_length}, expected > 0 (or None)")
    return (_name(LOSS_TYPES, loss_type, "loss_type"), _real(clip_low, "clip_low"),
            _real(clip_high, "clip_high"), c, _name(KL_TYPES, kl_type, "kl_type"),
            _real(kl_coef, "kl_coef"), _real(entropy_coef, "entropy_coef"),
            _name(AGGS, agg, "agg"), _count(num_tokens, "num_tokens"),
            _count(num_seqs, "num_seqs"), L)


def sequence_group(comm: Any, *, nccl: bool = False):
    """A :class:`spanhead.Comm` over an mpi4py communicator whose ranks hold other rows of the
    same sequences (the context-parallel group), for ``seq_group=``. Its configuration is a
    placeholder (each rank a one-id "shard"): the group only gathers per-row records."""
    from .comm import Comm
    r, n = comm.Get_rank(), comm.Get_size()
    return Comm.from_mpi4py(comm, vocab_total=n, vocab_start=r, vocab_local=1, nccl=nccl)


class PolicyResult(HeadResult):
    """Outputs of :func:`policy_loss` by name: loss (the metrics tensor's first entry),
    metrics (a dict name -> value; Python floats for host arrays, 0-d views on a device),
    metrics_tensor (float32 (9,)), logprob, entropy, stats, dhidden, dweight, and with
    ``sum_p2=True`` / ``topk=K`` the head's extras of the loss's rows: sum_p2, topk_ids,
    topk_logprobs."""


def _as_f32(x: Any, name: str) -> Any:
    if x is None:
        return None
    if isinstance(x, (list, tuple)) or (isinstance(x, np.ndarray) and x.dtype != np.float32):
        return np.ascontiguousarray(np.asarray(x, dtype=np.float64), dtype=np.float32)
    return x


def _as_i64(x: Any, name: str) -> Any:
    if x is None:
        return None
    if isinstance(x, (list, tuple)) or (isinstance(x, np.ndarray) and x.dtype != np.int64):
        a = np.asarray(x)
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise DTypeError(f"{name}: dtype is {a.dtype}, expected integers (sequence ids)")
        return np.ascontiguousarray(a, dtype=np.int64)
    return x


def policy_loss(hidden: Any, weight: Any, targets: Any, advantages: Any, old_logprobs: Any, *,
                loss_mask: Any = None, loss_type: str = "ppo", clip_low: float = 0.2,
                clip_high: float = 0.2, clip_ratio_c: Optional[float] = None,
                ref_logprobs: Any = None, kl_type: str = "none", kl_coef: float = 0.0,
                entropy_coef: float = 0.0, agg: str = "token-mean", seq_ids: Any = None,
                num_tokens: Optional[int] = None, num_seqs: Optional[int] = None,
                norm_length: Optional[float] = None, is_weights: Any = None, spans: Any = None,
                vocab_start: int = 0, vocab_total: int = 0, temperature: float = 1.0,
                softcap: float = 0.0, logprob: Any = True, entropy: Any = True,
                stats: Any = False, dhidden: Any = True, dweight: Any = True,
                grad_dtype: Any = None, accumulate_dhidden: bool = False,
                accumulate_dweight: bool = False, allreduce_dhidden: bool = False,
                seq_group: Any = None, context: Optional[Context] = None, sum_p2: Any = False,
                topk: int = 0, topk_ids: Any = None, topk_logprobs: Any = None) -> PolicyResult:
    """The policy loss of the module docstring, its metrics and its gradients in one call.

    Args:
        hidden (N, H), weight (V_loc, H), targets (N,): as in :func:`spanhead.head_forward`
            (negative targets are ignored: no loss, no gradient).
        advantages, old_logprobs (N,) float32; ref_logprobs (N,) with a kl_type; is_weights
            (N,) optional constant multipliers; seq_ids (N,) int64, required by the seq-*
            aggregations and gspo. NumPy arrays of other float / int dtypes are converted.
        loss_mask: (N,) uint8/bool active rows; spans: host (n, 2) runs of active rows.
        temperature: a number, or a float32 (N,) tensor of per-row temperatures (as in
            :func:`spanhead.head_forward`).
        loss_type "ppo" | "cispo" | "gspo"; clip_low, clip_high (eps_low, eps_high);
        clip_ratio_c: dual clip (> 1, None = none; ppo and gspo); kl_type "none" | "k1" |
            "k2" | "k3"; kl_coef, entropy_coef >= 0; agg, num_tokens, num_seqs, norm_length:
            the aggregation (see the module docstring).
        logprob, entropy, stats, dhidden, dweight: True (allocate), False (skip) or a tensor.
            With neither dhidden nor dweight only the loss and metrics are computed.
        seq_group: a :class:`spanhead.Comm` over the ranks holding other rows of the same
            sequences (:func:`sequence_group`); T, S, T_j and gspo's ratio are then the whole
            sequences'. The metrics stay this rank's contributions (they add up).
        context: as in :func:`spanhead.head_forward`; its communicator is the TP group.
        sum_p2, topk, topk_ids, topk_logprobs: the head's extras, as in
            :func:`spanhead.head_forward` (no gradient), of the loss's rows (loss_mask / spans
            and targets >= 0; the other rows: sum_p2 0, ids -1, log-probs 0), computed in the
            same sweep: sum_j p_ij^2 (float32 (N,)) and the K most probable ids of each row's
            distribution (int64 (N, K), descending, ties the lower id first) with their
            log-probs (float32 (N, K)); merged over the TP group.

    Returns:
        :class:`PolicyResult`.
    """
    cfg = config(loss_type, clip_low, clip_high, clip_ratio_c, kl_type, kl_coef, entropy_coef,
                 agg, num_tokens, num_seqs, norm_length)
    if hidden is None or weight is None:
        raise InvalidArgumentError("hidden and weight are required")
    hs, ws = _rows_shape(hidden, "hidden"), _rows_shape(weight, "weight")
    if len(hs) != 2 or len(ws) != 2:
        raise InvalidArgumentError(f"hidden {hs} and weight {ws}: expected (N, H) and (V_loc, H)")
    n = hs[0]
    per_row = {"advantages": _as_f32(advantages, "advantages"),
               "old_logprobs": _as_f32(old_logprobs, "old_logprobs"),
               "ref_logprobs": _as_f32(ref_logprobs, "ref_logprobs"),
               "is_weights": _as_f32(is_weights, "is_weights"),
               "seq_ids": _as_i64(seq_ids, "seq_ids")}
    temperature, trows = _temperature(temperature)
    head_t = {"hidden": hidden, "weight": weight, "targets": targets, "active_mask": loss_mask,
              "temperature_rows": trows}
    _check_devices(head_t, context)
    dev = T.device_of(hidden, "hidden")
    for k, v in per_row.items():
        if v is not None and not T.is_capsule(v):
            d = T.device_of(v, k)
            if not T.same_memory_space(d, dev):
                raise InvalidArgumentError(f"{k} is on {T.device_name(d)} but hidden is on "
                                           f"{T.device_name(dev)}")
    res = PolicyResult()
    for name, spec in (("logprob", logprob), ("entropy", entropy)):
        res[name] = _out(spec, hidden, (n,), T.F32, name)
    res["stats"] = _out(stats, hidden, (n, 3), T.F32, "stats")
    for k in ("dhidden", "dweight"):
        spec = locals()[k]
        if locals()[f"accumulate_{k}"] and (spec is True or spec is None or spec is False):
            raise InvalidArgumentError(f"accumulate_{k}: needs a {k} tensor to add into")
    gdt = None
    if dhidden is True or dweight is True:
        gdt = _grad_dtype(grad_dtype, hidden)
    res["dhidden"] = _out(dhidden, hidden, hs, gdt, "dhidden")
    res["dweight"] = _out(dweight, weight, ws, gdt, "dweight")
    res["sum_p2"] = _out(sum_p2, hidden, (n,), T.F32, "sum_p2")
    res.update(_topk_outputs({"topk": topk, "topk_ids": topk_ids,
                              "topk_logprobs": topk_logprobs}, hidden, n))
    met = T.empty(hidden, (len(METRICS),), T.F32, "metrics")
    if context is None:
        stream = _current_stream(hidden, dev) if dev[0] == T.CUDA else 0
        context = default_context(dev, stream)
    s = context._dlpack_stream()
    order = (("hidden", hidden), ("weight", weight), ("targets", targets),
             ("loss_mask", loss_mask), ("logprob", res["logprob"]), ("entropy", res["entropy"]),
             ("stats", res["stats"]), ("dhidden", res["dhidden"]), ("dweight", res["dweight"]),
             ("advantages", per_row["advantages"]), ("old_logprobs", per_row["old_logprobs"]),
             ("ref_logprobs", per_row["ref_logprobs"]), ("is_weights", per_row["is_weights"]),
             ("seq_ids", per_row["seq_ids"]), ("metrics", met), ("temperature_rows", trows),
             ("sum_p2", res["sum_p2"]), ("topk_ids", res["topk_ids"]),
             ("topk_logprobs", res["topk_logprobs"]))
    caps = tuple(T.export(x, name, s) for name, x in order)
    sp = _spans_array(spans)
    group = None
    if seq_group is not None:
        group = seq_group._handle
        if group is None:
            raise InvalidArgumentError("seq_group: used after close()")
    res["workspace_bytes"] = _ext.policy_loss(
        context._live(), caps, None if sp is None else T.export(sp, "spans"),
        context._workspace_alloc(hidden), vocab_start, vocab_total, temperature, softcap,
        int(bool(accumulate_dhidden)), int(bool(accumulate_dweight)),
        int(bool(allreduce_dhidden)), cfg, group)
    res["metrics_tensor"] = met
    if T.framework(met) == "numpy":
        res["metrics"] = {k: float(met[i]) for i, k in enumerate(METRICS)}
    else:
        res["metrics"] = {k: met[i] for i, k in enumerate(METRICS)}
    res["loss"] = res["metrics"]["loss"]
    return res


__all__ = ["policy_loss", "PolicyResult", "config", "sequence_group", "LOSS_TYPES", "KL_TYPES",
           "AGGS", "METRICS"]
