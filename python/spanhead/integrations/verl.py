"""spanhead for verl (docs/integrations.md).

    import spanhead.integrations.verl as shv
    shv.patch()     # verl's use_fused_kernels paths (the triton backend's
                    # linear_cross_entropy, every module that imported it, and the torch
                    # backend's FusedLinearForPPO) run spanhead

* :func:`linear_cross_entropy` has the contract of verl's
  ``verl.utils.kernel.linear_cross_entropy.linear_cross_entropy`` (a ``LinearCrossEntropy.apply``):
  ``(hidden, weight, labels, temperature=1.0, reduction="none", dist_process_group=None) ->
  (log_probs, entropy)``, both float32 over the flattened tokens (``(N,)``; with ``reduction``
  ``"sum"`` / ``"mean"`` the log-probs are the 0-dim sum / mean over all N tokens), autograd
  through both; with a process group of more than one rank the weight is the local vocabulary
  shard (rank r holds ids ``[r V_loc, (r + 1) V_loc)``), labels are global ids and, as in verl,
  ``d_hidden`` is this rank's partial (not summed over the group). An NCCL group uses
  spanhead's TP path; any other (gloo) combines the shards' statistics in torch (``_tp.py``).
  ``temperature`` may also be a tensor (spanhead's per-row temperature, issue 25): one per
  token (labels' shape, or the flattened N), or one per sample (``(B,)`` / ``(B, 1)`` for a
  ``(B, T, H)`` hidden: dynamic-temperature setups, verl PR 6110), expanded to the tokens; the
  same in ``FusedLinearForPPO.forward`` and :func:`ppo_loss`.
* :func:`patch` / :func:`unpatch`: idempotent, reversible; the originals are recorded.
* :func:`ppo_loss`: verl's actor loss (``verl.workers.utils.losses.ppo_loss``: the
  ``policy_loss`` registry's vanilla (dual-clip) / gspo / cispo, its KL losses and
  ``loss_agg_mode``s, the entropy bonus, the global batch info) computed from the hidden states
  by one ``spanhead.torch.policy_loss`` call; configs it cannot serve fall back (one-time
  warning) to verl's own functions on spanhead's log-probs: the same loss, not the fused cost.

Supported verl: ``>=0.9.0,<0.10`` (tested with 0.9.1); another version makes :func:`patch` and
the fallback raise :class:`spanhead.UnsupportedError` naming it.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Tuple

import torch

from .. import torch as _sht
from .._errors import InvalidArgumentError, ShapeError
from . import _tp, check_version, warn_once

VERL_MIN, VERL_MAX = "0.9.0", "0.10"
_TARGET = "verl.utils.kernel.linear_cross_entropy"
_REDUCTIONS = ("none", "sum", "mean")

__all__ = ["linear_cross_entropy", "patch", "unpatch", "is_patched", "ppo_loss",
           "map_config", "VERL_MIN", "VERL_MAX"]


def _group_info(group: Any) -> Tuple[int, int]:
    """(rank, size) of a torch.distributed group; (0, 1) for None."""
    if group is None:
        return 0, 1
    import torch.distributed as dist
    return dist.get_rank(group), dist.get_world_size(group)


def _temperature(temperature: Any, lead: Tuple[int, ...]) -> Any:
    """A float, or a per-row temperature tensor of ``lead`` (the tokens' shape): one per
    token (lead, or its flattened size), or one per sample ((B,) / (B, 1) with lead (B, T)),
    expanded to the tokens."""
    if isinstance(temperature, torch.Tensor):
        t = temperature
        n = 1
        for d in lead:
            n *= d
        if tuple(t.shape) == tuple(lead):
            return t
        if t.dim() == 1 and t.shape[0] == n:
            return t.reshape(lead)
        if len(lead) == 2 and t.dim() in (1, 2) and t.shape[0] == lead[0] and t.numel() == lead[0]:
            return t.reshape(lead[0], 1).expand(lead)  # per sample -> its tokens
        raise ShapeError(f"temperature: shape {tuple(t.shape)}, expected a number, one per token "
                         f"{tuple(lead)} or one per sample ({lead[0] if lead else 0},)")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise InvalidArgumentError(f"temperature: expected a float or a tensor, got "
                                   f"{type(temperature).__name__}")
    return float(temperature)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         temperature: Any = 1.0, reduction: str = "none",
                         dist_process_group: Any = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl's ``linear_cross_entropy`` on spanhead: ``(log_probs, entropy)`` of
    ``softmax(hidden @ weight.T / temperature)`` for the target ``labels``, float32, over the
    flattened tokens (see the module's docstring for the exact contract). Labels must be valid
    ids ``0 <= label < V`` (V = V_loc x group size): verl's kernel has no ignored label, so an
    out-of-range label is an :class:`InvalidArgumentError` here rather than a silent value."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, torch.Tensor)):
        raise InvalidArgumentError(f"temperature: expected a float or a tensor, got "
                                   f"{type(temperature).__name__}")
    if not isinstance(reduction, str) or reduction.lower() not in _REDUCTIONS:
        raise InvalidArgumentError(f"reduction: {reduction!r}, expected one of {_REDUCTIONS}")
    if not isinstance(hidden, torch.Tensor) or not isinstance(weight, torch.Tensor) or \
            not isinstance(labels, torch.Tensor):
        raise InvalidArgumentError("hidden, weight and labels must be torch tensors")
    if hidden.dim() < 1 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ShapeError(f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)}: "
                         f"expected (..., H) and (V_loc, H)")
    h2 = hidden.reshape(-1, hidden.shape[-1])
    lab = labels.reshape(-1)
    if lab.shape[0] != h2.shape[0]:
        raise ShapeError(f"labels: {lab.shape[0]} tokens (shape {tuple(labels.shape)}), hidden "
                         f"has {h2.shape[0]} (shape {tuple(hidden.shape)})")
    if lab.dtype.is_floating_point or lab.dtype == torch.bool:
        raise InvalidArgumentError(f"labels: dtype is {lab.dtype}, expected integer ids")
    temperature = _temperature(temperature, tuple(hidden.shape[:-1]))
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.reshape(-1)  # the flattened tokens, as hidden
    rank, size = _group_info(dist_process_group)
    v_loc = weight.shape[0]
    v_total = v_loc * size
    if lab.numel():
        lo, hi = int(lab.min()), int(lab.max())
        if lo < 0 or hi >= v_total:
            bad = lo if lo < 0 else hi
            raise InvalidArgumentError(f"labels: id {bad} outside the vocabulary [0, {v_total})")
    if _tp.uses_torch_combine(dist_process_group):     # gloo & co: combined in torch
        lp, ent = _tp.logprob_entropy(h2, weight, lab, rank * v_loc, dist_process_group,
                                      temperature)
    else:
        kw: Dict[str, Any] = {}
        if size > 1:
            kw = dict(tp_group=dist_process_group, vocab_start=rank * v_loc,
                      vocab_total=v_total, reduce_dhidden=False)
        out = _sht.logprobs(h2, weight, lab, temperature=temperature, entropy=True, **kw)
        lp, ent = out.logprob, out.entropy
    red = reduction.lower()
    if red == "sum":
        lp = lp.sum()
    elif red == "mean":
        lp = lp.mean()
    return lp, ent


# ---- patch / unpatch ------------------------------------------------------------------------

_patched: List[Tuple[Any, str, Any, Any]] = []   # (object, attribute, original, replacement)
_TORCH_PATH = "verl.utils.experimental.torch_functional"


def is_patched() -> bool:
    return bool(_patched)


def _fused_linear_for_ppo_forward(self, hidden_states, vocab_weights, input_ids,
                                  temperature=1.0):
    """``FusedLinearForPPO.forward`` (verl's torch backend of the fused kernels, the default
    ``impl_backend``) on spanhead: log-probs float32 and entropy in hidden's dtype (as verl's
    torch path returns them), of ``input_ids``' shape."""
    if hidden_states.ndim not in (2, 3) or tuple(input_ids.shape) != \
            tuple(hidden_states.shape[:-1]):
        raise ShapeError(f"hidden_states {tuple(hidden_states.shape)} and input_ids "
                         f"{tuple(input_ids.shape)}: expected (..., H) and (...)")
    lp, ent = linear_cross_entropy(hidden_states, vocab_weights, input_ids.to(torch.int64),
                                   _temperature(temperature, tuple(input_ids.shape)), "none")
    shape = input_ids.shape
    return lp.view(shape), ent.to(hidden_states.dtype).view(shape)


