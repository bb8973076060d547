#!/usr/bin/env python3
"""The fused distillation loss against its peers, side by side, in one run on one GPU (issue 25
item 5): a dense teacher head, bf16, the training step of the student's head (forward +
backward, gradients w.r.t. hidden and weight; the teacher gets none).

Per point (N rows, kind) it builds random bf16 student hidden [N, H], weight [V, H], teacher
hidden [N, H_T], teacher weight [V, H_T] (std chosen so logits have std --logit-std) and an
active mask (--active of the rows), then times, on the same tensors:

  spanhead     spanhead.torch.distill_loss(hidden, weight, teacher_hidden=, teacher_weight=,
               loss_mask=, kind=, beta=): one sweep (the dense teacher's logits product added)
  liger        liger-kernel's LigerFusedLinearJSD(jsd_beta, ignore_index=-100) with
               shift_labels = -100 on inactive rows (chunked torch + Triton JSD); only for
               the jsd kinds (beta 0 is its forward KL); skipped with a message when
               liger-kernel is not installed
  torch-eager  the formulas in torch (spanhead/_distill_eager.py's _terms), logits in fp32,
               chunked over --eager-chunk rows with each chunk's backward run right away (so
               the logits of one chunk are alive at a time), gradients accumulated

Reported per row: the median ms of --iters steps after --warmup, the peak extra memory
(max_memory_allocated during the step minus what was allocated before it), the loss, and
ratios to spanhead (ms / spanhead's ms); the loss and gradients of each peer are compared
with spanhead's (max relative error, flagged above 3e-2).

    PYTHONPATH=python SPANHEAD_LIB=build/libspanhead.so \\
        python bench/cuda/distill_bench.py --N 4096 16384 --H 4096 --HT 4096 --V 128256
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--N", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--H", type=int, default=4096)
    ap.add_argument("--HT", type=int, default=4096)
    ap.add_argument("--V", type=int, default=128256)
    ap.add_argument("--kinds", nargs="+", default=["jsd:0.5", "forward_kl"],
                    help="kind[:beta] (jsd:0.5, forward_kl, reverse_kl, jsd:0)")
    ap.add_argument("--active", type=float, default=1.0, help="fraction of active rows")
    ap.add_argument("--logit-std", type=float, default=2.0)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--eager-chunk", type=int, default=2048)
    ap.add_argument("--impls", nargs="+", default=["spanhead", "liger", "torch-eager"])
    ap.add_argument("--seed", type=int, default=1)
    return ap.parse_args()


def make(N, H, HT, V, active, std, seed, dev):
    g = torch.Generator(device=dev).manual_seed(seed)
    bf = torch.bfloat16

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=dev) * scale).to(bf)

    h = rnd(N, H).requires_grad_(True)
    w = rnd(V, H, scale=std / H ** 0.5).requires_grad_(True)
    th = rnd(N, HT)
    tw = rnd(V, HT, scale=std / HT ** 0.5)
    mask = torch.rand(N, generator=g, device=dev) < active
    mask[0] = True
    return h, w, th, tw, mask


def step_spanhead(kind, beta, h, w, th, tw, mask):
    import spanhead.torch as st
    loss = st.distill_loss(h, w, teacher_hidden=th, teacher_weight=tw, loss_mask=mask,
                           kind=kind, beta=beta)
    loss.backward()
    return loss


def step_liger(kind, beta, h, w, th, tw, mask):
    from liger_kernel.transformers import LigerFusedLinearJSD
    b = {"forward_kl": 0.0, "reverse_kl": 1.0}.get(kind, beta)
    labels = torch.where(mask, torch.zeros_like(mask, dtype=torch.long),
                         torch.full_like(mask, -100, dtype=torch.long))
    loss = LigerFusedLinearJSD(jsd_beta=b, ignore_index=-100)(h, w, th, tw, labels)
    loss.backward()
    return loss


def step_eager(kind, beta, h, w, th, tw, mask, chunk):
    from spanhead._distill_eager import _terms
    n = mask.sum()
    total = torch.zeros((), dtype=torch.float32, device=h.device)
    for c0 in range(0, h.shape[0], chunk):
        sl = slice(c0, c0 + chunk)
        lq = torch.log_softmax((h[sl] @ w.T).float(), dim=-1)
        with torch.no_grad():
            lp = torch.log_softmax((th[sl] @ tw.T).float(), dim=-1)
        rows = _terms(kind, beta, lq, lp).sum(-1)
        part = torch.where(mask[sl], rows, torch.zeros_like(rows)).sum() / n
        part.backward()
        total += part.detach()
        del lq, lp, rows, part
    return total


def timed(fn, args, warmup, iters):
    h, w = args[0], args[1]
    times, peak = [], 0
    loss = None
    for k in range(warmup + iters):
        h.grad = w.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        loss = fn(*args)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if k >= warmup:
            times.append(dt * 1e3)
            peak = max(peak, torch.cuda.max_memory_allocated() - base)
    return statistics.median(times), peak, float(loss.detach()), h.grad.float().clone(), w.grad.float().clone()


def rel(a, b):
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)


def main():
    a = parse()
    if not torch.cuda.is_available():
        print("distill_bench: no CUDA device", file=sys.stderr)
        return 77
    dev = torch.device("cuda")
    have_liger = True
    try:
        import liger_kernel.transformers  # noqa: F401
    except Exception as e:  # noqa: BLE001
        have_liger = False
        print(f"# liger: skipped (liger-kernel not importable: {e})")
    print(f"# {torch.cuda.get_device_name()} H={a.H} H_T={a.HT} V={a.V} bf16 active={a.active} "
          f"warmup={a.warmup} iters={a.iters}")
    print(f"{'impl':<12} {'N':>6} {'kind':<12} {'ms':>9} {'peak_GiB':>9} {'loss':>12} "
          f"{'x_spanhead':>10} {'err_loss':>9} {'err_dh':>9} {'err_dw':>9}")
    for N in a.N:
        for ks in a.kinds:
            kind, _, b = ks.partition(":")
            beta = float(b) if b else 0.5
            args = make(N, a.H, a.HT, a.V, a.active, a.logit_std, a.seed, dev)
            res = {}
            for impl in a.impls:
                if impl == "liger" and not have_liger:
                    continue
                if impl == "spanhead":
                    fn = lambda *x: step_spanhead(kind, beta, *x)  # noqa: E731
                elif impl == "liger":
                    fn = lambda *x: step_liger(kind, beta, *x)  # noqa: E731
                else:
                    fn = lambda *x: step_eager(kind, beta, *x, a.eager_chunk)  # noqa: E731
                try:
                    res[impl] = timed(fn, args, a.warmup, a.iters)
                except torch.cuda.OutOfMemoryError:
                    print(f"{impl:<12} {N:>6} {ks:<12} {'OOM':>9}")
                    torch.cuda.empty_cache()
            ref = res.get("spanhead")
            for impl, (ms, peak, loss, dh, dw) in res.items():
                x = ms / ref[0] if ref else float("nan")
                el = abs(loss - ref[2]) / max(abs(ref[2]), 1e-30) if ref else float("nan")
                eh = rel(dh, ref[3]) if ref else float("nan")
                ew = rel(dw, ref[4]) if ref else float("nan")
                flag = " !" if max(el, eh, ew) > 3e-2 else ""
                print(f"{impl:<12} {N:>6} {ks:<12} {ms:>9.2f} {peak / 2**30:>9.2f} {loss:>12.6g} "
                      f"{x:>10.2f} {el:>9.2e} {eh:>9.2e} {ew:>9.2e}{flag}")
            del args, res
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
