"""A short timing of spanhead.torch.logprobs (forward + backward) against PyTorch's dense
path (logits materialized, log_softmax, gather, entropy) on one GPU. Run by
scripts/device/python_gpu.sh; not a pytest module."""

import sys

import torch

import spanhead
import spanhead.torch as sht


def dense(h, w, t, mask):
    z = (h @ w.T).float()
    lsm = torch.log_softmax(z, -1)
    lp = lsm.gather(-1, t.unsqueeze(-1)).squeeze(-1) * mask
    ent = -(lsm.exp() * lsm).sum(-1) * mask
    return lp, ent


def timed(fn, reps=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    dev = torch.device("cuda", 0)
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, python "
          f"{sys.version.split()[0]}, spanhead {spanhead.library_version()} "
          f"({spanhead.LIBRARY_PATH})")
    try:
        rate = spanhead.Context("cuda:0").gemm_rate("bfloat16", M=8192, N=8192, K=4096)
        print(f"# dense bf16 GEMM rate (sph_tune_gemm_rate): {rate:.0f} TFLOP/s")
    except spanhead.Error as e:
        print(f"# dense GEMM rate unavailable: {e}")
    print("| N | H | V | active | path | ms fwd+bwd | peak extra MiB | TFLOP/s (active) |")
    print("|---|---|---|---|---|---|---|---|")
    for N, H, V, frac in ((8192, 4096, 32000, 1.0), (8192, 4096, 32000, 0.3),
                          (16384, 4096, 128256, 0.5)):
        g = torch.Generator(device="cpu").manual_seed(0)
        h = torch.randn(N, H, generator=g).to(dev, torch.bfloat16).requires_grad_(True)
        w = (torch.randn(V, H, generator=g) * 0.02).to(dev, torch.bfloat16).requires_grad_(True)
        t = torch.randint(0, V, (N,), generator=g).to(dev)
        mask_cpu = torch.rand(N, generator=g) < frac
        mask = mask_cpu.to(dev)
        spans = spanhead.spans_from_mask(mask_cpu.numpy(), 0)  # exact runs: the kernels gather rows
        adv = torch.randn(N, device=dev)
        n_act = int(mask_cpu.sum())
        flops = 8.0 * n_act * H * V

        def ours():
            h.grad = w.grad = None
            o = sht.logprobs(h, w, t, loss_mask=mask, spans=spans, entropy=True)
            (-(o.logprob * adv).sum() - 0.01 * o.entropy.sum()).backward()

        def theirs():
            h.grad = w.grad = None
            lp, ent = dense(h, w, t, mask)
            (-(lp * adv).sum() - 0.01 * ent.sum()).backward()

        for name, fn in (("spanhead", ours), ("torch dense", theirs)):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            try:
                ms = timed(fn)
            except torch.OutOfMemoryError:
                print(f"| {N} | {H} | {V} | {frac:.2f} | {name} | OOM | - | - |")
                continue
            peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
            print(f"| {N} | {H} | {V} | {frac:.2f} | {name} | {ms:.2f} | {peak:.0f} | "
                  f"{flops / ms / 1e9:.0f} |")


if __name__ == "__main__":
    main()