def _swap(obj: Any, attr: str, orig: Any, new: Any) -> None:
    setattr(obj, attr, new)
    _patched.append((obj, attr, orig, new))


def patch() -> None:
    """Make verl's fused-kernel paths run spanhead: ``verl.utils.kernel.linear_cross_entropy``'s
    ``linear_cross_entropy`` (the triton backend of FSDP's fused forwards and verl's Megatron
    forwards) and every loaded ``verl.*`` module attribute bound to it (the Megatron forwards
    import it by name at module level; the FSDP forwards import it inside the function, so
    they see the replaced attribute), and ``FusedLinearForPPO.forward`` (the torch backend,
    ``fused_kernel_options.impl_backend=torch``, verl's default). Idempotent (a second call
    patches only modules loaded since); :func:`unpatch` restores every original. An
    unsupported verl version raises :class:`spanhead.UnsupportedError` and changes nothing."""
    check_version("verl", VERL_MIN, VERL_MAX)
    import importlib
    mod = importlib.import_module(_TARGET)
    etf = importlib.import_module(_TORCH_PATH)
    if not _patched:
        _swap(mod, "linear_cross_entropy", mod.linear_cross_entropy, linear_cross_entropy)
        cls = etf.FusedLinearForPPO
        _swap(cls, "forward", cls.__dict__["forward"], _fused_linear_for_ppo_forward)
    orig = _patched[0][2]
    for name, m in list(sys.modules.items()):
        if m is None or m is mod or not (name == "verl" or name.startswith("verl.")):
            continue
        d = getattr(m, "__dict__", {})
        for attr, val in list(d.items()):
            if val is orig:
                _swap(m, attr, orig, linear_cross_entropy)


