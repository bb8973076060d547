#!/usr/bin/env python3
"""spanhead against its peers, side by side, in one run on one GPU.

Per point (model shape, N tokens, active fraction, mask pattern) it builds random bf16 hidden
[N, H] and weight [V, H] (std chosen so logits have std --logit-std), random targets and a
loss mask, then times forward + backward (gradients w.r.t. hidden and weight; the loss is the
sum of the masked log-probs, so the upstream gradient is 1 on active rows) for:

  spanhead     spanhead.torch.logprobs(hidden, weight, targets, loss_mask=<device mask>,
               spans=<host spans>): the general path (statistics in the forward, logits
               recomputed in the backward), active rows only
  spanhead-onepass  spanhead.torch.weighted_logprob_loss(hidden, weight, targets, -1, ...,
               return_logprobs=True): the same loss (L = sum of the masked log-probs, i.e.
               weights -1 in L = -sum w_i logprob_i) in spanhead's one-pass mode: one spanhead
               call whose sweep also computes dhidden and dweight (6NHV flops instead of
               8NHV); the backward only hands the stored gradients over. Valid whenever the
               upstream gradient is known before the forward (SFT, REINFORCE; here: 1)
  torch-eager  logits = h @ W.T (bf16) -> float -> log_softmax -> gather, times the mask;
               autograd (every row is computed)
  liger-sum    liger-kernel LigerFusedLinearCrossEntropyFunction, reduction "sum",
               ignore_index -100 on inactive rows (gradients computed inside the forward)
  liger-none   the same with reduction "none" (per-token losses; gradients in the backward)
  cce          cut-cross-entropy linear_cross_entropy, impl "cce" (gradient filtering on),
               reduction "none", ignore_index -100 on inactive rows
  cce-exact    the same, impl "cce_exact" (filter_eps=None where that impl name is absent)
  verl         verl's Triton fused log-prob/entropy kernel (verl/utils/kernel), loaded by
               path without verl's package __init__; no mask support: every row is computed,
               the loss multiplies its per-row log-probs by the mask

and measures the dense cuBLAS bf16 GEMM rate at the shape (h[N,H] @ W.T[H,V], median), from
which floor_ms = 8 * N_active * H * V / rate (DESIGN.md section 5: the general path's flops);
every row's ratio is against that floor, and spanhead-onepass rows also carry
floor_onepass_ms = 6 * N_active * H * V / rate and ratio_onepass.

Every peer's per-row log-probs are compared with spanhead's on the active rows (max abs diff)
and its gradients with spanhead's (relative Frobenius error); either above 5e-2 is flagged, so
a broken peer call shows. Peak extra memory = max_memory_allocated during the timed reps minus
what was allocated before them minus the two gradient outputs.

A peer that is not importable, fails or runs out of memory is skipped with a message; the
run never stops for one. A CUDA fault that leaves the context unusable ends the run after
the results so far are written. --budget-s bounds the run: no point is started once the time
spent plus the longest point so far would pass it.

Outputs (in --out, default $OUT, else bench/results/peers-<date>): peers.md (table),
peers.jsonl (one object per impl and point, the fields of issue 6 plus checks), peers.png
(time vs active fraction per shape, with the floor). See bench/cuda/README-peers.md.

peers.md ends with two summaries per point: spanhead's general path (two passes) against the
fastest peer (and against the fastest that takes its upstream gradient after the forward:
every peer but liger-sum), and spanhead-onepass against the fastest peer. The second is the
comparison for this benchmark's loss: the upstream gradient (1 per active row) is known
before the forward, which is what one-pass peers (liger-sum computes its gradients inside the
forward) rely on too; the first is what spanhead costs for losses that need the log-probs
first (PPO ratios).
"""

import argparse
import datetime
import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHAPES = {"A": (2048, 62080), "B": (4096, 37984), "C": (5120, 37984), "D": (2048, 151936)}
# Peers that compute their gradients inside the forward, so need the upstream gradient before
# it (a scalar here): not usable where the loss needs the log-probs first (PPO/GRPO ratios).
ONE_PASS_PEERS = {"liger-sum"}

IMPLS = ["spanhead", "spanhead-onepass", "torch-eager", "liger-sum", "liger-none", "cce",
         "cce-exact", "verl"]
MASKS = ["response", "fragmented"]
CHECK_TOL = 5e-2
SEQ = 2048        # response masks: the last active*SEQ rows of each SEQ-row sequence
FRAG_RUN = 16     # fragmented masks: runs of 16 active rows, evenly spaced (as spanhead bench)
GIB = float(1 << 30)


_LOG = []   # the open log file, once the output folder exists


def log(msg):
    print(msg, flush=True)
    if _LOG:
        _LOG[0].write(msg + "\n")
        _LOG[0].flush()


# ----------------------------------------------------------------------------------------
# Arguments


def parse_list(text, conv, what):
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            out.append(conv(item))
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{what}: {item!r}: {e}") from None
    if not out:
        raise argparse.ArgumentTypeError(f"{what}: empty list")
    return out


