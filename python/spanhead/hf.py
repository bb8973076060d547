"""Hugging Face transformers integration: spanhead's head inside a causal LM.

    import spanhead.hf
    spanhead.hf.patch(model)                 # LlamaForCausalLM, Qwen2/3, Mistral, Gemma-2/3
    out = model(input_ids, attention_mask=am, labels=labels)
    out.loss.backward()                      # out.logits is None: no [tokens x vocab] logits

    lp = spanhead.hf.logprobs(model, input_ids, attention_mask=am)          # RL: (B, S)
    out = spanhead.hf.logprobs(model, input_ids, targets=t, entropy=True)   # + entropy

:func:`patch` replaces the model's ``forward`` (this instance only; :func:`unpatch` restores
it): with ``labels`` (or ``shift_labels``) it runs the decoder, then
:func:`spanhead.torch.linear_cross_entropy` on the last hidden states and ``lm_head.weight``
with the labels shifted as transformers shifts them (``ForCausalLMLoss``: ignore_index -100,
mean over the non-ignored tokens, or their sum divided by ``num_items_in_batch`` when the
trainer passes it), Gemma's ``final_logit_softcapping`` as spanhead's softcap; it returns a
``CausalLMOutputWithPast`` whose ``logits`` is None. Without labels it is the original forward
(generation, evaluation). The loss and the gradients are those of the unpatched model (up to
float32 rounding; spanhead computes the logits in float32 from the model's dtype, as
transformers upcasts them).

:func:`logprobs` gives per-token log-probs (and entropy) of given targets (default: the next
input token) from the decoder's hidden states, for RL code that needs them with gradients
(PPO/GRPO ratios) or without (the reference / old policy), patched model or not.

An unsupported model class raises :class:`spanhead.UnsupportedError` naming it.
"""

from __future__ import annotations

import types
from typing import Any, Optional

import torch
import torch.nn.functional as F

from . import torch as sht
from ._errors import InvalidArgumentError, UnsupportedError

__all__ = ["patch", "unpatch", "is_patched", "logprobs", "SUPPORTED"]

#: Model classes :func:`patch` accepts (and their subclasses).
SUPPORTED = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
             "Gemma2ForCausalLM", "Gemma3ForCausalLM")

_ORIG = "_spanhead_original_forward"


def _family(model: Any) -> str:
    for cls in type(model).__mro__:
        if cls.__name__ in SUPPORTED and cls.__module__.startswith("transformers."):
            return cls.__name__
    raise UnsupportedError(
        f"spanhead.hf.patch: {type(model).__name__} is not supported (supported: "
        f"{', '.join(SUPPORTED)} and their subclasses); its forward was left unchanged")


def _head(model: Any):
    """(decoder, lm_head weight, softcap) of a supported causal LM."""
    _family(model)
    head = getattr(model, "lm_head", None)
    decoder = getattr(model, "model", None)
    if head is None or decoder is None or not hasattr(head, "weight"):
        raise UnsupportedError(f"spanhead.hf: {type(model).__name__} has no model / lm_head "
                               f"(a wrapped or modified model?)")
    if getattr(head, "bias", None) is not None:
        raise UnsupportedError(f"spanhead.hf: {type(model).__name__}.lm_head has a bias; "
                               f"spanhead's head is bias-free")
    softcap = getattr(model.config, "final_logit_softcapping", None)
    return decoder, head.weight, (float(softcap) if softcap else None)


def _output_class():
    from transformers.modeling_outputs import CausalLMOutputWithPast
    return CausalLMOutputWithPast


