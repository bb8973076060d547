"""spanhead for TRL's GRPOTrainer (docs/integrations.md).

    import spanhead.integrations.trl as sh_trl
    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), ...)
    sh_trl.patch_grpo(trainer)          # its loss now runs spanhead.torch.policy_loss
    trainer.train()

:func:`patch_grpo` replaces the trainer's ``_compute_loss`` (what ``compute_loss`` calls):
the decoder's last hidden state of the completion positions goes, with ``lm_head.weight``,
into one ``spanhead.torch.policy_loss`` call that computes the log-probs, the entropies, the
clipped loss, its KL term and the gradients without the ``(B, T, V)`` logits (the way TRL's
Liger path once did). It honours ``loss_type`` grpo / bnpo / dr_grpo / dapo (their
normalizations, gradient accumulation included), ``epsilon`` / ``epsilon_high``, ``beta`` (the
k3 KL to the reference model, with ``use_bias_correction_kl=False``), ``temperature`` and
``importance_sampling_level`` token / sequence (sequence: spanhead's gspo ratio, which equals
TRL's sequence ratio in value and gradient while the advantages are per sequence), and logs
TRL's metrics (``kl``, ``entropy``, ``clip_ratio/*``).

Anything else (other loss types, ``use_bias_correction_kl=True`` with ``beta != 0``, ``delta``,
``off_policy_mask_threshold``, ``top_entropy_quantile < 1``, vLLM importance-sampling
correction, an entropy bonus with a loss type other than bnpo or adaptive, MoE aux loss,
multimodal inputs, PEFT, an LM head with a bias, logit scaling or softcapping,
``cast_lm_head_to_fp32``, per-token advantages with sequence level) runs TRL's own
``_compute_loss``, after a one-time warning naming the reason: never a different loss.

Where the ratio or the KL leaves spanhead's float ranges TRL has no clamp and spanhead clamps
(``|log r| > 20``; gspo's ``log r > 10``; k3 above 10): the losses differ only there.
When the batch carries no old log-probs (``num_iterations == 1``: TRL uses the current
log-probs, a ratio of exactly 1) the adapter computes them with a forward-only spanhead call
first. Supported TRL: ``>=1.16.0,<1.17`` (tested with 1.16.0).
"""
from __future__ import annotations

import types
from typing import Any, Optional

import torch

from .. import torch as _sht
from .._errors import InvalidArgumentError
from . import check_version, warn_once

TRL_MIN, TRL_MAX = "1.16.0", "1.17"
_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo")
_MM_KEYS = ("pixel_values", "image_grid_thw", "pixel_attention_mask", "spatial_shapes",
            "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids",
            "image_position_ids", "num_images")

__all__ = ["patch_grpo", "unpatch_grpo", "unsupported_reason", "TRL_MIN", "TRL_MAX"]


def patch_grpo(trainer: Any) -> Any:
    """Make ``trainer`` (a ``trl.GRPOTrainer``) compute its loss with spanhead; idempotent;
    returns the trainer. An unsupported TRL version raises :class:`spanhead.UnsupportedError`
    and changes nothing."""
    check_version("trl", TRL_MIN, TRL_MAX)
    from trl import GRPOTrainer
    if not isinstance(trainer, GRPOTrainer):
        raise InvalidArgumentError(f"trainer: a {type(trainer).__name__}, expected a "
                                   "trl.GRPOTrainer")
    if getattr(trainer, "_spanhead_original_compute_loss", None) is None:
        trainer._spanhead_original_compute_loss = trainer._compute_loss
        trainer._compute_loss = types.MethodType(_compute_loss, trainer)
    return trainer


def unpatch_grpo(trainer: Any) -> Any:
    """Restore the trainer's own ``_compute_loss`` (a no-op when not patched)."""
    if getattr(trainer, "_spanhead_original_compute_loss", None) is not None:
        del trainer.__dict__["_compute_loss"]
        trainer._spanhead_original_compute_loss = None
    return trainer


def _unwrap(self, model):
    acc = getattr(self, "accelerator", None)
    return acc.unwrap_model(model) if acc is not None else model