def shape_arg(item):
    """A, B, C, D or HxV (a custom shape, named by itself)."""
    if item.upper() in SHAPES:
        return (item.upper(),) + SHAPES[item.upper()]
    parts = item.lower().split("x")
    if len(parts) != 2:
        raise ValueError("expected A, B, C, D or HxV (e.g. 4096x32000)")
    H, V = int(parts[0]), int(parts[1])
    if H <= 0 or V <= 0:
        raise ValueError("H and V must be positive")
    return (item, H, V)


def positive_int(item):
    v = int(item)
    if v <= 0:
        raise ValueError("must be a positive integer")
    return v


def fraction(item):
    v = float(item)
    if not 0.0 < v <= 1.0:
        raise ValueError("must be in (0, 1]")
    return v


def impl_arg(item):
    if item not in IMPLS:
        raise ValueError(f"expected one of {', '.join(IMPLS)}")
    return item


def mask_arg(item):
    if item not in MASKS:
        raise ValueError(f"expected one of {', '.join(MASKS)}")
    return item


def build_parser():
    p = argparse.ArgumentParser(
        description="spanhead vs peers (PyTorch eager, liger-kernel, cut-cross-entropy, verl "
                    "kernel): forward+backward time, floor ratio, memory, value checks.")
    p.add_argument("--shapes", default="A,B,C,D",
                   type=lambda s: parse_list(s, shape_arg, "--shapes"),
                   help="model shapes per rank: A (2048x62080), B (4096x37984), "
                        "C (5120x37984), D (2048x151936), or HxV; default A,B,C,D")
    p.add_argument("--N", default="16384", type=lambda s: parse_list(s, positive_int, "--N"),
                   help="tokens per point, comma list (default 16384)")
    p.add_argument("--fractions", default="1.0,0.5,0.25",
                   type=lambda s: parse_list(s, fraction, "--fractions"),
                   help="active fractions (default 1.0,0.5,0.25)")
    p.add_argument("--masks", default="response,fragmented",
                   type=lambda s: parse_list(s, mask_arg, "--masks"),
                   help="mask patterns: response (the last part of each 2048-row sequence) "
                        "and/or fragmented (runs of 16 rows); fragmented is skipped at "
                        "fraction 1.0 (same as response); default response,fragmented")
    p.add_argument("--impls", default=",".join(IMPLS),
                   type=lambda s: parse_list(s, impl_arg, "--impls"),
                   help=f"implementations (default all: {','.join(IMPLS)})")
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="wall-clock budget in seconds, imports included (default 240); no "
                        "point is started that would likely end past it")
    p.add_argument("--reps", type=positive_int, default=10,
                   help="most timed repetitions per impl and point (default 10; at least 3)")
    p.add_argument("--target-s", type=float, default=0.3,
                   help="timed seconds aimed at per impl and point: reps = clamp(target / "
                        "one call, 3, --reps) (default 0.3)")
    p.add_argument("--warmup", type=positive_int, default=1,
                   help="untimed calls before timing (compilation, autotuning); default 1")
    p.add_argument("--logit-std", type=float, default=2.0,
                   help="standard deviation of the random logits (default 2.0)")
    p.add_argument("--gap", type=int, default=0,
                   help="spanhead span coalescing gap in rows (default 0: exact spans, as "
                        "spanhead bench)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", default="cuda",
                   help="cuda, cuda:N, or cpu (cpu: a harness test with tiny shapes only)")
    p.add_argument("--order", choices=["priority", "shape"], default="priority",
                   help="point order: priority (response 0.5, 1.0, 0.25 over every shape, "
                        "then fragmented), or shape (shape by shape); default priority")
    p.add_argument("--out", default=None,
                   help="output folder (default $OUT, else bench/results/peers-<date>)")
    p.add_argument("--dry-run", action="store_true",
                   help="validate arguments, import every peer, print the plan; no GPU work")
    return p


def make_points(args):
    """(shape, H, V, N, fraction, mask) in the order they are run."""
    combos = []
    for mask in args.masks:
        for frac in args.fractions:
            if mask == "fragmented" and frac >= 1.0:
                continue
            combos.append((mask, frac))

    def prio(c):
        mask, frac = c
        # response first; within it 0.5 (the issue's headline point), 1.0, then lower
        mrank = MASKS.index(mask)
        frank = 0 if abs(frac - 0.5) < 1e-9 else (1 if frac >= 1.0 else 2)
        return (mrank, frank, -frac)

    pts = []
    if args.order == "priority":
        for mask, frac in sorted(combos, key=prio):
            for N in args.N:
                for name, H, V in args.shapes:
                    pts.append((name, H, V, N, frac, mask))
    else:
        for name, H, V in args.shapes:
            for N in args.N:
                for mask, frac in sorted(combos, key=prio):
                    pts.append((name, H, V, N, frac, mask))
    return pts


# ----------------------------------------------------------------------------------------
# Peers: each loader returns (runner factory, version string) or raises


def version_of(dist):
    try:
        from importlib import metadata
        return metadata.version(dist)
    except Exception:  # noqa: BLE001 - metadata missing is not an error here
        return "?"