def _forward(self, input_ids=None, attention_mask=None, position_ids=None,
             past_key_values=None, inputs_embeds=None, labels=None, use_cache=None,
             logits_to_keep=0, **kwargs):
    shift_labels = kwargs.pop("shift_labels", None)
    if labels is None and shift_labels is None:
        return getattr(self, _ORIG)(input_ids=input_ids, attention_mask=attention_mask,
                                    position_ids=position_ids, past_key_values=past_key_values,
                                    inputs_embeds=inputs_embeds, use_cache=use_cache,
                                    logits_to_keep=logits_to_keep, **kwargs)
    return_dict = kwargs.pop("return_dict", None)
    num_items = kwargs.pop("num_items_in_batch", None)
    ignore_index = kwargs.pop("ignore_index", -100)
    decoder, weight, softcap = _head(self)
    outputs = decoder(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids, past_key_values=past_key_values,
                      inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
    hidden = outputs.last_hidden_state
    sl = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    hidden = hidden[:, sl, :]
    if shift_labels is None:
        # as ForCausalLMLoss: tokens < n predict n, the last position has no target
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    shift_labels = shift_labels.to(hidden.device)
    if num_items is None:
        loss = sht.linear_cross_entropy(hidden, weight, shift_labels, ignore_index, "mean",
                                        softcap=softcap)
    else:
        loss = sht.linear_cross_entropy(hidden, weight, shift_labels, ignore_index, "sum",
                                        softcap=softcap)
        if torch.is_tensor(num_items):
            num_items = num_items.to(loss.device)
        loss = loss / num_items
    out = _output_class()(loss=loss, logits=None, past_key_values=outputs.past_key_values,
                          hidden_states=outputs.hidden_states, attentions=outputs.attentions)
    if return_dict is None:
        return_dict = getattr(self.config, "return_dict", True)
    return out if return_dict else out.to_tuple()


def patch(model: Any) -> Any:
    """Makes ``model(..., labels=...)`` compute its loss with spanhead (no logits); returns the
    model. Idempotent. Raises :class:`spanhead.UnsupportedError` naming the class of a model
    that is not one of :data:`SUPPORTED` (or a subclass)."""
    _head(model)
    if not is_patched(model):
        setattr(model, _ORIG, model.forward)
        model.forward = types.MethodType(_forward, model)
    return model


def unpatch(model: Any) -> Any:
    """Restores the original forward of a patched model; returns the model."""
    orig = model.__dict__.pop(_ORIG, None)
    if orig is not None:
        del model.forward  # the instance attribute; the class's forward shows again
    return model


def is_patched(model: Any) -> bool:
    return _ORIG in getattr(model, "__dict__", {})


def logprobs(model: Any, input_ids: Optional[torch.Tensor] = None,
             attention_mask: Optional[torch.Tensor] = None, *,
             targets: Optional[torch.Tensor] = None, loss_mask: Any = None,
             temperature: float = 1.0, entropy: bool = False, ignore_index: int = -100,
             inputs_embeds: Optional[torch.Tensor] = None, **model_kwargs: Any) -> Any:
    """Per-token log-probs of ``targets`` under the model's next-token distribution,
    ``log softmax(z / temperature)`` at each position (z softcapped as the model does), from
    the decoder's last hidden states through spanhead (no logits), differentiable.

    Args:
        model: a supported causal LM (patched or not).
        input_ids, attention_mask, inputs_embeds, model_kwargs: passed to the decoder.
        targets: (B, S) ids scored at each position; default: the next input token
            (``input_ids[:, 1:]``, the last position and positions whose next token is
            padding by ``attention_mask`` ignored).
        loss_mask: (B, S) rows to compute (others: 0, no gradient, no cost), e.g. the
            response tokens of a prompt + response batch; ``targets == ignore_index`` also
            excludes a row.
        temperature: the sampling temperature (RL frameworks score at the rollout's).
        entropy: also return the per-position entropy.

    Returns:
        (B, S) float32 log-probs (0 on excluded positions), or with ``entropy=True`` a
        :class:`spanhead.torch.HeadOutputs` (logprob, entropy, None, None).
    """
    decoder, weight, softcap = _head(model)
    out = decoder(input_ids=input_ids, attention_mask=attention_mask,
                  inputs_embeds=inputs_embeds, **model_kwargs)
    hidden = out.last_hidden_state
    B, S = hidden.shape[:2]
    if targets is None:
        if input_ids is None:
            raise InvalidArgumentError("spanhead.hf.logprobs: targets are required with "
                                       "inputs_embeds (no input_ids to shift)")
        targets = F.pad(input_ids[:, 1:], (0, 1), value=ignore_index)
        if attention_mask is not None:
            nxt = F.pad(attention_mask[:, 1:], (0, 1), value=0) != 0
            targets = torch.where(nxt, targets, torch.full_like(targets, ignore_index))
    if tuple(targets.shape) != (B, S):
        raise InvalidArgumentError(f"spanhead.hf.logprobs: targets have shape "
                                   f"{tuple(targets.shape)}, expected {(B, S)}")
    valid = targets != ignore_index
    if loss_mask is not None:
        lm = loss_mask if torch.is_tensor(loss_mask) else torch.as_tensor(loss_mask)
        valid = valid & (lm.to(valid.device) != 0)
    tgt = torch.where(valid, targets, torch.full_like(targets, -1))
    return sht.logprobs(hidden, weight, tgt, loss_mask=valid, temperature=temperature,
                        entropy=entropy, softcap=softcap)