def unpatch() -> None:
    """Restore everything :func:`patch` replaced (a no-op when nothing is patched)."""
    while _patched:
        obj, attr, orig, new = _patched.pop()
        if obj.__dict__.get(attr) is new:
            setattr(obj, attr, orig)


# ---- verl's actor loss from the hidden states ------------------------------------------------

_LOSS_MODES = {"vanilla": "ppo", "gspo": "gspo", "cispo": "cispo"}
_KL = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}
_AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _cfg(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, dict):
        return config.get(key, default)
    if hasattr(config, key):
        v = getattr(config, key)
        return default if v is None and default is not None else v
    get = getattr(config, "get", None)
    return get(key, default) if callable(get) else default


def map_config(config: Any) -> Tuple[Optional[Dict[str, Any]], str]:
    """``(kwargs of spanhead.torch.policy_loss, "")`` for a verl actor config the fused loss
    serves exactly, else ``(None, reason)``."""
    pl = _cfg(config, "policy_loss", None)
    mode = _cfg(pl, "loss_mode", "vanilla") if pl is not None else "vanilla"
    if mode not in _LOSS_MODES:
        return None, f"policy_loss.loss_mode={mode!r} (spanhead fuses {sorted(_LOSS_MODES)})"
    agg = _cfg(config, "loss_agg_mode", "token-mean")
    if agg not in _AGGS:
        return None, f"loss_agg_mode={agg!r} (spanhead fuses {list(_AGGS)})"
    clip = _cfg(config, "clip_ratio", 0.2)
    low = _cfg(config, "clip_ratio_low", None)
    high = _cfg(config, "clip_ratio_high", None)
    kw: Dict[str, Any] = dict(loss_type=_LOSS_MODES[mode], agg=agg,
                              clip_low=float(clip if low is None else low),
                              clip_high=float(clip if high is None else high),
                              entropy_coef=float(_cfg(config, "entropy_coeff", 0.0) or 0.0))
    if mode == "vanilla":   # verl's vanilla loss always applies the dual clip (default 3)
        kw["clip_ratio_c"] = float(_cfg(config, "clip_ratio_c", 3.0))
    if _cfg(config, "use_kl_loss", False):
        kt = _cfg(config, "kl_loss_type", "low_var_kl")
        if kt not in _KL:
            return None, f"kl_loss_type={kt!r} (spanhead fuses {sorted(_KL)})"
        kw.update(kl_type=_KL[kt], kl_coef=float(_cfg(config, "kl_loss_coef", 0.0)))
    return kw, ""