def unsupported_reason(trainer: Any, model: Any, inputs: dict) -> Optional[str]:
    """Why the fused path cannot serve this trainer / batch (None when it can)."""
    args = trainer.args
    if trainer.loss_type not in _LOSSES:
        return f"loss_type={trainer.loss_type!r} (spanhead fuses {list(_LOSSES)})"
    if trainer.importance_sampling_level not in ("token", "sequence"):
        return f"importance_sampling_level={trainer.importance_sampling_level!r}"
    if trainer.beta != 0.0 and getattr(args, "use_bias_correction_kl", False):
        return "beta != 0 with use_bias_correction_kl=True (the KL weighted by the ratio)"
    if getattr(args, "delta", None) is not None:
        return "delta (two-sided clipping)"
    if trainer.off_policy_mask_threshold is not None:
        return "off_policy_mask_threshold"
    if trainer.top_entropy_quantile < 1.0:
        return "top_entropy_quantile < 1"
    if trainer.use_vllm and trainer.vllm_importance_sampling_correction:
        return "vLLM importance-sampling correction"
    if trainer._entropy_bonus_enabled and (trainer.loss_type != "bnpo" or
                                           trainer.use_adaptive_entropy):
        return (f"an entropy bonus with loss_type={trainer.loss_type!r}"
                f"{' (adaptive)' if trainer.use_adaptive_entropy else ''} (fused with bnpo only)")
    if trainer.aux_loss_enabled:
        return "the MoE router aux loss"
    if any(inputs.get(k) is not None for k in _MM_KEYS):
        return "multimodal inputs"
    if getattr(args, "cast_lm_head_to_fp32", False):
        return "cast_lm_head_to_fp32"
    m = _unwrap(trainer, model)
    try:
        from accelerate.utils import is_peft_model
        if is_peft_model(m):
            return "a PEFT model"
    except ImportError:
        pass
    head = m.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        return "an LM head with a bias"
    if type(head.weight) is not torch.Tensor and not isinstance(head.weight, torch.nn.Parameter):
        return f"an LM head weight of type {type(head.weight).__name__}"
    tc = m.config.get_text_config()
    for k in ("final_logit_softcapping", "logit_scale", "output_multiplier",
              "lm_head_multiplier", "logits_scaling"):
        if getattr(tc, k, None) not in (None, 1, 1.0):
            return f"the model config's {k}"
    adv = inputs["advantages"]
    if trainer.importance_sampling_level == "sequence" and adv.dim() == 2 and adv.shape[1] != 1:
        return "per-token advantages with importance_sampling_level='sequence'"
    return None


