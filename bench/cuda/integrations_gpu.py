"""The framework adapters on the GPU (issue 24): spanhead.integrations.{verl,skyrl,trl}
against the frameworks' own fast paths, values, gradients and time of one training step.

    python bench/cuda/integrations_gpu.py verl|skyrl|trl [--small] [--device cuda|cpu]
        [--out DIR]

  verl   verl's Triton linear_cross_entropy (verl/utils/kernel) against the adapter on the same
         bf16 inputs (log-probs, entropy, both gradients under random upstream gradients),
         each one forward + backward timed; then verl's actor loss (vanilla dual-clip, k3 KL,
         entropy bonus, token-mean) as one training step: verl's functions on the Triton
         log-probs against shv.ppo_loss from the hidden states.
  skyrl  SkyRL's FusedLinearLogprobTriton and its torch backend
         (FusedLinearChunkedDistributedLogprob) against FusedLinearLogprobSpanhead, forward +
         backward timed, and the dual-clip policy loss step through each.
  trl    a GRPOTrainer (dapo, k3 KL) over a two-layer model with a real vocabulary: one
         loss + backward with TRL's own code and patched, timed.

The frameworks load as in the tests (python/tests/frameworks.py: SPANHEAD_INTEGRATIONS_DIR
holds <framework>/). --small: tiny shapes (a smoke run; on the CPU the Triton parts skip).
Writes DIR/integrations_<framework>.md and .json; exit 1 when an agreement check fails.
"""
import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))

LINES = []
RESULTS = {}
FAILED = []


def say(s):
    print(s, flush=True)
    LINES.append(s)


def timed(fn, dev, reps=5, warm=2):
    """Median wall time (s) of fn() over reps after warm-up runs (CUDA-synchronized)."""
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2]


def rel(a, b):
    a, b = a.detach().float(), b.detach().float()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-6)).item()


def check(name, value, tol):
    ok = value <= tol and value == value
    say(f"| {name} | {value:.3e} | {tol:g} | {'PASS' if ok else 'FAIL'} |")
    RESULTS[name] = value
    if not ok:
        FAILED.append(name)


def peak_gib(dev):
    if dev.type != "cuda":
        return float("nan")
    return torch.cuda.max_memory_allocated() / 2 ** 30


def reset_peak(dev):
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def has_triton(dev):
    if dev.type != "cuda":
        return False
    try:
        import triton  # noqa: F401
        return True
    except ImportError:
        return False


# ---- verl --------------------------------------------------------------------------------

