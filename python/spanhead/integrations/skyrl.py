"""spanhead for SkyRL (docs/integrations.md).

    import spanhead.integrations.skyrl as shs
    shs.patch()     # SkyRL's fused LM-head log-prob (trainer.policy.megatron_config
                    # fused_lm_head_logprob=True, either backend name) runs spanhead

* :class:`FusedLinearLogprobSpanhead` has the ``apply(hidden, weight, target,
  vocab_start_index, vocab_end_index, chunk_size, tp_group, inference_only=False)`` contract
  of SkyRL's ``FusedLinearLogprobTriton`` / ``FusedLinearChunkedDistributedLogprob``
  (``skyrl.backends.skyrl_train.distributed.megatron``): ``hidden [B, S, H]`` (cast to the
  weight's dtype, as SkyRL's output layer does), ``weight [V/TP, H]`` this rank's shard,
  ``target [B, S]`` global ids already shifted; returns the TP-combined float32 ``[B, S]``
  log-probs; a target outside every shard gives 0. The gradient is this rank's partial
  ``d_hidden`` (SkyRL's sequence-parallel gather reduces it) and ``d_weight`` in the weight's
  dtype. ``chunk_size`` is validated and otherwise unused (spanhead chunks the vocabulary
  itself, in its workspace budget); temperature is folded into the weight by SkyRL's caller.
  An NCCL group uses spanhead's TP path; any other (gloo) combines the shards' statistics in
  torch (``_tp.py``).
* :func:`patch` / :func:`unpatch`: route SkyRL's backend dispatcher
  (``model_utils._fused_lm_head_logprob_apply``, which every fused log-prob path of the
  Megatron model wrapper calls) to spanhead for the backend names given (default both,
  ``"torch"`` and ``"triton"``: SkyRL's config accepts no other name); idempotent, reversible.
* :func:`policy_loss`: SkyRL's policy losses (``ppo_utils.PolicyLossRegistry``: regular,
  dual_clip, gspo, cispo; a masked *sum* of the per-token losses, the advantages already
  scaled by SkyRL's loss reduction) computed from the hidden states by one
  ``spanhead.torch.policy_loss`` call; other types, or an off-policy correction, fall back
  (one-time warning) to SkyRL's own function on spanhead's log-probs (so does any
  ``rollout_logprobs``: SkyRL's off-policy correction).

Supported SkyRL: ``>=0.3.0,<0.4`` (tested with 0.3.0).
"""
from __future__ import annotations

from contextlib import nullcontext as _nullcontext
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from .. import torch as _sht
from .._errors import InvalidArgumentError, ShapeError
from . import _tp, check_version, warn_once

SKYRL_MIN, SKYRL_MAX = "0.3.0", "0.4"
_MODEL_UTILS = "skyrl.backends.skyrl_train.distributed.megatron.model_utils"

__all__ = ["FusedLinearLogprobSpanhead", "patch", "unpatch", "is_patched", "policy_loss",
           "SKYRL_MIN", "SKYRL_MAX"]


def _group_info(group: Any) -> Tuple[int, int]:
    if group is None:
        return 0, 1
    import torch.distributed as dist
    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


