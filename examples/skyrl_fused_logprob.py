"""SkyRL with spanhead: one line, `spanhead.integrations.skyrl.patch()`, and SkyRL's fused
LM-head log-prob (megatron_config.fused_lm_head_logprob=True, either backend name) runs
spanhead's FusedLinearLogprobSpanhead. Here on the CPU with one gloo process as the TP group:
SkyRL's own from_parallel_hidden_to_logprobs before and after the patch (values and
gradients), then SkyRL's dual-clip PPO loss from the hidden states in one spanhead call
against SkyRL's PolicyLossRegistry function. Prints PASS when both agree."""
import os
import sys
import tempfile

import torch
import torch.distributed as dist

import _frameworks_path

_frameworks_path.load("skyrl", "skyrl.backends.skyrl_train.distributed.megatron.model_utils")
from skyrl.backends.skyrl_train.distributed.megatron import model_utils  # noqa: E402
from skyrl.backends.skyrl_train.utils.ppo_utils import PolicyLossRegistry  # noqa: E402
from skyrl.train.config import AlgorithmConfig  # noqa: E402

import spanhead.integrations.skyrl as shs  # noqa: E402

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")      # one local process: loopback
store = os.path.join(tempfile.mkdtemp(), "store")
dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
group = dist.group.WORLD
torch.manual_seed(0)
B, S, H, V = 2, 40, 32, 101
hidden = torch.randn(B, S, H)
weight = torch.randn(V, H) / H ** 0.5
ids = torch.randint(0, V, (B, S))


def run():
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    lp = model_utils.from_parallel_hidden_to_logprobs(h, w, ids, 0, V, group, chunk_size=16,
                                                      temperature=0.8)
    (lp * torch.linspace(-1, 1, lp.numel()).reshape(lp.shape)).sum().backward()
    return lp.detach(), h.grad, w.grad


ref = run()
shs.patch()                                        # <- the one line
out = run()
shs.unpatch()
err = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(out, ref))
print(f"SkyRL fused log-prob, spanhead vs SkyRL's torch backend: max rel diff {err:.1e}")

cfg = AlgorithmConfig(policy_loss_type="dual_clip", eps_clip_low=0.2, eps_clip_high=0.28)
mask = torch.ones(B, S)
mask[:, :10] = 0
hd = hidden.double().requires_grad_(True)
lpd = torch.log_softmax(hd @ weight.double().T, -1).gather(
    -1, ids.roll(-1, -1).unsqueeze(-1)).squeeze(-1)
old = (lpd.detach() + 0.2 * torch.randn(B, S)).float()
adv = torch.randn(B, 1).expand(B, S) / mask.sum()   # SkyRL scales advantages by its reduction
h = hidden.clone().requires_grad_(True)
loss, met = shs.policy_loss(cfg, h, weight, ids.roll(-1, -1), mask, old, adv, tp_group=group)
loss.backward()
rloss, rmet = PolicyLossRegistry.get("dual_clip")(lpd, old.double(), adv.double(), cfg,
                                                  mask.double(), None)
rloss.backward()
e2 = max(abs(loss.item() - rloss.item()) / abs(rloss.item()),
         ((h.grad.double() - hd.grad).abs().max() / hd.grad.abs().max()).item())
print(f"SkyRL dual_clip loss: spanhead {loss.item():.6f}, SkyRL {rloss.item():.6f}; clip_ratio "
      f"{met['clip_ratio'].item():.3f} vs {rmet['clip_ratio']:.3f}; max rel diff {e2:.1e}")
dist.destroy_process_group()
ok = err < 2e-5 and e2 < 2e-5
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
