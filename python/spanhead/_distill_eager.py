"""A plain-torch (eager, logits materialized) implementation of spanhead's distillation
losses, from the formulas of docs/distill.md: the tests' independent oracle (in float64) and
the benchmark's eager baseline (chunked over rows so that the logits of one chunk at a time
are materialized). Gradients come from torch's autograd of these formulas."""

from __future__ import annotations

from typing import Optional

import torch


def _terms(kind: str, beta: float, lq: torch.Tensor, lp: torch.Tensor) -> torch.Tensor:
    """The loss terms of bins with student / teacher log-masses lq, lp (lp = -inf: P = 0)."""
    if kind == "jsd" and beta == 0:
        kind = "forward_kl"
    if kind == "jsd" and beta == 1:
        kind = "reverse_kl"
    q, p = lq.exp(), lp.exp()
    zero = torch.zeros((), dtype=lq.dtype, device=lq.device)
    if kind == "forward_kl":
        return torch.where(p > 0, p * (lp - lq), zero)
    if kind == "reverse_kl":
        return torch.where(q > 0, q * (lq - lp), zero)
    lm = torch.logaddexp(lp + torch.log(torch.tensor(beta, dtype=lq.dtype)),
                         lq + torch.log1p(torch.tensor(-beta, dtype=lq.dtype)))
    tp = torch.where(p > 0, beta * p * (lp - lm), zero)
    return tp + (1 - beta) * q * (lq - lm)


def distill_rows(hidden, weight, *, teacher_hidden=None, teacher_weight=None,
                 teacher_topk_ids=None, teacher_topk_logprobs=None, kind="forward_kl",
                 beta=0.5, temperature=1.0, teacher_temperature=None, softcap=0.0):
    """Per-row losses (N,) of 2-d inputs (every row), differentiable to hidden / weight.
    temperature, teacher_temperature: a number or an (N,) tensor of per-row temperatures."""
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.to(hidden.dtype).reshape(-1, 1)
    u = hidden @ weight.T
    if softcap:
        u = softcap * torch.tanh(u / softcap)
    lq = torch.log_softmax(u / temperature, dim=-1)
    if teacher_hidden is not None:
        if isinstance(teacher_temperature, torch.Tensor):  # one per row
            tt = teacher_temperature.to(hidden.dtype).reshape(-1, 1)
        else:
            tt = teacher_temperature or temperature
        lp = torch.log_softmax((teacher_hidden @ teacher_weight.T) / tt, dim=-1).detach()
        return _terms(kind, beta, lq, lp).sum(-1)
    ids = teacher_topk_ids.long()
    tlp = teacher_topk_logprobs.to(lq.dtype)
    valid = ids >= 0
    safe = torch.where(valid, ids, torch.zeros_like(ids))
    lqk = lq.gather(1, safe)
    V = lq.shape[1]
    # scatter_add: a padding entry (id 0 as a placeholder) must not unmark a listed id 0
    listed = torch.zeros(lq.shape, dtype=torch.int32, device=lq.device).scatter_add(
        1, safe, valid.int()) > 0
    ninf = torch.tensor(float("-inf"), dtype=lq.dtype)
    lqr = torch.logsumexp(torch.where(listed, ninf, lq), dim=1)
    psum = torch.where(valid, tlp.exp(), torch.zeros_like(tlp)).sum(1)
    pr = torch.clamp(1 - psum, min=0)
    rev = kind == "reverse_kl" or (kind == "jsd" and beta == 1)
    has_tail = (valid.sum(1) < V) & ~(torch.tensor(rev) & (pr == 0))
    lpr = torch.where(pr > 0, torch.log(torch.where(pr > 0, pr, torch.ones_like(pr))), ninf)
    tk = torch.where(valid, _terms(kind, beta, lqk, tlp), torch.zeros_like(lqk)).sum(1)
    tr = _terms(kind, beta, torch.where(has_tail, lqr, torch.zeros_like(lqr)), lpr)
    return tk + torch.where(has_tail, tr, torch.zeros_like(tr))


def distill_eager(hidden, weight, *, loss_mask=None, reduction="mean", chunk_rows: Optional[int] = None,
                  **kw):
    """The reduced loss (mean over active rows, sum, or none: (N,), 0 on inactive rows).
    chunk_rows: compute the rows chunk by chunk (each chunk's logits materialized once)."""
    N = hidden.shape[0]
    act = (torch.ones(N, dtype=torch.bool, device=hidden.device) if loss_mask is None
           else loss_mask.bool())
    R = chunk_rows or N
    parts = []
    for c0 in range(0, N, R):
        sl = slice(c0, c0 + R)
        rowwise = ("teacher_hidden", "teacher_topk_ids", "teacher_topk_logprobs", "temperature",
                   "teacher_temperature")
        t = {k: (v[sl] if k in rowwise and isinstance(v, torch.Tensor) else v)
             for k, v in kw.items()}
        parts.append(distill_rows(hidden[sl], weight, **t))
    rows = torch.cat(parts) if len(parts) > 1 else parts[0]
    rows = torch.where(act, rows, torch.zeros_like(rows))
    if reduction == "none":
        return rows
    s = rows.sum()
    if reduction == "sum":
        return s
    n = act.sum()
    return s / n.clamp(min=1)