class FusedLinearLogprobSpanhead:
    """SkyRL's fused LM-head token log-prob on spanhead (see the module's docstring)."""

    @staticmethod
    def apply(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
              vocab_start_index: int, vocab_end_index: int, chunk_size: int, tp_group: Any,
              inference_only: bool = False) -> torch.Tensor:
        if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3:
            raise ShapeError(f"hidden: expected a [B, S, H] tensor, got "
                             f"{tuple(getattr(hidden, 'shape', ()))}")
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or \
                weight.shape[1] != hidden.shape[2]:
            raise ShapeError(f"weight {tuple(getattr(weight, 'shape', ()))}: expected "
                             f"[V/TP, {hidden.shape[2]}]")
        if not isinstance(target, torch.Tensor) or tuple(target.shape) != tuple(hidden.shape[:2]):
            raise ShapeError(f"target {tuple(getattr(target, 'shape', ()))}: expected "
                             f"{tuple(hidden.shape[:2])} (hidden's [B, S])")
        if target.dtype.is_floating_point or target.dtype == torch.bool:
            raise InvalidArgumentError(f"target: dtype is {target.dtype}, expected integer ids")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise InvalidArgumentError(f"chunk_size: {chunk_size!r}, expected a positive int")
        v_loc = weight.shape[0]
        start, end = int(vocab_start_index), int(vocab_end_index)
        if end - start != v_loc:
            raise InvalidArgumentError(f"vocab_start_index={start}, vocab_end_index={end}: the "
                                       f"shard holds {v_loc} rows of weight")
        rank, size = _group_info(tp_group)
        kw: Dict[str, Any] = {}
        if size > 1:
            if start != rank * v_loc:
                raise InvalidArgumentError(f"vocab_start_index={start}: rank {rank} of {size} "
                                           f"holds ids from {rank * v_loc} (equal shards)")
            lo, hi = 0, v_loc * size
            kw = dict(tp_group=tp_group, vocab_start=start, vocab_total=hi,
                      reduce_dhidden=False)
            t = target
        else:
            lo, hi = start, end
            t = target - start
        valid = (target >= lo) & (target < hi)
        t = torch.where(valid, t, torch.full_like(t, -1))
        h = hidden.to(weight.dtype)
        with torch.no_grad() if inference_only else _nullcontext():
            if _tp.uses_torch_combine(tp_group):    # gloo & co: combined in torch
                B, S = t.shape
                lp, _ = _tp.logprob_entropy(h.reshape(B * S, -1), weight, t.reshape(-1),
                                            start, tp_group, want_entropy=False)
                return lp.reshape(B, S)
            return _sht.logprobs(h, weight, t, **kw)


# ---- patch / unpatch ------------------------------------------------------------------------

_state: Dict[str, Any] = {}


def is_patched() -> bool:
    return bool(_state)


def patch(backends: Tuple[str, ...] = ("torch", "triton")) -> None:
    """Make SkyRL's fused LM-head log-prob dispatcher run :class:`FusedLinearLogprobSpanhead`
    for the named backends (others keep SkyRL's). Idempotent (a second call changes the
    backend set); :func:`unpatch` restores the original. An unsupported SkyRL version raises
    :class:`spanhead.UnsupportedError` and changes nothing."""
    check_version("skyrl", SKYRL_MIN, SKYRL_MAX)
    if isinstance(backends, str):
        backends = (backends,)
    for b in backends:
        if b not in ("torch", "triton"):
            raise InvalidArgumentError(f"backends: {b!r}, expected 'torch' and/or 'triton' "
                                       "(the names SkyRL's config accepts)")
    import importlib
    mu = importlib.import_module(_MODEL_UTILS)
    if not _state:
        _state["module"] = mu
        _state["original"] = mu._fused_lm_head_logprob_apply
    orig: Callable = _state["original"]
    chosen = frozenset(backends)

    def _fused_lm_head_logprob_apply(backend, hidden, weight, target, vocab_start_index,
                                     vocab_end_index, chunk_size, tp_group, inference_only):
        if backend in chosen:
            return FusedLinearLogprobSpanhead.apply(hidden, weight, target, vocab_start_index,
                                                    vocab_end_index, chunk_size, tp_group,
                                                    inference_only)
        return orig(backend, hidden, weight, target, vocab_start_index, vocab_end_index,
                    chunk_size, tp_group, inference_only)

    _fused_lm_head_logprob_apply.__spanhead__ = True  # type: ignore[attr-defined]
    mu._fused_lm_head_logprob_apply = _fused_lm_head_logprob_apply


def unpatch() -> None:
    if _state:
        _state["module"]._fused_lm_head_logprob_apply = _state["original"]
        _state.clear()


# ---- policy losses ----------------------------------------------------------------------------

def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def map_config(config: Any, with_rollout_logprobs: bool) -> Tuple[Optional[Dict[str, Any]], str]:
    """``(kwargs of spanhead.torch.policy_loss, "")`` for a SkyRL AlgorithmConfig the fused
    loss serves exactly, else ``(None, reason)``."""
    t = _get(config, "policy_loss_type", "regular")
    if t not in ("regular", "dual_clip", "gspo", "cispo"):
        return None, f"policy_loss_type={t!r} (spanhead fuses regular, dual_clip, gspo, cispo)"
    if with_rollout_logprobs:   # SkyRL's off-policy correction (apply_off_policy_correction)
        return None, "rollout_logprobs (SkyRL's off-policy correction)"
    kw: Dict[str, Any] = dict(agg="token-mean", num_tokens=1)   # SkyRL's reduce_loss: a sum
    if t == "cispo":
        c = _get(config, "cispo", None)
        kw.update(loss_type="cispo", clip_low=float(_get(c, "cispo_eps_clip_low", 0.0)),
                  clip_high=float(_get(c, "cispo_eps_clip_high", 5.0)))
        return kw, ""
    kw.update(loss_type="gspo" if t == "gspo" else "ppo",
              clip_low=float(_get(config, "eps_clip_low", 0.2)),
              clip_high=float(_get(config, "eps_clip_high", 0.2)))
    if t == "dual_clip":
        kw["clip_ratio_c"] = float(_get(config, "clip_ratio_c", 3.0))
    return kw, ""