def load_spanhead():
    if importlib.util.find_spec("spanhead") is None:
        sys.path.insert(0, str(REPO / "python"))
        if not list((REPO / "python" / "spanhead").glob("_spanhead*.so")):
            raise ImportError("python/spanhead/_spanhead.abi3.so is not built (make "
                              "python/spanhead/_spanhead.abi3.so here, then carry it)")
    if "SPANHEAD_LIB" not in os.environ and "SPANHEAD_BUILD_DIR" not in os.environ:
        for c in ("build/libspanhead.so", "build-peers/libspanhead.so"):
            if (REPO / c).exists():
                os.environ["SPANHEAD_LIB"] = str(REPO / c)
                break
    import spanhead
    import spanhead.torch as sht
    missing = getattr(spanhead, "missing_functions", lambda: [])()
    ver = getattr(spanhead, "library_version", lambda: "?")()
    return sht, f"{ver} ({spanhead.LIBRARY_PATH})" + (f", missing {missing}" if missing else "")


def load_liger():
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    return LigerFusedLinearCrossEntropyFunction, version_of("liger-kernel")


def load_cce():
    import cut_cross_entropy
    from cut_cross_entropy import linear_cross_entropy
    impls = getattr(cut_cross_entropy, "LinearCrossEntropyImpl", None)
    has_exact = impls is not None and any(m.name.lower() == "cce_exact" for m in impls)
    return (linear_cross_entropy, has_exact), version_of("cut-cross-entropy")


def load_verl():
    """verl's fused kernel without verl: its package __init__ pulls ray, hydra, datasets...
    Only verl/utils/kernel/{kernels,linear_cross_entropy}.py are loaded, under stub parent
    packages, with verl.utils.device (all the kernel module imports from verl) stubbed on
    torch.cuda."""
    import torch
    mod = sys.modules.get("verl.utils.kernel.linear_cross_entropy")
    if mod is not None:
        return mod.linear_cross_entropy, version_of("verl")
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("No module named 'verl' (wheel not installed)")
    kdir = Path(list(spec.submodule_search_locations)[0]) / "utils" / "kernel"
    for f in ("kernels.py", "linear_cross_entropy.py"):
        if not (kdir / f).exists():
            raise ImportError(f"verl {version_of('verl')}: {kdir / f} missing")

    def pkg(name, path):
        m = types.ModuleType(name)
        m.__path__ = [str(path)] if path else []
        m.__package__ = name
        sys.modules[name] = m
        return m

    saved = {k: sys.modules.get(k) for k in ("verl", "verl.utils", "verl.utils.device",
                                             "verl.utils.kernel")}
    try:
        root, utils, kern = pkg("verl", None), pkg("verl.utils", None), \
            pkg("verl.utils.kernel", kdir)
        dev = types.ModuleType("verl.utils.device")
        dev.is_cuda_available = torch.cuda.is_available()
        dev.get_device_name = lambda: "cuda"
        dev.get_torch_device = lambda: torch.cuda
        dev.get_device_capability = lambda device_id=0: (
            torch.cuda.get_device_capability(device_id) if torch.cuda.is_available()
            else (None, None))
        sys.modules["verl.utils.device"] = dev
        root.utils, utils.device, utils.kernel = utils, dev, kern
        importlib.import_module("verl.utils.kernel.kernels")
        lce = importlib.import_module("verl.utils.kernel.linear_cross_entropy")
    except BaseException:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        raise
    return lce.linear_cross_entropy, version_of("verl")


LOADERS = {"spanhead": load_spanhead, "liger": load_liger, "cce": load_cce, "verl": load_verl}
IMPL_LOADER = {"spanhead": "spanhead", "spanhead-onepass": "spanhead", "liger-sum": "liger",
               "liger-none": "liger", "cce": "cce", "cce-exact": "cce", "verl": "verl",
               "torch-eager": None}


def load_all(impls):
    """{loader name: (object, version)} and {impl: reason it is unavailable}."""
    loaded, unavailable = {}, {}
    for impl in impls:
        key = IMPL_LOADER[impl]
        if key is None or key in loaded:
            continue
        if key in unavailable:
            unavailable[impl] = unavailable[key]
            continue
        try:
            loaded[key] = LOADERS[key]()
            log(f"# {key}: {loaded[key][1]}")
        except BaseException as e:  # noqa: BLE001 - any import failure skips the peer
            if isinstance(e, KeyboardInterrupt):
                raise
            msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            unavailable[key] = msg
            log(f"# {key}: not importable, skipped ({msg})")
    for impl in impls:
        key = IMPL_LOADER[impl]
        if key is not None and key in unavailable:
            unavailable[impl] = unavailable[key]
    return loaded, unavailable


