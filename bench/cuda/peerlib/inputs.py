"""peers.py, part: the timer, the GEMM rate, masks (response, fragmented, packed-RL), inputs
and one measurement."""

import math
import time

from .common import CHECK_TOL, FRAG_RUN, POLICY_LOSS_TOL, SEQ


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
    """Host uint8 mask, as spanhead bench builds it (response, fragmented)."""
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


_M64 = (1 << 64) - 1


def _splitmix(state):
    """(new state, output) of splitmix64, as src/cli/cmd_bench.c's splitmix."""
    s = (state + 0x9E3779B97F4A7C15) & _M64
    z = s
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return s, z ^ (z >> 31)


def _lognormal_len(state, med, sigma, lo, hi):
    state, a = _splitmix(state)
    state, b = _splitmix(state)
    u1 = ((a >> 11) + 1.0) * 2.0 ** -53
    u2 = (b >> 11) * 2.0 ** -53
    x = med * math.exp(sigma * math.sqrt(-2.0 * math.log(u1)) *
                       math.cos(6.283185307179586 * u2))
    if x < lo:
        return state, lo
    if x > hi:
        return state, hi
    return state, int(math.floor(x + 0.5))      # llround of a positive value


def packed_rl_batch(T, seed):
    """The sequences of spanhead bench's packed-rl batch of T tokens (TP1/CP1: no padding):
    prompt lengths log-normal, median 512, sigma 1, in [32, 4096]; response lengths median 768,
    sigma 1, in [16, 8192]; drawn until T tokens are full, the last truncated. Returns
    (lengths, prompt lengths) exactly as cmd_bench.c's packed_rl_mask draws them."""
    st, z = _splitmix(seed & _M64)
    st = z ^ (T & _M64)
    lens, prompts, filled = [], [], 0
    while filled < T:
        st, p = _lognormal_len(st, 512, 1.0, 32, 4096)
        st, r = _lognormal_len(st, 768, 1.0, 16, 8192)
        ln = p + r
        if ln > T - filled:
            ln = T - filled
        lens.append(ln)
        prompts.append(min(p, ln))
        filled += ln
    return lens, prompts