def policy_loss(config: Any, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                loss_mask: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                rollout_logprobs: Optional[torch.Tensor] = None, vocab_start_index: int = 0,
                tp_group: Any = None,
                **context_options: Any) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """SkyRL's policy loss (``PolicyLossRegistry.get(config.policy_loss_type)``) of the
    ``[B, S]`` batch from the hidden states (``hidden [B, S, H]``, ``target`` already
    shifted): ``(loss, {"clip_ratio": ...})`` as SkyRL returns (the metric a 0-dim tensor,
    no host sync). Fallbacks as the module's docstring says."""
    kw, why = map_config(config, rollout_logprobs is not None)
    if kw is not None and _tp.uses_torch_combine(tp_group):
        kw, why = None, "a TP group spanhead does not drive (not NCCL)"
    if hidden.dim() != 3 or tuple(target.shape) != tuple(hidden.shape[:2]):
        raise ShapeError(f"hidden {tuple(hidden.shape)} and target {tuple(target.shape)}: "
                         f"expected [B, S, H] and [B, S]")
    rank, size = _group_info(tp_group)
    if kw is None:
        warn_once(f"skyrl:{why}", f"spanhead.integrations.skyrl.policy_loss: {why} is not "
                  "fused; computing it with SkyRL's own loss function on spanhead's log-probs")
        check_version("skyrl", SKYRL_MIN, SKYRL_MAX)
        from skyrl.backends.skyrl_train.utils.ppo_utils import PolicyLossRegistry
        lp = FusedLinearLogprobSpanhead.apply(hidden, weight, target, vocab_start_index,
                                              vocab_start_index + weight.shape[0],
                                              max(1, hidden.shape[1]), tp_group)
        fn = PolicyLossRegistry.get(_get(config, "policy_loss_type"))
        return fn(lp, old_log_probs, advantages, config, loss_mask, rollout_logprobs)
    B, S = target.shape
    v_loc = weight.shape[0]
    if size > 1:
        kw.update(tp_group=tp_group, vocab_start=int(vocab_start_index),
                  vocab_total=v_loc * size, reduce_dhidden=False)
        valid = (target >= 0) & (target < v_loc * size)
        t = target
    else:
        valid = (target >= vocab_start_index) & (target < vocab_start_index + v_loc)
        t = target - int(vocab_start_index)
    t = torch.where(valid, t, torch.full_like(t, -1))
    mask = loss_mask.to(torch.bool)
    seq_ids = torch.arange(B, device=target.device).unsqueeze(1).expand(B, S)
    h = hidden.to(weight.dtype)
    out = _sht.policy_loss(h, weight, t, advantages.to(torch.float32),
                           old_log_probs.to(torch.float32), loss_mask=mask, seq_ids=seq_ids,
                           **kw, **context_options)
    # SkyRL's clip_ratio: the masked mean of (-surr2 > -surr1), the ratio per its loss type
    lp = out.logprob
    m = loss_mask.to(torch.float32)
    delta = lp - old_log_probs.float()
    adv = advantages.float()
    if kw["loss_type"] == "gspo":
        seq = (delta * m).sum(-1) / m.sum(-1).clamp(min=1.0)
        r = torch.exp(torch.clamp(seq, max=10.0)).unsqueeze(-1).expand_as(delta)
    else:
        r = torch.exp(torch.clamp(delta, -20.0, 20.0))
    if kw["loss_type"] == "cispo":
        clipped = (r < 1 - kw["clip_low"]) | (r > 1 + kw["clip_high"])
    else:
        clipped = -(r.clamp(1 - kw["clip_low"], 1 + kw["clip_high"]) * adv) > -(r * adv)
    clip_ratio = (clipped.float() * m).sum() / m.sum().clamp(min=1.0)
    return out.loss, {"clip_ratio": clip_ratio}