def make_step(impl, loaded, P):
    """A function that runs one forward + backward and returns per-row log-probs (float32, N;
    0 on inactive rows) or the scalar sum when the impl only returns that."""
    import torch
    h, w, t, t_ign, maskd, maskf = P["h"], P["w"], P["t"], P["t_ign"], P["maskd"], P["maskf"]

    if impl == "spanhead":
        sht = loaded["spanhead"][0]
        spans = P["spans"]

        def run():
            lp = sht.logprobs(h, w, t, loss_mask=maskd, spans=spans)
            lp.sum().backward()
            return lp
    elif impl == "spanhead-onepass":
        sht = loaded["spanhead"][0]
        loss_fn = getattr(sht, "weighted_logprob_loss", None)
        if loss_fn is None:
            raise RuntimeError("spanhead.torch.weighted_logprob_loss: not in this spanhead "
                               "package (python/spanhead/torch.py older than the one-pass "
                               "loss)")
        spans, neg1 = P["spans"], P["neg_ones"]

        def run():
            # weights -1: L = -sum(-1 * logprob) = the sum of the masked log-probs, the loss
            # every other impl here backpropagates
            out = loss_fn(h, w, t, neg1, loss_mask=maskd, spans=spans, return_logprobs=True)
            out.loss.backward()
            return out.logprob
    elif impl == "torch-eager":
        def run():
            z = (h @ w.T).float()
            lp = torch.log_softmax(z, -1).gather(1, t.unsqueeze(1)).squeeze(1) * maskf
            del z
            lp.sum().backward()
            return lp
    elif impl in ("liger-sum", "liger-none"):
        F = loaded["liger"][0]
        red = "sum" if impl == "liger-sum" else "none"

        def run():
            # positional: (input, weight, target, bias, ce_weight, ignore_index,
            # lse_square_scale, label_smoothing, reduction); the rest keep their defaults
            out = F.apply(h, w, t_ign, None, None, -100, 0.0, 0.0, red)
            loss = out[0] if isinstance(out, (tuple, list)) else out
            lp = -loss          # cross entropy = -log-prob
            lp.sum().backward()
            return lp.detach()
    elif impl in ("cce", "cce-exact"):
        lce, has_exact = loaded["cce"][0]
        if impl == "cce":
            kw = {"impl": "cce"}
        elif has_exact:
            kw = {"impl": "cce_exact"}
        else:
            kw = {"impl": "cce", "filter_eps": None}  # what cce_exact is: no grad filtering

        def run():
            loss = lce(h, w, t_ign, ignore_index=-100, reduction="none", **kw)
            lp = -loss
            lp.sum().backward()
            return lp.detach()
    elif impl == "verl":
        lce = loaded["verl"][0]

        def run():
            lp_all, _ent = lce(h, w, t, 1.0, "none", None)
            lp = lp_all * maskf
            lp.sum().backward()
            return lp.detach()
    else:
        raise ValueError(f"impl {impl}")

    def step():
        h.grad = None
        w.grad = None
        return run()

    return step


# ----------------------------------------------------------------------------------------
# Measurement


class Timer:
    def __init__(self, cuda):
        self.cuda = cuda

    def sync(self):
        import torch
        if self.cuda:
            torch.cuda.synchronize()

    def one(self, fn):
        import torch
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            r = fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b), r
        t0 = time.perf_counter()
        r = fn()
        return (time.perf_counter() - t0) * 1e3, r

    def many(self, fn, n):
        import torch
        r = None
        if self.cuda:
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(n)]
            for a, b in ev:
                a.record()
                r = fn()
                b.record()
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in ev], r
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            r = fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return ts, r


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def gemm_rate(h, w, timer, reps=10):
    """Dense bf16 GEMM rate (FLOP/s) of h[N,H] @ W.T[H,V], median of reps after warm-up."""
    N, H = h.shape
    V = w.shape[0]
    with __import__("torch").no_grad():
        f = lambda: h @ w.T  # noqa: E731
        for _ in range(3):
            f()
        timer.sync()
        ts, out = timer.many(f, reps)
        del out
    return 2.0 * N * H * V / (median(ts) * 1e-3)


def build_mask(N, frac, pattern):
    """Host uint8 mask, as spanhead bench builds it."""
    import numpy as np
    m = np.zeros(N, dtype=np.uint8)
    if frac >= 1.0:
        m[:] = 1
    elif pattern == "response":
        for s0 in range(0, N, SEQ):
            ln = min(SEQ, N - s0)
            a = int(math.floor(frac * ln + 0.5))
            m[s0 + ln - a:s0 + ln] = 1
    else:
        period = max(FRAG_RUN, int(math.floor(FRAG_RUN / frac + 0.5)))
        for s0 in range(0, N, period):
            m[s0:s0 + FRAG_RUN] = 1
    return m


def spans_of(mask, gap):
    """(n, 2) int64 runs of active rows, coalesced across gaps of at most `gap` rows."""
    import numpy as np
    idx = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    runs = idx.reshape(-1, 2)
    out = []
    for s, e in runs:
        if out and s - out[-1][1] <= gap:
            out[-1][1] = int(e)
        else:
            out.append([int(s), int(e)])
    return np.asarray(out, dtype=np.int64).reshape(-1, 2)


def make_inputs(H, V, N, frac, pattern, args, dev):
    import numpy as np
    import torch
    g = torch.Generator(device=dev).manual_seed(args.seed + 7919 * N + 31 * H + V)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    h = torch.randn(N, H, device=dev, generator=g, dtype=torch.float32).to(dt)
    w = (torch.randn(V, H, device=dev, generator=g, dtype=torch.float32)
         * (args.logit_std / math.sqrt(H))).to(dt)
    t = torch.randint(0, V, (N,), device=dev, generator=g, dtype=torch.int64)
    mask = build_mask(N, frac, pattern)
    try:
        import spanhead
        spans = spanhead.spans_from_mask(mask, args.gap)
    except Exception:  # noqa: BLE001 - spanhead absent: the same coalescing here
        spans = spans_of(mask, args.gap)
    maskd = torch.from_numpy(mask.astype(np.bool_)).to(dev)
    P = {"h": h.requires_grad_(True), "w": w.requires_grad_(True), "t": t,
         "t_ign": torch.where(maskd, t, torch.full_like(t, -100)),
         "maskd": maskd, "maskf": maskd.float(), "spans": spans,
         "neg_ones": torch.full((N,), -1.0, device=dev, dtype=torch.float32),
         "n_act": int(mask.sum())}
    return P


