#!/usr/bin/env python3
"""Where the per-call time of spanhead's torch path goes at small batches (issue 23).

Run 25 / 24: at 1K rows `spanhead bench` (C, no Python) takes 0.47 ms at B 0.25 one-pass and
1.18 ms at A 1.0, the same points through `spanhead.torch.weighted_logprob_loss` in peers.py
1.98 and 1.83 ms. This script times, on one GPU, bf16, the same inputs in one process:

  torch-onepass-fwd     spanhead.torch.weighted_logprob_loss (forward only; the one-pass
                        gradients are computed in it)
  torch-onepass-fwdbwd  the same + loss.backward()  (the backward scales the stored gradients)
  torch-general-fwd     spanhead.torch.logprobs (forward)
  torch-general-fwdbwd  the same + backward with a fixed upstream gradient
  plain-fwd             spanhead.head_forward on the torch tensors (DLPack, no torch op)
  plain-onepass         spanhead.head_forward with dlogprob, dhidden, dweight (one pass)

Each: a warm-up, then the median of --iters calls, every call fenced by
torch.cuda.synchronize(); three numbers per call: `wall` (call + synchronize), `cpu` (until
the call returned: the host's share, the GPU may still run) and `gpu` (CUDA events around the
call on the current stream: the GPU span, which also holds any idle gaps the host leaves). Then
one torch.profiler trace of each (CPU and CUDA activities, --prof-iters calls) and its top
entries by self CPU time, so the host overhead can be attributed (torch._library wrappers,
DLPack, allocations, small tensor ops). Masks as peers.py passes them: a device bool mask
plus host spans; active rows are the last `active` share of the batch ("response").

Writes $OUT/torch_overhead.md (or --out) and prints it. Needs PYTHONPATH=python and
SPANHEAD_LIB=<the bundle's libspanhead.so> (python/spanhead/_spanhead.abi3.so carried).
    PYTHONPATH=python SPANHEAD_LIB=.devbundle/lib/libspanhead.so.0 \
        python3 bench/cuda/torch_overhead.py
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

SHAPES = {"A": (2048, 62080), "B": (4096, 37984), "C": (4096, 65536), "D": (2048, 151936),
          "E": (4096, 128256), "tiny": (64, 1000)}
DEV = "cuda"


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def parse_points(s):
    """'B:1024:0.25,A:1024:1.0' -> [(shape, N, active)]"""
    out = []
    for p in s.split(","):
        sh, n, a = p.split(":")
        out.append((sh, int(n), float(a)))
    return out


def inputs(shape, N, active, seed=0):
    H, V = SHAPES[shape]
    dt = torch.bfloat16 if DEV == "cuda" else torch.float32
    g = torch.Generator(device=DEV).manual_seed(seed)
    h = (torch.randn(N, H, device=DEV, generator=g) * 0.5).to(dt)
    w = (torch.randn(V, H, device=DEV, generator=g) * (1.0 / H ** 0.5)).to(dt)
    t = torch.randint(0, V, (N,), device=DEV, generator=g)
    n_act = max(1, int(round(active * N)))
    mask = torch.zeros(N, dtype=torch.bool, device=DEV)
    mask[N - n_act:] = True
    spans = np.array([[N - n_act, N]], dtype=np.int64)
    wts = mask.float() * (-1.0 / n_act)  # weights of the mean NLL over the active rows
    return dict(h=h, w=w, t=t, mask=mask, spans=spans, wts=wts, n_act=n_act, H=H, V=V)


def cases(P):
    import spanhead
    import spanhead.torch as sht
    h, w, t, mask, spans = P["h"], P["w"], P["t"], P["mask"], P["spans"]
    hg = h.detach().clone().requires_grad_(True)
    wg = w.detach().clone().requires_grad_(True)
    wts = P["wts"]
    up = torch.ones(h.shape[0], device=DEV)  # the general backward's upstream gradient

    def onepass_fwd():
        return sht.weighted_logprob_loss(hg, wg, t, wts, loss_mask=mask, spans=spans)

    def onepass_fwdbwd():
        loss = sht.weighted_logprob_loss(hg, wg, t, wts, loss_mask=mask, spans=spans)
        loss.backward()
        hg.grad = wg.grad = None
        return loss

    def general_fwd():
        return sht.logprobs(hg, wg, t, loss_mask=mask, spans=spans)

    def general_fwdbwd():
        lp = sht.logprobs(hg, wg, t, loss_mask=mask, spans=spans)
        torch.autograd.backward(lp, up)
        hg.grad = wg.grad = None
        return lp

    def plain_fwd():
        return spanhead.head_forward(h, w, t, active_mask=mask, spans=spans)

    def plain_onepass():
        return spanhead.head_forward(h, w, t, active_mask=mask, spans=spans, dlogprob=wts,
                                     dhidden=True, dweight=True)

    def plain_fwdbwd():
        r = spanhead.head_forward(h, w, t, active_mask=mask, spans=spans)
        return spanhead.head_backward(h, w, t, stats=r.stats, dlogprob=up, active_mask=mask,
                                      spans=spans)

    return [("torch-onepass-fwd", onepass_fwd), ("torch-onepass-fwdbwd", onepass_fwdbwd),
            ("torch-general-fwd", general_fwd), ("torch-general-fwdbwd", general_fwdbwd),
            ("plain-fwd", plain_fwd), ("plain-general-fwdbwd", plain_fwdbwd),
            ("plain-onepass", plain_onepass)]


def timed(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    sync()
    wall, cpu, gpu = [], [], []
    cuda = DEV == "cuda"
    if cuda:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        if cuda:
            e0.record()
        r = fn()
        if cuda:
            e1.record()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        del r
        wall.append((t2 - t0) * 1e3)
        cpu.append((t1 - t0) * 1e3)
        gpu.append(e0.elapsed_time(e1) if cuda else float("nan"))
    return statistics.median(wall), statistics.median(cpu), statistics.median(gpu)


def profiled(fn, iters, top):
    from torch.profiler import ProfilerActivity, profile
    fn()
    sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(iters):
            fn()
        sync()
    ka = prof.key_averages()
    rows = sorted(ka, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    lines = ["| self CPU us / call | CPU total us / call | calls / call | CUDA us / call | entry |",
             "|---|---|---|---|---|"]
    for e in rows:
        dev_t = getattr(e, "self_device_time_total", None)
        if dev_t is None:
            dev_t = getattr(e, "self_cuda_time_total", 0)
        lines.append("| %.1f | %.1f | %g | %.1f | `%s` |" % (
            e.self_cpu_time_total / iters, e.cpu_time_total / iters, e.count / iters,
            dev_t / iters, e.key[:90].replace("|", "/")))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", default="B:1024:0.25,A:1024:1.0",
                    help="shape:N:active,... (default B:1024:0.25,A:1024:1.0)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--prof-iters", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--device", default="cuda",
                    help="cuda (default); cpu only checks the script (float32, e.g. "
                         "--device cpu --points tiny:64:0.5)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                  "torch_overhead.md"))
    a = ap.parse_args()
    global DEV
    DEV = a.device
    if DEV == "cuda" and not torch.cuda.is_available():
        print("torch_overhead.py: no CUDA device: nothing measured")
        return 77
    import spanhead
    md = ["# spanhead's torch path at small batches: time per call (bf16)", "",
          "torch %s, %s, spanhead %s; median of %d calls after %d warm-up, each fenced by "
          "torch.cuda.synchronize(); wall = call + sync, cpu = until the call returned, gpu = "
          "CUDA events around the call" % (torch.__version__,
                                          torch.cuda.get_device_name(0) if DEV == "cuda"
                                          else "cpu (float32: a check of the script only)",
                                          getattr(spanhead, "__version__", "?"), a.iters,
                                          a.warmup), ""]
    md += ["| shape | N | active | case | wall ms | cpu ms | gpu ms | "
           "wall - plain ms (its plain-* twin) |",
           "|---|---|---|---|---|---|---|---|"]
    profs = []
    for sh, N, act in parse_points(a.points):
        P = inputs(sh, N, act)
        res = {}
        for name, fn in cases(P):
            res[name] = timed(fn, a.iters, a.warmup)
            if not a.no_profile:
                profs.append(("%s N=%d active=%.2f %s" % (sh, N, act, name),
                              profiled(fn, a.prof_iters, a.top)))
        for name, (wl, cp, gp) in res.items():
            base = res["plain-onepass" if "onepass" in name else
                       "plain-general-fwdbwd" if "fwdbwd" in name else "plain-fwd"][0]
            md.append("| %s | %d | %.2f | %s | %.3f | %.3f | %.3f | %+.3f |" % (
                sh, N, act, name, wl, cp, gp, wl - base))
        del P
        if DEV == "cuda":
            torch.cuda.empty_cache()
    for title, table in profs:
        md += ["", "## %s: top entries by self CPU time (per call, %d calls profiled)" % (
            title, a.prof_iters), "", table]
    text = "\n".join(md) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
