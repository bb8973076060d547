"""TRL with spanhead: one line, `spanhead.integrations.trl.patch_grpo(trainer)`, and the
GRPOTrainer computes its loss with spanhead.torch.policy_loss from the last hidden state.
Here a tiny random Llama (saved to a temporary folder: no hub) and a GRPOTrainer with DAPO's
clip-higher and a k3 KL term: the loss and gradients of one batch with TRL's code and patched,
then a few real trainer.train() steps (generation, rewards, optimizer) with the patch on.
Prints PASS when the patched loss and gradients equal TRL's."""
import sys
import tempfile
import warnings

import torch

import _frameworks_path

_frameworks_path.load("trl", "trl")   # before transformers: it looks for accelerate at import
import transformers  # noqa: E402
import datasets  # noqa: E402
import pyarrow  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

import spanhead.integrations.trl as sh_trl  # noqa: E402

V = 64
tmp = tempfile.mkdtemp()
vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, V)}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                           eos_token="<eos>")
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
    vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, eos_token_id=1,
    bos_token_id=1))
model.save_pretrained(tmp + "/model")
tok.save_pretrained(tmp + "/model")


def reward(completions, **kw):   # prefer short completions
    return [-float(len(c.split())) for c in completions]


args = GRPOConfig(output_dir=tmp + "/out", per_device_train_batch_size=4, num_generations=4,
                  max_completion_length=8, max_steps=3, learning_rate=1e-3, report_to=[],
                  use_cpu=True, bf16=False, logging_steps=1, loss_type="dapo", epsilon=0.2,
                  epsilon_high=0.28, beta=0.02, use_bias_correction_kl=False,
                  temperature=1.0)
prompts = datasets.Dataset(pyarrow.table({"prompt": ["w2 w3 w4", "w5 w6", "w7 w8 w9"] * 4}),
                           fingerprint="example")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    trainer = GRPOTrainer(model=tmp + "/model", reward_funcs=reward, args=args,
                          train_dataset=prompts, processing_class=tok)

# one batch through TRL's loss, then through the patched one
B, P, K = 4, 4, 6
pid = torch.randint(2, V, (B, P))
cid = torch.randint(2, V, (B, K))
cm = torch.ones(B, K, dtype=torch.long)
cm[0, 4:] = 0
inputs = {"prompt_ids": pid, "prompt_mask": torch.ones_like(pid), "completion_ids": cid,
          "completion_mask": cm, "advantages": torch.randn(B), "num_items_in_batch": cm.sum()}
with torch.no_grad():
    lp, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, torch.cat([pid, cid], 1), torch.cat([inputs["prompt_mask"], cm], 1), K)
inputs["old_per_token_logps"] = lp + 0.3 * torch.randn(B, K)
inputs["ref_per_token_logps"] = lp + 0.3 * torch.randn(B, K)
trainer.model.train()
trainer.current_gradient_accumulation_steps = 1


def loss_grads():
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.item(), torch.cat([p.grad.flatten() for p in trainer.model.parameters()
                                   if p.grad is not None])


ref_loss, ref_g = loss_grads()
sh_trl.patch_grpo(trainer)                          # <- the one line
loss, g = loss_grads()
rel = ((g - ref_g).abs().max() / ref_g.abs().max()).item()
print(f"GRPOTrainer dapo + k3: TRL loss {ref_loss:.6f}, spanhead {loss:.6f}; gradients max rel "
      f"diff {rel:.1e}")
trainer.model.zero_grad()
trainer.train()                                     # generation, rewards, 3 optimizer steps
print("train:", {k: round(v, 4) for k, v in trainer.state.log_history[-1].items()
                 if isinstance(v, float)})
ok = abs(loss - ref_loss) <= 2e-5 * abs(ref_loss) and rel < 5e-5
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