def packed_rl_mask(N, seed, gap):
    """(host uint8 mask, spans, how) of the packed-rl batch of N tokens: the rows whose next
    token is a response token. Through the library's own metadata (spanhead.meta.spans, as
    spanhead bench) when the binding is importable, else the same rows computed here
    (TP1/CP1 lays the sequences end to end)."""
    import numpy as np
    lens, prompts = packed_rl_batch(N, seed)
    loss = np.zeros(N, dtype=np.uint8)
    c0 = 0
    for ln, p in zip(lens, prompts):
        loss[c0 + p - 1:c0 + ln - 1] = 1      # loss column c - 1 is token column c
        c0 += ln
    try:
        import spanhead.meta as sm
    except Exception:  # noqa: BLE001 - binding absent: the rows computed here
        return loss, spans_of(loss, gap), "python"
    doc = {"layout": "packed", "sequence_length": N, "num_actions": N - 1,
           "loss_mask": [loss[:N - 1].tolist()], "sub_seq_lengths": [lens]}
    r = sm.spans(doc, tp=1, cp=1, cp_rank=0, gap=gap, full=True)
    if r["local_rows"] != N:
        raise ValueError(f"packed-rl: rank 0 holds {r['local_rows']} rows, expected {N}")
    mask = np.asarray(r["local_mask"], dtype=np.uint8)
    return mask, np.asarray(r["spans"], dtype=np.int64).reshape(-1, 2), "spanhead.meta.spans"


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
    how = None
    if pattern == "packed-rl":
        mask, spans, how = packed_rl_mask(N, args.packed_seed, args.gap)
    else:
        mask = build_mask(N, frac, pattern)
        try:
            import spanhead
            spans = spanhead.spans_from_mask(mask, args.gap)
        except Exception:  # noqa: BLE001 - spanhead absent: the same coalescing here
            spans = spans_of(mask, args.gap)
    maskd = torch.from_numpy(mask.astype(np.bool_)).to(dev)
    P = {"h": h.requires_grad_(True), "w": w.requires_grad_(True), "t": t,
         "t_ign": torch.where(maskd, t, torch.full_like(t, -100)),
         "maskd": maskd, "maskf": maskd.float(), "spans": spans, "mask_how": how,
         "act_idx": torch.from_numpy(np.flatnonzero(mask).astype(np.int64)).to(dev),
         "neg_ones": torch.full((N,), -1.0, device=dev, dtype=torch.float32),
         "n_act": int(mask.sum())}
    if args.mode == "policy":
        # advantages per 2048-row sequence (GRPO: one per sampled response), old log-probs
        # near the current ones so that some ratios clip
        nseq = -(-N // SEQ)
        adv_seq = torch.randn(nseq, device=dev, generator=g, dtype=torch.float32)
        P["adv"] = adv_seq.repeat_interleave(SEQ)[:N].contiguous()
        P["adv_seq"] = adv_seq if N % SEQ == 0 else None
        with torch.no_grad():
            lp = torch.empty(N, device=dev, dtype=torch.float32)
            for i in range(0, N, 4096):
                z = (h[i:i + 4096] @ w.T).float()
                lp[i:i + 4096] = torch.log_softmax(z, -1).gather(
                    1, t[i:i + 4096].unsqueeze(1)).squeeze(1)
                del z
            noise = torch.randn(N, device=dev, generator=g, dtype=torch.float32)
            P["old"] = ((lp + args.old_noise * noise) * P["maskf"]).contiguous()
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


def split_out(out):
    """(per-row log-probs or their sum or None, policy loss or None) of a step's return."""
    if isinstance(out, dict):
        return out.get("lp"), out.get("loss")
    return out, None


def measure(impl, step, P, ref, timer, args, cuda):
    """One impl at one point: dict with ms, reps, first_call_s, peak_extra_bytes, checks,
    status; and what the step returned (for the checks' reference)."""
    import torch
    h, w = P["h"], P["w"]
    rec = {"impl": impl}
    t0 = time.perf_counter()
    step()
    timer.sync()
    rec["first_call_s"] = time.perf_counter() - t0
    for _ in range(args.warmup - 1):
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
    ts, out = timer.many(step, reps)
    if cuda:
        peak = torch.cuda.max_memory_allocated()
        rec["peak_extra_bytes"] = max(0, int(peak - base - grad_bytes))
        rec["peak_bytes_raw"] = int(peak - base)
    else:
        rec["peak_extra_bytes"] = None
    rec["ms"] = median(ts)
    rec["ms_min"] = min(ts)
    rec["reps"] = reps
    lp, loss = split_out(out)
    lp = None if lp is None else lp.detach()
    act = P["maskd"]
    rec["grad_relerr"] = None
    if ref is not None:
        checked = False
        bad = False
        if loss is not None and ref.get("loss") is not None:
            d = abs(float(loss) - float(ref["loss"]))
            rec["loss_diff"] = d
            bad |= not math.isfinite(d) or d > POLICY_LOSS_TOL
            checked = True
        if lp is not None and ref.get("lp") is not None:
            if lp.dim() == 0:
                d = abs(lp.item() - ref["lp"][act].sum().item()) / max(P["n_act"], 1)
                rec["check"] = "sum/row"
            else:
                d = (lp[act] - ref["lp"][act]).abs().max().item() if P["n_act"] else 0.0
                rec["check"] = "max|dlogp|"
            rec["logp_diff"] = d
            bad |= not math.isfinite(d) or d > CHECK_TOL
            checked = True
        if checked and h.grad is not None and w.grad is not None and ref.get("dh") is not None:
            rec["grad_relerr"] = max(relerr(h.grad, ref["dh"]), relerr(w.grad, ref["dw"]))
        bad_grads = rec["grad_relerr"] is not None and not rec["grad_relerr"] <= CHECK_TOL
        if bad or (bad_grads and impl != "cce"):
            rec["flag"] = "MISMATCH"
        elif bad_grads:
            # cce drops gradient entries below its filter_eps by design; on flat random
            # logits that is a visible share of the gradient (cce-exact shows the exact one)
            rec["flag"] = "APPROX(grad filter)"
        else:
            rec["flag"] = ""
    rec["status"] = "ok"
    return rec, lp, loss