def relerr(a, b, rows=8192):
    """||a - b|| / ||b|| in float32, by row chunks (bounded temporaries)."""
    import torch
    num = torch.zeros((), dtype=torch.float64, device=a.device)
    den = torch.zeros((), dtype=torch.float64, device=a.device)
    for i in range(0, a.shape[0], rows):
        x, y = a[i:i + rows].float(), b[i:i + rows].float()
        num += (x - y).square().sum().double()
        den += y.square().sum().double()
    return math.sqrt(num.item()) / max(math.sqrt(den.item()), 1e-30)


def is_oom(e):
    import torch
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def cuda_alive():
    import torch
    try:
        torch.cuda.synchronize()
        torch.empty(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001
        return False


def measure(impl, step, P, ref, timer, args, cuda):
    """One impl at one point: dict with ms, reps, peak_extra_bytes, checks, status."""
    import torch
    h, w = P["h"], P["w"]
    rec = {"impl": impl}
    for _ in range(args.warmup):
        step()
    timer.sync()
    one_ms, _ = timer.one(step)
    reps = max(3, min(args.reps, int(args.target_s * 1e3 / max(one_ms, 1e-3))))
    grad_bytes = h.numel() * h.element_size() + w.numel() * w.element_size()
    h.grad = w.grad = None
    timer.sync()
    if cuda:
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    ts, lp = timer.many(step, reps)
    if cuda:
        peak = torch.cuda.max_memory_allocated()
        rec["peak_extra_bytes"] = max(0, int(peak - base - grad_bytes))
        rec["peak_bytes_raw"] = int(peak - base)
    else:
        rec["peak_extra_bytes"] = None
    rec["ms"] = median(ts)
    rec["ms_min"] = min(ts)
    rec["reps"] = reps
    # checks against the reference (spanhead, else eager) on the active rows
    lp = lp.detach()
    act = P["maskd"]
    if ref is not None and ref.get("lp") is not None:
        if lp.dim() == 0:
            d = abs(lp.item() - ref["lp"][act].sum().item()) / max(P["n_act"], 1)
            rec["check"] = "sum/row"
        else:
            d = (lp[act] - ref["lp"][act]).abs().max().item() if P["n_act"] else 0.0
            rec["check"] = "max|dlogp|"
        rec["logp_diff"] = d
        if h.grad is not None and w.grad is not None and ref.get("dh") is not None:
            rec["grad_relerr"] = max(relerr(h.grad, ref["dh"]), relerr(w.grad, ref["dw"]))
        else:
            rec["grad_relerr"] = None
        bad_values = not math.isfinite(d) or d > CHECK_TOL
        bad_grads = rec["grad_relerr"] is not None and not rec["grad_relerr"] <= CHECK_TOL
        if bad_values or (bad_grads and impl != "cce"):
            rec["flag"] = "MISMATCH"
        elif bad_grads:
            # cce drops gradient entries below its filter_eps by design; on flat random
            # logits that is a visible share of the gradient (cce-exact shows the exact one)
            rec["flag"] = "APPROX(grad filter)"
        else:
            rec["flag"] = ""
    rec["status"] = "ok"
    return rec, lp


# ----------------------------------------------------------------------------------------
# Outputs


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def write_md(path, meta, records, notes):
    lines = [f"# spanhead vs peers: {meta['gpu']}, {meta['date']}, commit {meta['commit']}",
             "",
             f"torch {meta['torch']}, triton {meta['triton']}, python {meta['python']}; "
             f"dtype {meta['dtype']}, forward + backward, grads of hidden and weight, "
             f"loss = sum of masked log-probs (spanhead: the general path; spanhead-onepass: "
             f"the one-pass mode, gradients in the forward's sweep).",
             ""]
    for k, v in meta["versions"].items():
        lines.append(f"- {k}: {v}")
    for k, v in meta["unavailable"].items():
        lines.append(f"- {k}: skipped: {v}")
    for k, v in sorted(meta["gemm"].items()):
        lines.append(f"- dense bf16 GEMM rate {k}: {v / 1e12:.1f} TFLOP/s")
    lines += ["",
              "speedup = this impl's ms / spanhead's ms (the general path) at the same point "
              "(> 1: spanhead is faster). peak extra = peak allocated during the timed reps "
              "beyond the inputs and the two gradient outputs. check: peer vs spanhead "
              "log-probs on active rows (max abs; sum/row for liger-sum, which returns only "
              "the sum) and gradients (relative error); MISMATCH above 5e-2.",
              "",
              "| shape | N | active | mask | impl | ms | floor ms | ratio | speedup | "
              "peak extra GiB | logp diff | grad relerr | status |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        pe = r.get("peak_extra_bytes")
        status = r.get("status", "")
        if r.get("flag"):
            status = f"{status} {r['flag']}"
        lines.append(
            f"| {r['shape']} | {r['N']} | {r['active']:.3f} | {r['mask']} | {r['impl']} | "
            f"{fmt(r.get('ms'), '.3f')} | {fmt(r.get('floor_ms'), '.3f')} | "
            f"{fmt(r.get('ratio'), '.3f')} | {fmt(r.get('speedup'), '.2f')} | "
            f"{fmt(None if pe is None else pe / GIB, '.3f')} | "
            f"{fmt(r.get('logp_diff'), '.2e')} | {fmt(r.get('grad_relerr'), '.2e')} | "
            f"{status} |")
    # per point: the fastest peer and spanhead's margin over it
    pts = {}
    for r in records:
        if r.get("ms") is None:
            continue
        pts.setdefault((r["shape"], r["N"], r["active_target"], r["mask"]), []).append(r)
    summ = []
    summ1 = []
    for key, rs in pts.items():
        sp = [r for r in rs if r["impl"] == "spanhead"]
        one = [r for r in rs if r["impl"] == "spanhead-onepass"]
        peers = [r for r in rs if not r["impl"].startswith("spanhead")]
        if not peers:
            continue
        best = min(peers, key=lambda r: r["ms"])
        two = [r for r in peers if r["impl"] not in ONE_PASS_PEERS]
        if sp:
            b2 = (f"{min(two, key=lambda r: r['ms'])['impl']} | "
                  f"{min(r['ms'] for r in two):.3f} | "
                  f"{min(r['ms'] for r in two) / sp[0]['ms']:.2f}") if two else "- | - | -"
            summ.append(f"| {key[0]} | {key[1]} | {sp[0]['active']:.3f} | {key[3]} | "
                        f"{sp[0]['ms']:.3f} | {fmt(sp[0].get('ratio'), '.3f')} | "
                        f"{best['impl']} | {best['ms']:.3f} | {best['ms'] / sp[0]['ms']:.2f} | "
                        f"{b2} |")
        if one:
            o = one[0]
            vs = f"{sp[0]['ms'] / o['ms']:.2f}" if sp else "-"
            summ1.append(f"| {key[0]} | {key[1]} | {o['active']:.3f} | {key[3]} | "
                         f"{o['ms']:.3f} | {fmt(o.get('ratio_onepass'), '.3f')} | {vs} | "
                         f"{best['impl']} | {best['ms']:.3f} | {best['ms'] / o['ms']:.2f} |")
    if summ:
        lines += ["", "## spanhead (general path, two passes) vs the fastest peer at each "
                  "point", "",
                  "The last three columns leave out the peers that compute their gradients "
                  "inside the forward (" + ", ".join(sorted(ONE_PASS_PEERS)) + "): they need "
                  "the upstream gradient before the forward, which the general path does not.",
                  "",
                  "| shape | N | active | mask | spanhead ms | spanhead ratio | fastest peer | "
                  "its ms | speedup | fastest peer taking the gradient after the forward | "
                  "its ms | speedup |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"] + summ
    if summ1:
        lines += ["", "## spanhead one-pass vs the fastest peer at each point", "",
                  "The loss here (sum of the masked log-probs) has an upstream gradient known "
                  "before the forward, so spanhead's one-pass mode applies, as it does for "
                  "SFT and REINFORCE losses. one-pass ratio = ms / (6 N_active H V / GEMM "
                  "rate); vs general = general-path ms / one-pass ms; speedup = peer ms / "
                  "one-pass ms.", "",
                  "| shape | N | active | mask | one-pass ms | one-pass ratio | vs general | "
                  "fastest peer | its ms | speedup |",
                  "|---|---|---|---|---|---|---|---|---|---|"] + summ1
    if notes:
        lines += ["", "## notes", ""] + [f"- {n}" for n in notes]
    Path(path).write_text("\n".join(lines) + "\n")


def write_plot(path, records):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        log(f"# plot skipped: matplotlib unavailable ({e})")
        return
    shapes = []
    for r in records:
        if (r["shape"], r["N"]) not in shapes:
            shapes.append((r["shape"], r["N"]))
    if not shapes:
        return
    n = len(shapes)
    cols = min(n, 2)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.5 * rows), squeeze=False)
    impls = [i for i in IMPLS if any(r["impl"] == i for r in records)]
    cmap = plt.get_cmap("tab10")
    for k, (shape, N) in enumerate(shapes):
        ax = axes[k // cols][k % cols]
        rs = [r for r in records if r["shape"] == shape and r["N"] == N and r.get("ms")]
        labelled = False
        for mask, ls, mk in (("response", "-", "o"), ("fragmented", ":", "s")):
            m = [r for r in rs if r["mask"] == mask or (r["mask"] == "response")
                 and mask == "fragmented" and r["active"] >= 1.0]
            if not any(r["mask"] == mask for r in m):
                continue
            for j, impl in enumerate(impls):
                pts = sorted((r["active"], r["ms"]) for r in m if r["impl"] == impl)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, marker=mk,
                            color=cmap(j), label=None if labelled else impl)
            fl = sorted({(r["active"], r["floor_ms"]) for r in m
                         if r["impl"] == "spanhead" and r.get("floor_ms")})
            if fl:
                ax.plot([p[0] for p in fl], [p[1] for p in fl], ls, color="black", lw=2,
                        label=None if labelled else "active floor")
            labelled = True
        ax.set_title(f"{shape}: H {rs[0]['H'] if rs else '?'}, V {rs[0]['V_local'] if rs else '?'}"
                     f", N {N} (solid: response, dotted: fragmented)", fontsize=9)
        ax.set_xlabel("active fraction")
        ax.set_ylabel("forward + backward ms")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for k in range(n, rows * cols):
        axes[k // cols][k % cols].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def commit_hash():
    c = os.environ.get("SPH_COMMIT")
    if c:
        return c
    try:
        r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    return "unknown"


# ----------------------------------------------------------------------------------------


def main(argv=None):
    t_start = time.monotonic()
    args = build_parser().parse_args(argv)
    if args.budget_s <= 0 or args.target_s <= 0 or args.logit_std <= 0 or args.gap < 0:
        build_parser().error("--budget-s, --target-s, --logit-std must be > 0, --gap >= 0")
    points = make_points(args)
    out = Path(args.out or os.environ.get("OUT") or
               REPO / "bench" / "results" / f"peers-{datetime.date.today().isoformat()}")
    log(f"# peers.py: {len(points)} points x {len(args.impls)} impls, budget "
        f"{args.budget_s:.0f} s, out {out}")

    try:
        import torch
    except ImportError as e:
        log(f"# torch not importable ({e}): nothing can be measured")
        if args.dry_run:
            for p in points:
                log(f"  point {p}")
            return 0
        return 2
    loaded, unavailable = load_all(args.impls)
    if args.dry_run:
        for p in points:
            log(f"  point shape {p[0]} H {p[1]} V {p[2]} N {p[3]} active {p[4]} mask {p[5]}")
        log(f"# dry run: importable {sorted(loaded)}, unavailable {unavailable}")
        return 0

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        log("# no CUDA device: use --device cpu for a harness test")
        return 2
    if cuda:
        if dev.index is None:        # set_device and the memory stats want an index
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
        props = torch.cuda.get_device_properties(dev)
        gpu = f"cuda {props.name} sm_{props.major}{props.minor} SMs={props.multi_processor_count}"
    else:
        gpu = "cpu"
    out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": gpu, "date": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": commit_hash(),
            "torch": torch.__version__, "triton": version_of("triton"),
            "python": sys.version.split()[0],
            "versions": {k: v[1] for k, v in loaded.items()},
            "unavailable": dict(unavailable), "gemm": {},
            "dtype": "bf16" if cuda else "f32"}
    _LOG.append(open(out / "peers.log", "w"))
    log(f"# {gpu}, torch {meta['torch']}, triton {meta['triton']}, commit {meta['commit']}")
    jsonl = open(out / "peers.jsonl", "w")
    records, notes = [], []
    timer = Timer(cuda)
    dead = set(unavailable)       # impls not run any more
    failures = {}                 # impl: count of non-OOM failures (2 make it dead)
    point_cost = {}
    rates = {}
    fatal = None

    def emit(rec):
        records.append(rec)
        keys = ("gpu", "date", "commit", "shape", "H", "V_local", "N", "active", "mask",
                "mode", "impl", "dtype", "ms", "floor_ms", "ratio", "peak_extra_bytes")
        obj = {k: rec.get(k) for k in keys}
        obj.update({k: v for k, v in rec.items() if k not in obj})
        for k, v in obj.items():     # strict JSON: no NaN / Infinity
            if isinstance(v, float) and not math.isfinite(v):
                obj[k] = None
                obj["nonfinite"] = obj.get("nonfinite", []) + [k]
        jsonl.write(json.dumps(obj) + "\n")
        jsonl.flush()

    for pi, (shape, H, V, N, frac, mask) in enumerate(points):
        spent = time.monotonic() - t_start
        est = max(point_cost.get(shape, 0.0), max(point_cost.values(), default=0.0) * 0.5)
        if spent + est > args.budget_s:
            left = [f"{p[0]}/N{p[3]}/{p[4]}/{p[5]}" for p in points[pi:]]
            notes.append(f"budget {args.budget_s:.0f} s spent after {spent:.0f} s: "
                         f"{len(left)} points not run ({', '.join(left)})")
            log(f"# {notes[-1]}")
            break
        t_pt = time.monotonic()
        log(f"# point {pi + 1}/{len(points)}: {shape} H {H} V {V} N {N} active {frac} "
            f"{mask} (t = {spent:.0f} s)")
        try:
            P = make_inputs(H, V, N, frac, mask, args, dev)
        except Exception as e:  # noqa: BLE001
            notes.append(f"{shape} N {N}: inputs could not be built ({type(e).__name__}: {e})")
            log(f"# {notes[-1]}")
            if cuda:
                torch.cuda.empty_cache()
            continue
        n_act = P["n_act"]
        rkey = (shape, N)
        if rkey not in rates:
            try:
                rates[rkey] = gemm_rate(P["h"].detach(), P["w"].detach(), timer)
                meta["gemm"][f"{shape} N {N} ({N}x{H} @ {H}x{V})"] = rates[rkey]
                log(f"#   dense GEMM {rates[rkey] / 1e12:.1f} TFLOP/s")
            except Exception as e:  # noqa: BLE001
                rates[rkey] = None
                notes.append(f"{shape} N {N}: GEMM rate failed ({type(e).__name__}: {e})")
            if cuda:
                torch.cuda.empty_cache()
        rate = rates[rkey]
        floor_ms = 8.0 * n_act * H * V / rate * 1e3 if rate else None
        base = {"gpu": gpu, "date": meta["date"], "commit": meta["commit"], "shape": shape,
                "H": H, "V_local": V, "N": N, "active": n_act / N, "active_target": frac,
                "n_active": n_act, "mask": mask, "mode": "general", "dtype": "bf16" if cuda
                else "f32", "floor_ms": floor_ms}
        ref = None
        sp_ms = None
        # spanhead first (the reference of the checks), then eager (the reference without
        # spanhead), then spanhead-onepass, then the peers
        first = ("spanhead", "torch-eager", "spanhead-onepass")
        order = [i for i in first if i in args.impls] + \
                [i for i in args.impls if i not in first]
        for impl in order:
            rec = dict(base, impl=impl)
            if impl in dead:   # listed once in the header with the reason, no rows
                continue
            try:
                step = make_step(impl, loaded, P)
                r, lp = measure(impl, step, P, ref, timer, args, cuda)
                rec.update(r)
                rec["ratio"] = rec["ms"] / floor_ms if floor_ms else None
                if impl == "spanhead-onepass":
                    rec["mode"] = "one-pass"
                    rec["floor_onepass_ms"] = 0.75 * floor_ms if floor_ms else None
                    rec["ratio_onepass"] = rec["ms"] / (0.75 * floor_ms) if floor_ms else None
                # the checks' reference: spanhead, else the first of eager / one-pass run
                if impl == "spanhead" or (ref is None and impl in ("torch-eager",
                                                                   "spanhead-onepass")):
                    ref = {"lp": lp.float(), "dh": P["h"].grad, "dw": P["w"].grad,
                           "impl": impl}
                    if impl == "spanhead":
                        sp_ms = rec["ms"]
                rec["speedup"] = rec["ms"] / sp_ms if sp_ms else None
                if ref is not None and ref["impl"] != "spanhead" and impl != ref["impl"]:
                    rec["check_ref"] = ref["impl"]
                del lp
            except Exception as e:  # noqa: BLE001 - a failing peer is skipped, never fatal
                oom = cuda and is_oom(e)
                text = str(e).strip().splitlines()[0] if str(e).strip() else ""
                if not text:     # a bare assert: say where
                    fr = traceback.extract_tb(e.__traceback__)[-1]
                    text = f"at {Path(fr.filename).name}:{fr.lineno}: {fr.line}"
                msg = ("OOM" if oom else f"failed: {type(e).__name__}: {text}")[:300]
                rec.update(ms=None, ratio=None, peak_extra_bytes=None, status=msg)
                log(f"#   {impl}: {msg}")
                if not oom:
                    tb = traceback.format_exc().strip().splitlines()
                    log("#     " + "\n#     ".join(tb[-6:]))
                    failures[impl] = failures.get(impl, 0) + 1
                    if failures[impl] >= 2:   # a bug in the call: don't repeat it everywhere
                        dead.add(impl)
                        unavailable[impl] = f"failed twice, last: {msg}"
                P["h"].grad = P["w"].grad = None
                if cuda and not cuda_alive():
                    fatal = f"CUDA context unusable after {impl} at {shape} N {N}: {msg}"
            finally:
                step = None
            emit(rec)
            if rec.get("ms") is not None:
                log(f"#   {impl:16s} {rec['ms']:9.3f} ms  ratio {fmt(rec.get('ratio'), '.3f')}"
                    f"  speedup {fmt(rec.get('speedup'), '.2f')}  peak extra "
                    f"{fmt(None if rec.get('peak_extra_bytes') is None else rec['peak_extra_bytes'] / GIB, '.3f')} GiB"
                    f"  diff {fmt(rec.get('logp_diff'), '.1e')} grad {fmt(rec.get('grad_relerr'), '.1e')}"
                    f" {rec.get('flag', '')}")
            if cuda and fatal is None:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            if fatal:
                break
        ref = P = None
        if cuda and fatal is None:
            torch.cuda.empty_cache()
        point_cost[shape] = max(point_cost.get(shape, 0.0), time.monotonic() - t_pt)
        meta["unavailable"] = dict(unavailable)
        write_md(out / "peers.md", meta, records, notes)
        if fatal:
            notes.append(fatal)
            log(f"# {fatal}: stopping")
            break
    jsonl.close()
    meta["unavailable"] = dict(unavailable)
    notes.append(f"run took {time.monotonic() - t_start:.0f} s")
    write_md(out / "peers.md", meta, records, notes)
    try:
        write_plot(out / "peers.png", records)
    except Exception as e:  # noqa: BLE001
        log(f"# plot failed: {type(e).__name__}: {e}")
    log(f"# wrote {out / 'peers.md'}, {out / 'peers.jsonl'}, {out / 'peers.png'}")
    return 3 if fatal else 0


if __name__ == "__main__":
    sys.exit(main())
