"""peers.py, part: one timed training step per implementation (the peers' calls, padding and
compaction plans)."""

import inspect
import os

from .common import CUTE_PEERS, PeerSkip, QUACK_ROW_ALIGN, QUACK_SE_ALIGN, SEQ, TRITON_PEERS


# ----------------------------------------------------------------------------------------
# Steps


def policy_loss_torch(lp, maskf, adv, old, n_act, clip_low, clip_high):
    """Issue 14's ppo loss, token-mean: pg_i = max(-A r, -A clip(r, 1-el, 1+eh)), r =
    exp(clamp(logp - old, -20, 20)), L = sum_i m_i pg_i / T."""
    import torch
    r = torch.exp(torch.clamp(lp - old, -20.0, 20.0))
    pg = torch.maximum(-adv * r, -adv * torch.clamp(r, 1.0 - clip_low, 1.0 + clip_high))
    return (pg * maskf).sum() / max(n_act, 1)


def pad_rows(n, align, avoid=None):
    """n rounded up to a multiple of align; plus one more align step while the result
    collides with `avoid` (a callable rows -> bool)."""
    m = -(-max(n, 1) // align) * align
    while avoid is not None and avoid(m):
        m += align
    return m


def quack_plan(impl, P, args, info):
    """(rows M, chunk, scaled-exp?, notes) for a QuACK call at this point."""
    h, w = P["h"], P["w"]
    N, H = h.shape
    n = P["n_act"] if impl == "quack-compact" else N
    chunk = args.quack_chunk
    if args.quack_scaled_exp == "off" or not info["has_scaled"]:
        scaled = False
    elif args.quack_scaled_exp == "on":
        scaled = True
    else:
        sup = info["supported"]
        scaled = bool(sup(h, w, chunk, "sum")) if callable(sup) else False
    notes = []
    if scaled and chunk == H:
        # the dx GEMM of a chunk is (chunk rows) x H: quack's epilogue frontend infers its
        # per-row operand's kind from its length and raises when m == n
        chunk *= 2
        notes.append(f"chunk {chunk} (chunk == H = {H} is refused by quack's scaled-exp dx "
                     f"epilogue: m == n)")

    def last_chunk_is_h(m):
        r = m - (-(-m // chunk) - 1) * chunk
        return -(-r // QUACK_SE_ALIGN) * QUACK_SE_ALIGN == H

    M = pad_rows(n, QUACK_ROW_ALIGN, last_chunk_is_h if scaled else None)
    if scaled and impl == "quack" and M != N:
        notes.append(f"{M - N} padding rows (a last chunk of H rows is refused)")
    return M, chunk, scaled, notes


def gather_plan(P, M, compact):
    """Device row indices for the M rows a gathered peer call takes (active rows, or all N,
    padded with copies of the first one) and the index into an extended target vector whose
    last entry is -100 (padding rows ignored: no loss, zero gradient)."""
    import torch
    dev = P["h"].device
    base = P["act_idx"] if compact else torch.arange(P["h"].shape[0], device=dev)
    n = base.numel()
    if M == n:
        return base, base
    first = base[:1] if n else torch.zeros(1, dtype=torch.int64, device=dev)
    idx = torch.cat([base, first.expand(M - n)])
    tidx = torch.cat([base, torch.full((M - n,), P["h"].shape[0], dtype=torch.int64,
                                       device=dev)])
    return idx, tidx


def make_step(impl, loaded, P, args, cuda):
    """A function that runs one training step and returns what the checks compare: per-row
    log-probs (float32, N; 0 on inactive rows), their scalar sum, or (policy mode) a dict
    {"loss": scalar, "lp": per-row log-probs or None}. Also returns a dict of notes for the
    row (pipeline, padding, ...)."""
    import torch
    h, w, t, t_ign, maskd, maskf = P["h"], P["w"], P["t"], P["t_ign"], P["maskd"], P["maskf"]
    N, H = h.shape
    V = w.shape[0]
    extra = {}
    if not cuda and impl in CUTE_PEERS:
        raise PeerSkip("CuTe DSL kernels need a CUDA sm_90 device")
    if not cuda and impl in TRITON_PEERS and not os.environ.get("TRITON_INTERPRET"):
        raise PeerSkip("Triton kernels need a CUDA device (TRITON_INTERPRET=1 runs liger's "
                       "on the CPU)")

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
            raise PeerSkip("spanhead.torch.weighted_logprob_loss: not in this spanhead "
                           "package (python/spanhead/torch.py older than the one-pass loss)")
        spans = P["spans"]
        if args.mode == "policy":
            # REINFORCE weights: the same sweep as the fused policy loss, a gradient known
            # before the forward (timing reference; a different loss, so no check)
            wts = P["adv"] * maskf / max(P["n_act"], 1)
            extra["check"] = "none (REINFORCE weights: timing reference)"
        else:
            wts = P["neg_ones"]   # L = -sum(-1 * logprob) = the sum of the masked log-probs

        def run():
            out = loss_fn(h, w, t, wts, loss_mask=maskd, spans=spans, return_logprobs=True)
            out.loss.backward()
            return out.logprob if args.mode == "logprob" else {"loss": None, "lp": None}
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
    elif impl in ("quack", "quack-compact"):
        info = loaded["quack"][0]
        fn = info["fn"]
        compact = impl == "quack-compact"
        if compact and P["n_act"] == 0:
            raise PeerSkip("no active row")
        M, chunk, scaled, notes = quack_plan(impl, P, args, info)
        kw = {"chunk_size": chunk, "ignore_index": -100, "reduction": "sum"}
        if info["has_tuned"]:
            kw["tuned"] = bool(args.quack_tuned)
        if info["has_scaled"]:
            kw["use_scaled_exp"] = scaled
        extra.update(pipeline="scaled-exp" if scaled else "base", chunk=chunk,
                     pad_rows=M - (P["n_act"] if compact else N),
                     tuned=kw.get("tuned", True))
        if notes:
            extra["notes"] = "; ".join(notes)
        if compact or M != N:
            idx, tidx = gather_plan(P, M, compact)
            t_ext = torch.cat([t_ign, torch.full((1,), -100, dtype=t_ign.dtype,
                                                 device=t_ign.device)])

            def run():
                x = h.index_select(0, idx)      # the gather; its backward scatter-adds
                tt = t_ext.index_select(0, tidx)
                lp = -fn(x, w, tt, **kw)
                lp.backward()
                return lp.detach()
        else:
            def run():
                lp = -fn(h, w, t_ign, **kw)
                lp.backward()
                return lp.detach()
    elif impl in ("liger-cute", "liger-cute-compact"):
        F, tile_m, tile_n = loaded["liger-cute"][0]
        compact = impl == "liger-cute-compact"
        if compact and P["n_act"] == 0:
            raise PeerSkip("no active row")
        pad_v = V % tile_n != 0
        if pad_v and not args.liger_cute_pad:
            raise PeerSkip(f"V {V} % {tile_n} != 0: liger's SM90 CuTe FLCE rejects it "
                           f"(--liger-cute-pad pads the vocabulary)")
        n = P["n_act"] if compact else N
        M = pad_rows(n, tile_m)
        extra.update(pad_rows=M - n)
        if pad_v:
            Vp = pad_rows(V, tile_n)
            extra["notes"] = (f"vocabulary padded {V} -> {Vp} (rows of logit -30000 through "
                              f"one extra hidden column of ones)")
            zcol = torch.zeros(V, 1, dtype=w.dtype, device=w.device)
            prow = torch.zeros(Vp - V, H + 1, dtype=w.dtype, device=w.device)
            prow[:, H] = -30000.0

            def widen(x, ww):
                xa = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)], 1)
                wa = torch.cat([torch.cat([ww, zcol], 1), prow], 0)
                return xa, wa
        else:
            def widen(x, ww):
                return x, ww
        if compact or M != N:
            idx, tidx = gather_plan(P, M, compact)
            t_ext = torch.cat([t_ign, torch.full((1,), -100, dtype=t_ign.dtype,
                                                 device=t_ign.device)])

            def run():
                x, ww = widen(h.index_select(0, idx), w)
                tt = t_ext.index_select(0, tidx)
                lp = -F.apply(x, ww, tt, -100, "sum")
                lp.backward()
                return lp.detach()
        else:
            def run():
                x, ww = widen(h, w)
                lp = -F.apply(x, ww, t_ign, -100, "sum")
                lp.backward()
                return lp.detach()
    elif impl == "spanhead+torch":
        sht = loaded["spanhead"][0]
        spans = P["spans"]

        def run():
            lp = sht.logprobs(h, w, t, loss_mask=maskd, spans=spans)
            loss = policy_loss_torch(lp, maskf, P["adv"], P["old"], P["n_act"],
                                     args.clip_low, args.clip_high)
            loss.backward()
            return {"loss": loss.detach(), "lp": lp.detach()}
    elif impl == "spanhead-policy":
        sht = loaded["spanhead"][0]
        pl = getattr(sht, "policy_loss", None)
        if pl is None:
            raise PeerSkip("spanhead.torch.policy_loss: not in this spanhead package (issue "
                           "14's fused policy loss has not landed in this tree)")
        kw = {"loss_mask": maskd, "loss_type": "ppo", "clip_low": args.clip_low,
              "clip_high": args.clip_high, "agg": "token-mean"}
        if "spans" in inspect.signature(pl).parameters:   # exact host spans, as logprobs
            kw["spans"] = P["spans"]

        def run():
            out = pl(h, w, t, P["adv"], P["old"], **kw)
            loss, lp = out[0], out[1]
            loss.backward()
            return {"loss": loss.detach(), "lp": None if lp is None else lp.detach()}
    elif impl == "torch-eager-policy":
        def run():
            z = (h @ w.T).float()
            lp = torch.log_softmax(z, -1).gather(1, t.unsqueeze(1)).squeeze(1) * maskf
            del z
            loss = policy_loss_torch(lp, maskf, P["adv"], P["old"], P["n_act"],
                                     args.clip_low, args.clip_high)
            loss.backward()
            return {"loss": loss.detach(), "lp": lp.detach()}
    elif impl == "liger-grpo":
        G = loaded["liger-grpo"][0]
        if N % SEQ:
            raise PeerSkip(f"N {N} is not a multiple of {SEQ}: liger's GRPO loss takes a "
                           f"(batch, {SEQ}) layout")
        if P["adv_seq"] is None:
            raise PeerSkip("advantages are not per 2048-row sequence at this mask")
        B = N // SEQ
        # dapo: sum over active tokens / active tokens = token-mean; no KL, no reference model
        mod = G(beta=0.0, compiled=cuda, use_ref_model=False, chunk_size=1,
                epsilon_low=args.clip_low, epsilon_high=args.clip_high, loss_type="dapo")
        extra["notes"] = f"loss_type dapo, beta 0, chunk_size 1 (one {SEQ}-row sequence), " \
                         f"compiled {cuda}"
        t2, m2, old2 = t.view(B, SEQ), maskf.view(B, SEQ), P["old"].view(B, SEQ)

        def run():
            out = mod(h.view(B, SEQ, H), w, t2, m2, P["adv_seq"], old_per_token_logps=old2)
            loss = out[0] if isinstance(out, (tuple, list)) else out
            loss.backward()
            return {"loss": loss.detach(), "lp": None}
    else:
        raise ValueError(f"impl {impl}")

    def step():
        h.grad = None
        w.grad = None
        return run()

    return step, extra