def run_verl(a, dev):
    import frameworks
    frameworks.load_verl()
    import verl.utils.kernel.linear_cross_entropy as vlce
    from verl.trainer.ppo import core_algos
    import spanhead.integrations.verl as shv
    N, H, V = (512, 128, 1000) if a.small else (16384, 4096, 151936)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    g = torch.Generator(device="cpu").manual_seed(0)
    h0 = torch.randn(N, H, generator=g).to(dev, dt)
    w0 = (torch.randn(V, H, generator=g) / H ** 0.5).to(dev, dt)
    lab = torch.randint(0, V, (N,), generator=g).to(dev)
    g1 = torch.randn(N, generator=g).to(dev)
    g2 = torch.randn(N, generator=g).to(dev)
    say(f"## verl {frameworks_version('verl')}: N={N} H={H} V={V} {dt}")
    impls = {"spanhead": shv.linear_cross_entropy}
    if has_triton(dev):
        impls["verl-triton"] = vlce.linear_cross_entropy
    out = {}
    for name, fn in impls.items():
        h = h0.clone().requires_grad_(True)
        w = w0.clone().requires_grad_(True)

        def step():
            h.grad = w.grad = None
            lp, ent = fn(h, w, lab, 1.0, "none")
            ((lp * g1).sum() + (ent * g2).sum()).backward()
            return lp, ent
        reset_peak(dev)
        t = timed(step, dev)
        lp, ent = step()
        out[name] = (lp.detach(), ent.detach(), h.grad.clone(), w.grad.clone())
        RESULTS[f"verl/{name}/fwd_bwd_s"] = t
        say(f"| verl linear_cross_entropy fwd+bwd, {name} | {t * 1e3:.2f} ms | peak "
            f"{peak_gib(dev):.2f} GiB |")
    if "verl-triton" in out:
        s, v = out["spanhead"], out["verl-triton"]
        say("| check | rel. error | tol | |")
        check("verl: log_probs spanhead vs triton", rel(s[0], v[0]), 2e-2)
        check("verl: entropy spanhead vs triton", rel(s[1], v[1]), 2e-2)
        check("verl: d_hidden spanhead vs triton", rel(s[2], v[2]), 3e-2)
        check("verl: d_weight spanhead vs triton", rel(s[3], v[3]), 3e-2)
    # one actor-loss step: verl's math on the log-probs vs ppo_loss from the hidden states
    B = 16 if not a.small else 4
    T = N // B
    cfg = frameworks.ActorConfig(policy_loss={"loss_mode": "vanilla"}, clip_ratio=0.2,
                                 clip_ratio_high=0.28, loss_agg_mode="token-mean",
                                 entropy_coeff=0.001, use_kl_loss=True,
                                 kl_loss_type="low_var_kl", kl_loss_coef=0.001)
    mask = torch.ones(B, T, dtype=torch.bool, device=dev)
    mask[:, : T // 2] = False                       # the prompt half: response 0.5
    with torch.no_grad():
        lp_now = shv.linear_cross_entropy(h0, w0, lab)[0].view(B, T)
    old = lp_now + 0.05 * torch.randn(B, T, device=dev)
    ref = lp_now + 0.05 * torch.randn(B, T, device=dev)
    adv = torch.randn(B, 1, device=dev).expand(B, T).contiguous()
    lab2 = lab.view(B, T)
    h3 = h0.view(B, T, H)

    def step_fused():
        h = h3.detach().requires_grad_(True)
        w = w0.detach().requires_grad_(True)
        loss, _ = shv.ppo_loss(cfg, h, w, lab2, mask, old, adv, ref_log_prob=ref)
        loss.backward()
        return loss.detach()

    def step_verl(fn):
        def step():
            h = h3.detach().requires_grad_(True)
            w = w0.detach().requires_grad_(True)
            lp, ent = fn(h.view(N, H), w, lab, 1.0, "none")
            lp, ent = lp.view(B, T), ent.view(B, T)
            pg, _ = core_algos.compute_policy_loss_vanilla(old, lp, adv, mask, "token-mean", cfg)
            el = core_algos.agg_loss(ent, mask, "token-mean")
            kl = core_algos.agg_loss(core_algos.kl_penalty(lp, ref, "low_var_kl"), mask,
                                     "token-mean")
            loss = pg - cfg.entropy_coeff * el + cfg.kl_loss_coef * kl
            loss.backward()
            return loss.detach()
        return step
    steps = {"spanhead ppo_loss (fused)": step_fused,
             "verl math on spanhead log-probs": step_verl(shv.linear_cross_entropy)}
    if has_triton(dev):
        steps["verl math on verl-triton log-probs"] = step_verl(vlce.linear_cross_entropy)
    losses = {}
    for name, fn in steps.items():
        reset_peak(dev)
        t = timed(fn, dev, reps=3)
        losses[name] = fn().float().item()
        RESULTS[f"verl/step/{name}"] = t
        say(f"| verl actor step, {name} | {t * 1e3:.2f} ms | peak {peak_gib(dev):.2f} GiB | "
            f"loss {losses[name]:.6f} |")
    base = losses["verl math on spanhead log-probs"]
    check("verl: fused ppo_loss vs verl math", abs(losses["spanhead ppo_loss (fused)"] - base) /
          max(abs(base), 1e-6), 1e-3)


def frameworks_version(dist):
    import importlib.metadata as md
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "?"


# ---- SkyRL -------------------------------------------------------------------------------

def run_skyrl(a, dev):
    import tempfile

    import torch.distributed as dist

    import frameworks
    frameworks.load_skyrl()
    from skyrl.backends.skyrl_train.distributed.megatron import model_utils as mu
    from skyrl.backends.skyrl_train.utils.ppo_utils import PolicyLossRegistry
    from skyrl.train.config import AlgorithmConfig
    import spanhead.integrations.skyrl as shs
    if not dist.is_initialized():
        store = os.path.join(tempfile.mkdtemp(), "store")
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo",
                                init_method=f"file://{store}", rank=0, world_size=1)
    group = dist.group.WORLD
    B, S, H, V = (2, 256, 128, 1000) if a.small else (2, 8192, 4096, 151936)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    g = torch.Generator(device="cpu").manual_seed(1)
    h0 = torch.randn(B, S, H, generator=g).to(dev, dt)
    w0 = (torch.randn(V, H, generator=g) / H ** 0.5).to(dev, dt)
    tgt = torch.randint(0, V, (B, S), generator=g).to(dev)
    gout = torch.randn(B, S, generator=g).to(dev)
    say(f"## SkyRL {frameworks_version('skyrl')}: B={B} S={S} H={H} V={V} {dt}")
    impls = {"spanhead": shs.FusedLinearLogprobSpanhead.apply,
             "skyrl-torch (chunk 1024)": mu.FusedLinearChunkedDistributedLogprob.apply}
    if has_triton(dev):
        from skyrl.backends.skyrl_train.distributed.megatron.fused_linear_logprob_triton import \
            FusedLinearLogprobTriton
        impls["skyrl-triton"] = FusedLinearLogprobTriton.apply
    out = {}
    for name, fn in impls.items():
        h = h0.clone().requires_grad_(True)
        w = w0.clone().requires_grad_(True)

        def step():
            h.grad = w.grad = None
            lp = fn(h, w, tgt.clone(), 0, V, min(1024, S), group, False)
            (lp * gout).sum().backward()
            return lp
        reset_peak(dev)
        t = timed(step, dev, reps=3)
        lp = step()
        out[name] = (lp.detach(), h.grad.clone(), w.grad.clone())
        RESULTS[f"skyrl/{name}/fwd_bwd_s"] = t
        say(f"| SkyRL fused log-prob fwd+bwd, {name} | {t * 1e3:.2f} ms | peak "
            f"{peak_gib(dev):.2f} GiB |")
    s = out["spanhead"]
    say("| check | rel. error | tol | |")
    tol = 2e-2 if dt == torch.bfloat16 else 2e-5
    for other in [k for k in out if k != "spanhead"]:
        o = out[other]
        check(f"skyrl: log-probs spanhead vs {other}", rel(s[0], o[0]), tol)
        check(f"skyrl: d_hidden spanhead vs {other}", rel(s[1], o[1]), 1.5 * tol)
        check(f"skyrl: d_weight spanhead vs {other}", rel(s[2], o[2]), 1.5 * tol)
    cfg = AlgorithmConfig(policy_loss_type="dual_clip", eps_clip_low=0.2, eps_clip_high=0.28)
    mask = torch.ones(B, S, device=dev)
    mask[:, : S // 2] = 0
    old = (s[0] + 0.05 * torch.randn(B, S, device=dev)).float()
    adv = torch.randn(B, 1, device=dev).expand(B, S) / mask.sum()

    def step_fused():
        h = h0.detach().requires_grad_(True)
        w = w0.detach().requires_grad_(True)
        loss, _ = shs.policy_loss(cfg, h, w, tgt, mask, old, adv, tp_group=group)
        loss.backward()
        return loss.detach()

    def step_skyrl(fn):
        def step():
            h = h0.detach().requires_grad_(True)
            w = w0.detach().requires_grad_(True)
            lp = fn(h, w, tgt.clone(), 0, V, min(1024, S), group, False)
            loss, _ = PolicyLossRegistry.get("dual_clip")(lp, old, adv, cfg, mask, None)
            loss.backward()
            return loss.detach()
        return step
    steps = {"spanhead policy_loss (fused)": step_fused}
    steps.update({f"SkyRL loss on {k}": step_skyrl(f) for k, f in impls.items()})
    losses = {}
    for name, fn in steps.items():
        reset_peak(dev)
        t = timed(fn, dev, reps=3)
        losses[name] = fn().float().item()
        RESULTS[f"skyrl/step/{name}"] = t
        say(f"| SkyRL policy step, {name} | {t * 1e3:.2f} ms | peak {peak_gib(dev):.2f} GiB | "
            f"loss {losses[name]:.6f} |")
    base = losses["SkyRL loss on skyrl-torch (chunk 1024)"]
    check("skyrl: fused policy_loss vs SkyRL on its torch backend",
          abs(losses["spanhead policy_loss (fused)"] - base) / max(abs(base), 1e-6), 2e-3)


# ---- TRL ---------------------------------------------------------------------------------

def run_trl(a, dev):
    import tempfile
    import warnings

    import frameworks
    frameworks.use("trl")
    import transformers
    import datasets
    import pyarrow
    from tokenizers import Tokenizer, models, pre_tokenizers
    import trl
    import spanhead.integrations.trl as sh_trl
    V = 1000 if a.small else 151936
    Hd = 64 if a.small else 2048
    Bn, P, K = (4, 8, 32) if a.small else (8, 128, 1024)
    tmp = tempfile.mkdtemp()
    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, V)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>",
                                               eos_token="<eos>")
    torch.manual_seed(2)
    cfg = transformers.Qwen2Config(vocab_size=V, hidden_size=Hd, intermediate_size=Hd * 2,
                                   num_hidden_layers=2, num_attention_heads=max(1, Hd // 128),
                                   num_key_value_heads=max(1, Hd // 512), pad_token_id=0,
                                   eos_token_id=1, bos_token_id=1, tie_word_embeddings=False,
                                   max_position_embeddings=4096)
    m = transformers.Qwen2ForCausalLM(cfg)
    (m.to(torch.bfloat16) if dev.type == "cuda" else m).save_pretrained(tmp + "/model")
    del m
    tok.save_pretrained(tmp + "/model")
    args = trl.GRPOConfig(output_dir=tmp + "/out", per_device_train_batch_size=Bn,
                          num_generations=Bn // 2, max_completion_length=K, report_to=[],
                          use_cpu=dev.type != "cuda", bf16=dev.type == "cuda",
                          loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.001,
                          use_bias_correction_kl=False)
    ds = datasets.Dataset(pyarrow.table({"prompt": ["w2 w3"] * 8}), fingerprint="gpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = trl.GRPOTrainer(model=tmp + "/model", reward_funcs=lambda completions, **k: [0.0] *
                             len(completions), args=args, train_dataset=ds,
                             processing_class=tok)
    say(f"## TRL {frameworks_version('trl')}: GRPOTrainer dapo + k3, B={Bn} prompt={P} "
        f"completion={K} H={Hd} V={V} bf16={args.bf16}")
    d = tr.model.device
    pid = torch.randint(2, V, (Bn, P), device=d)
    cid = torch.randint(2, V, (Bn, K), device=d)
    cm = torch.ones(Bn, K, dtype=torch.long, device=d)
    for i in range(Bn):
        cm[i, K // 2 + i * (K // (2 * Bn)):] = 0       # completions of different lengths
    inp = {"prompt_ids": pid, "prompt_mask": torch.ones_like(pid), "completion_ids": cid,
           "completion_mask": cm, "advantages": torch.randn(Bn, device=d),
           "num_items_in_batch": cm.sum()}
    with torch.no_grad():
        lp, _, _ = tr._get_per_token_logps_and_entropies(
            tr.model, torch.cat([pid, cid], 1), torch.cat([inp["prompt_mask"], cm], 1), K)
    inp["old_per_token_logps"] = lp.float() + 0.05 * torch.randn_like(lp.float())
    inp["ref_per_token_logps"] = lp.float() + 0.05 * torch.randn_like(lp.float())
    tr.model.train()
    tr.current_gradient_accumulation_steps = 1

    def step():
        tr.model.zero_grad(set_to_none=True)
        loss = tr.compute_loss(tr.model, inp)
        loss.backward()
        return loss.detach().float().item()
    res = {}
    for name in ("TRL", "spanhead"):
        if name == "spanhead":
            sh_trl.patch_grpo(tr)
        reset_peak(dev)
        t = timed(step, dev, reps=3, warm=1)
        res[name] = step()
        RESULTS[f"trl/loss/{name}"] = res[name]
        RESULTS[f"trl/step/{name}"] = t
        say(f"| TRL GRPO loss + backward, {name} | {t * 1e3:.2f} ms | peak "
            f"{peak_gib(dev):.2f} GiB | loss {res[name]:.6f} |")
    tol = 2e-2 if args.bf16 else 1e-4
    check("trl: patched loss vs TRL", abs(res["spanhead"] - res["TRL"]) /
          max(abs(res["TRL"]), 1e-6), tol)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("framework", choices=["verl", "skyrl", "trl"])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    dev = torch.device(a.device)
    if dev.type == "cuda":
        say(f"# {torch.cuda.get_device_name()} torch {torch.__version__}")
    {"verl": run_verl, "skyrl": run_skyrl, "trl": run_trl}[a.framework](a, dev)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"integrations_{a.framework}.md"), "w") as f:
        f.write("\n".join(LINES) + "\n")
    with open(os.path.join(a.out, f"integrations_{a.framework}.json"), "w") as f:
        json.dump({"results": RESULTS, "failed": FAILED}, f, indent=1)
    say("FAIL " + ", ".join(FAILED) if FAILED else "PASS")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
