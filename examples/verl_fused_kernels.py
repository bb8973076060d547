"""verl with spanhead: one line, `spanhead.integrations.verl.patch()`, and verl's fused-kernel
path (use_fused_kernels=True: verl.utils.kernel.linear_cross_entropy) runs spanhead. Here on a
tiny random Llama, on the CPU: verl's own forward_with_triton_backend (patched) against its
forward_with_torch_backend, then verl's actor loss (ppo_loss: dual-clip PPO, k3 KL, entropy
bonus, seq-mean-token-mean) computed from the hidden states in one spanhead call against
verl's functions on the dense logits. Prints PASS when both agree to float32 accuracy."""
import sys

import torch
import transformers

import _frameworks_path

_frameworks_path.load("verl", "verl.utils.kernel.linear_cross_entropy")
from verl.models.transformers import dense_common  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
import verl.utils.torch_functional as verl_F  # noqa: E402

import spanhead.integrations.verl as shv  # noqa: E402

torch.manual_seed(0)
cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, max_position_embeddings=64)
model = transformers.LlamaForCausalLM(cfg).float()
ids = torch.randint(0, 97, (3, 24))

ref = dense_common.forward_with_torch_backend(model, input_ids=ids, return_dict=True,
                                              temperature=0.9)
shv.patch()                                       # <- the one line
out = dense_common.forward_with_triton_backend(model, input_ids=ids, return_dict=True,
                                               temperature=0.9)
shv.unpatch()
err_fwd = max((out.log_probs.reshape(3, 24) - ref.log_probs.reshape(3, 24)).abs().max().item(),
              (out.entropy.reshape(3, 24) - ref.entropy.reshape(3, 24)).abs().max().item())
print(f"verl forward, spanhead vs torch backend: max |diff| {err_fwd:.2e}")


class ActorConfig(dict):  # the fields of verl's ActorConfig that its loss reads
    __getattr__ = dict.get

    def __setattr__(self, k, v):
        self[k] = v


conf = ActorConfig(policy_loss={"loss_mode": "vanilla"}, clip_ratio=0.2, clip_ratio_low=None,
                   clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode="seq-mean-token-mean",
                   entropy_coeff=0.01, use_kl_loss=True, kl_loss_type="low_var_kl",
                   kl_loss_coef=0.05, global_batch_info={})
with torch.no_grad():
    hidden = model.model(input_ids=ids).last_hidden_state
labels = torch.roll(ids, -1, -1)
mask = torch.ones(3, 24, dtype=torch.bool)
mask[:, :6] = False                               # the prompt
mask[:, -1] = False
old = ref.log_probs.reshape(3, 24).detach() + 0.1 * torch.randn(3, 24)
refl = ref.log_probs.reshape(3, 24).detach() + 0.1 * torch.randn(3, 24)
adv = torch.randn(3, 1).expand(3, 24).contiguous()
h = hidden.clone().requires_grad_(True)
loss, metrics = shv.ppo_loss(conf, h, model.lm_head.weight, labels, mask, old, adv,
                             ref_log_prob=refl, temperature=0.9)
loss.backward()

# verl's own functions on the float64 dense logits
hd = hidden.double().requires_grad_(True)
logits = hd @ model.lm_head.weight.double().T / 0.9
lp, ent = verl_F.logprobs_from_logits(logits, labels), verl_F.entropy_from_logits(logits)
pg, _ = core_algos.compute_policy_loss_vanilla(old.double(), lp, adv.double(), mask,
                                               conf.loss_agg_mode, conf)
el = core_algos.agg_loss(ent, mask, conf.loss_agg_mode)
kl = core_algos.agg_loss(core_algos.kl_penalty(lp, refl.double(), "low_var_kl"), mask,
                         conf.loss_agg_mode)
rloss = pg - 0.01 * el + 0.05 * kl
rloss.backward()
err_loss = abs(loss.item() - rloss.item()) / abs(rloss.item())
err_grad = ((h.grad.double() - hd.grad).abs().max() / hd.grad.abs().max()).item()
print(f"verl ppo_loss: spanhead {loss.item():.6f}, verl {rloss.item():.6f} (rel {err_loss:.1e}); "
      f"d_hidden rel {err_grad:.1e}; pg_clipfrac {metrics['actor/pg_clipfrac'].item():.3f}")
ok = err_fwd < 1e-4 and err_loss < 2e-5 and err_grad < 2e-5
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