def _verl_metrics(lp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                  kw: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """verl's per-micro-batch metrics (masked means over the response mask) from the detached
    log-probs, with verl's own definitions for each loss mode."""
    m = mask.to(torch.float32)
    n = m.sum()

    def mmean(x):
        return (x * m).sum() / n
    delta = lp - old
    lo, hi = 1 - kw["clip_low"], 1 + kw["clip_high"]
    out: Dict[str, torch.Tensor] = {}
    if kw["loss_type"] == "gspo":
        seq = (delta * m).sum(-1) / m.sum(-1).clamp(min=1)
        r = torch.exp(torch.clamp(seq.unsqueeze(-1).expand_as(delta), max=10.0))
        out["actor/pg_clipfrac"] = mmean(torch.gt(-adv * r.clamp(lo, hi), -adv * r).float())
        out["actor/pg_clipfrac_lower"] = torch.zeros((), device=lp.device)
        out["actor/ppo_kl"] = mmean(-delta)
        return out
    d = torch.clamp(delta, -20.0, 20.0)
    r = torch.exp(d)
    out["actor/ppo_kl"] = mmean(-d)
    if kw["loss_type"] == "cispo":
        out["actor/pg_clipfrac"] = mmean((r != r.clamp(lo, hi)).float())
        out["actor/pg_clipfrac_lower"] = torch.zeros((), device=lp.device)
        return out
    p1, p2 = -adv * r, -adv * r.clamp(lo, hi)
    c1 = torch.maximum(p1, p2)
    out["actor/pg_clipfrac"] = mmean(torch.gt(p2, p1).float())
    out["actor/pg_clipfrac_lower"] = mmean(torch.gt(c1, -adv * kw["clip_ratio_c"]).float() *
                                           (adv < 0).float())
    return out


def ppo_loss(config: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
             response_mask: torch.Tensor, old_log_prob: torch.Tensor,
             advantages: torch.Tensor, ref_log_prob: Optional[torch.Tensor] = None,
             rollout_is_weights: Optional[torch.Tensor] = None, temperature: Any = 1.0,
             global_batch_info: Optional[Dict[str, Any]] = None,
             dist_process_group: Any = None,
             **context_options: Any) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """verl's actor loss (``verl.workers.utils.losses.ppo_loss``) of the padded response
    batch, from the hidden states: ``hidden (B, T, H)``, ``labels``, ``response_mask``,
    ``old_log_prob``, ``advantages`` (and ``ref_log_prob`` with ``config.use_kl_loss``,
    ``rollout_is_weights``) of shape ``(B, T)``; ``global_batch_info`` as verl's
    ``config.global_batch_info`` (``dp_size``, ``batch_num_tokens``, ``global_batch_size``,
    ``loss_scale_factor``; default: this micro-batch). Returns ``(loss, metrics)``: the loss
    is ``pg_loss - entropy_coeff * entropy_loss + kl_loss_coef * kl_loss`` as verl sums it
    (the entropy term always: with ``entropy_coeff = 0`` it is 0), the metrics verl's names
    (0-dim tensors, no host sync). ``temperature``: a float, or per token ``(B, T)`` / per
    sample ``(B,)`` (spanhead's per-row temperature). A config :func:`map_config` refuses is computed by verl's
    own functions on spanhead's log-probs (a one-time warning says why)."""
    gbi = dict(global_batch_info or _cfg(config, "global_batch_info", None) or {})
    if "loss_scale_factor" not in gbi or gbi["loss_scale_factor"] is None:
        gbi["loss_scale_factor"] = _cfg(config, "loss_scale_factor", None)
    kw, why = map_config(config)
    if kw is not None and _tp.uses_torch_combine(dist_process_group):
        kw, why = None, "a TP group spanhead does not drive (not NCCL)"
    if hidden.dim() != 3 or tuple(labels.shape) != tuple(hidden.shape[:2]):
        raise ShapeError(f"hidden {tuple(hidden.shape)} and labels {tuple(labels.shape)}: "
                         f"expected (B, T, H) and (B, T)")
    temperature = _temperature(temperature, tuple(labels.shape))
    if kw is None:
        warn_once(f"verl:{why}", f"spanhead.integrations.verl.ppo_loss: {why} is not fused; "
                  "computing it with verl's own loss functions on spanhead's log-probs")
        return _fallback(config, hidden, weight, labels, response_mask, old_log_prob,
                         advantages, ref_log_prob, rollout_is_weights, temperature, gbi,
                         dist_process_group)
    B, T = labels.shape
    mask = response_mask.to(torch.bool)
    dp = int(gbi.get("dp_size") or 1)
    ntok, nseq = gbi.get("batch_num_tokens"), gbi.get("global_batch_size")
    if dp > 1 and ((kw["agg"] == "token-mean" and ntok is None) or
                   (kw["agg"] != "token-mean" and nseq is None)):
        raise InvalidArgumentError(f"global_batch_info: dp_size={dp} needs batch_num_tokens "
                                   "(token-mean) / global_batch_size (seq-mean-*), as verl")
    kw = dict(kw)
    if kw["agg"] == "token-mean" and ntok is not None:
        kw["num_tokens"] = int(ntok)
    if kw["agg"] != "token-mean" and nseq is not None:
        kw["num_seqs"] = int(nseq)
    if kw["agg"] == "seq-mean-token-sum-norm":
        lsf = gbi.get("loss_scale_factor")
        kw["norm_length"] = float(T if lsf is None else lsf)
    rank, size = _group_info(dist_process_group)
    if size > 1:
        kw.update(tp_group=dist_process_group, vocab_start=rank * weight.shape[0],
                  vocab_total=weight.shape[0] * size, reduce_dhidden=False)
    if kw.get("kl_type", "none") != "none":
        if ref_log_prob is None:
            raise InvalidArgumentError("ref_log_prob: required with config.use_kl_loss")
        kw["ref_logprobs"] = ref_log_prob.to(torch.float32)
    seq_ids = torch.arange(B, device=labels.device).unsqueeze(1).expand(B, T)
    out = _sht.policy_loss(hidden, weight, labels, advantages.to(torch.float32),
                           old_log_prob.to(torch.float32), loss_mask=mask, seq_ids=seq_ids,
                           is_weights=None if rollout_is_weights is None else
                           rollout_is_weights.to(torch.float32),
                           temperature=temperature, **kw, **context_options)
    loss = out.loss * dp if dp != 1 else out.loss
    m = out.metrics
    metrics: Dict[str, Any] = _verl_metrics(out.logprob, old_log_prob.float(),
                                            advantages.float(), mask, kw)
    metrics["actor/pg_loss"] = m["pg_loss"] * dp
    metrics["actor/entropy_loss"] = m["entropy_loss"] * dp
    if kw.get("kl_type", "none") != "none":
        metrics["kl_loss"] = m["kl_loss"] * dp
        metrics["kl_coef"] = kw["kl_coef"]
    return loss, metrics


def _fallback(config, hidden, weight, labels, response_mask, old_log_prob, advantages,
              ref_log_prob, rollout_is_weights, temperature, gbi, group):
    """verl's ppo_loss math with verl's functions, on log-probs / entropy from spanhead."""
    check_version("verl", VERL_MIN, VERL_MAX)
    from verl.trainer.ppo import core_algos as ca
    B, T = labels.shape
    lp, ent = linear_cross_entropy(hidden, weight, labels, temperature, "none", group)
    lp, ent = lp.view(B, T), ent.view(B, T)
    mask = response_mask.to(torch.bool)
    saved = getattr(config, "global_batch_info", None)
    info = {k: v for k, v in gbi.items() if v is not None}
    try:
        if saved is not None or not isinstance(config, dict):
            config.global_batch_info = info
        pl = _cfg(config, "policy_loss", None)
        mode = _cfg(pl, "loss_mode", "vanilla") if pl is not None else "vanilla"
        fn = ca.get_policy_loss_fn(mode)
        pg_loss, pg_metrics = fn(old_log_prob=old_log_prob, log_prob=lp, advantages=advantages,
                                 response_mask=mask, loss_agg_mode=config.loss_agg_mode,
                                 config=config, rollout_is_weights=rollout_is_weights)
        metrics: Dict[str, Any] = dict(pg_metrics)
        metrics["actor/pg_loss"] = pg_loss.detach()
        loss = pg_loss
        ent_loss = ca.agg_loss(loss_mat=ent, loss_mask=mask, loss_agg_mode=config.loss_agg_mode,
                               **info)
        loss = loss - _cfg(config, "entropy_coeff", 0.0) * ent_loss
        metrics["actor/entropy_loss"] = ent_loss.detach()
        if _cfg(config, "use_kl_loss", False):
            kld = ca.kl_penalty(logprob=lp, ref_logprob=ref_log_prob,
                                kl_penalty=_cfg(config, "kl_loss_type"))
            kl_loss = ca.agg_loss(loss_mat=kld, loss_mask=mask,
                                  loss_agg_mode=config.loss_agg_mode, **info)
            loss = loss + kl_loss * _cfg(config, "kl_loss_coef")
            metrics["kl_loss"] = kl_loss.detach()
            metrics["kl_coef"] = _cfg(config, "kl_loss_coef")
    finally:
        if saved is not None:
            config.global_batch_info = saved
    return loss, metrics