def _compute_loss(self, model, inputs):
    why = unsupported_reason(self, model, inputs)
    if why is not None:
        warn_once(f"trl:{why}", f"spanhead.integrations.trl: {why} is not fused; this "
                  "GRPOTrainer computes the loss with TRL's own code")
        return self._spanhead_original_compute_loss(model, inputs)
    prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
    completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    K = completion_ids.size(1)
    mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
    B = input_ids.size(0)

    m = _unwrap(self, model)
    autocast = self.accelerator.autocast    # TRL runs the model and its head inside it
    with autocast():
        out = m.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    hidden = out.last_hidden_state[:, :-1][:, -K:]
    # TRL's labels: the completion tokens, -100 where the attention mask is 0
    labels = input_ids.masked_fill(attention_mask == 0, -1)[:, 1:][:, -K:]
    weight = m.get_output_embeddings().weight
    active = (mask != 0) & (labels >= 0)

    adv = inputs["advantages"]
    adv2 = (adv.unsqueeze(1) if adv.dim() == 1 else adv).expand(B, K).to(torch.float32)
    old = inputs.get("old_per_token_logps")
    temp = float(self.temperature)
    if old is None:   # TRL uses the current log-probs: a ratio of exactly 1
        with torch.no_grad(), autocast():
            old = _sht.logprobs(hidden.detach(), weight.detach(), labels, loss_mask=active,
                                temperature=temp)
    seq = self.importance_sampling_level == "sequence"
    kw: dict = dict(loss_type="gspo" if seq else "ppo", clip_low=float(self.epsilon_low),
                    clip_high=float(self.epsilon_high))
    if self.beta != 0.0:
        kw.update(kl_type="k3", kl_coef=float(self.beta),
                  ref_logprobs=inputs["ref_per_token_logps"].to(torch.float32))
    if self._entropy_bonus_enabled:              # bnpo only (unsupported_reason)
        kw["entropy_coef"] = float(self.entropy_coef)
    lt = self.loss_type
    if lt == "grpo":
        kw.update(agg="seq-mean-token-mean", num_seqs=B)
    elif lt == "bnpo":
        kw.update(agg="token-mean")
    elif lt == "dr_grpo":
        kw.update(agg="seq-mean-token-sum-norm", num_seqs=B,
                  norm_length=float(self.max_completion_length))
    else:   # dapo: a sum, divided below
        kw.update(agg="token-mean", num_tokens=1)
    seq_ids = torch.arange(B, device=labels.device).unsqueeze(1).expand(B, K)
    with autocast():   # spanhead casts hidden / weight where F.linear would
        res = _sht.policy_loss(hidden, weight, labels, adv2, old.to(torch.float32),
                               loss_mask=active, seq_ids=seq_ids, temperature=temp, **kw)
    loss = res.loss
    mode = "train" if self.model.training else "eval"
    if lt == "dapo":
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if mode == "train":
            normalizer = normalizer * self.current_gradient_accumulation_steps / \
                self.args.steps_per_generation
    else:
        normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
    policy_loss = res.metrics["pg_loss"] + (self.beta * res.metrics["kl_loss"]
                                            if self.beta != 0.0 else 0.0)
    loss = loss / normalizer
    if lt == "dapo":
        policy_loss = policy_loss / normalizer
    _log_metrics(self, mode, res, old, inputs, mask, adv, seq, policy_loss)
    return loss


def _log_metrics(self, mode, res, old, inputs, mask, adv, seq, policy_loss):
    """TRL's metrics of _compute_loss, from the detached per-token values."""
    from trl.trainer.utils import nanmax, nanmin
    lp, ent = res.logprob, res.entropy
    mask = mask.to(lp.dtype)
    log_ratio = lp - old
    if seq:
        coef_1 = torch.exp((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        coef_1 = torch.exp(log_ratio)
    advantages = adv.unsqueeze(1) if adv.dim() == 1 else adv

    def masked_seq_mean(x):
        if x.shape[1] == 1:
            return x.squeeze(1)
        return (x * mask).sum(-1) / mask.sum(-1)

    def global_masked_mean(x):
        if x.shape[1] == 1:
            s, c = x.sum(), torch.tensor(float(x.shape[0]), device=x.device)
        else:
            s, c = (x * mask).sum(), mask.sum().float()
        totals = self.accelerator.reduce(torch.stack([s, c]), reduction="sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()

    if self._entropy_bonus_enabled:
        self._metrics[mode]["policy_loss"].append(
            self.accelerator.gather(policy_loss.detach()).nanmean().item())
    if self.beta != 0.0:
        ref = inputs["ref_per_token_logps"]
        kl = torch.exp(ref - lp) - (ref - lp) - 1
        self._metrics[mode]["kl"].append(global_masked_mean(kl))
    self._metrics[mode]["entropy"].append(global_masked_mean(ent))
    lo = (coef_1 < 1 - self.epsilon_low) & (advantages < 0)
    hi = (coef_1 > 1 + self.epsilon_high) & (advantages > 0)
    self._metrics[mode]["clip_ratio/low_mean"].append(global_masked_mean(lo.float()))
    self._metrics[mode]["clip_ratio/high_mean"].append(global_masked_mean(hi.float()))
    self._metrics[mode]["clip_ratio/region_mean"].append(global_masked_mean((lo | hi).float()))
    self._metrics[mode]["clip_ratio/low_min"].append(
        nanmin(self.accelerator.gather(masked_seq_mean(lo.float()))).item())
    self._metrics[mode]["clip_ratio/high_max"].append(
        nanmax(self.accelerator.gather(masked_seq_mean(hi.float()))).item())
