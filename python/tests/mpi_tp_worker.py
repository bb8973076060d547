"""Run under mpirun by test_mpi.py: each rank holds a vocabulary shard of the LM head, the
spanhead communicator comes from mpi4py, and the sharded forward/backward must equal the
float64 reference over the whole vocabulary. Exit 0 on success."""

import sys

import numpy as np
from mpi4py import MPI

import spanhead
from reference import close, head_ref


def torch_check(sc, h, w, t, mask, g, e, v0, v1, V, rank):
    """spanhead.torch.logprobs with tp_group=<spanhead.Comm>: the shard's autograd gradients
    against torch's dense float64 computation over the whole vocabulary."""
    try:
        import torch
    except ImportError:
        return
    import spanhead.torch as sht
    ht = torch.from_numpy(h).requires_grad_(True)
    wl = torch.from_numpy(np.ascontiguousarray(w[v0:v1])).requires_grad_(True)
    tt = torch.from_numpy(t)
    mt = torch.from_numpy(mask.astype(bool))
    o = sht.logprobs(ht, wl, tt, loss_mask=mt, temperature=0.8, entropy=True, tp_group=sc,
                     vocab_start=v0, vocab_total=V, threads=1)
    gt, et = torch.from_numpy(g), torch.from_numpy(e)
    ((o.logprob * gt).sum() + (o.entropy * et).sum()).backward()
    hd = torch.from_numpy(h).double().requires_grad_(True)
    wd = torch.from_numpy(w).double().requires_grad_(True)
    lsm = torch.log_softmax(hd @ wd.T / 0.8, -1)
    m = mt.double() * (tt >= 0).double()
    lp = lsm.gather(-1, tt.clamp(min=0).unsqueeze(-1)).squeeze(-1) * m
    ent = -(lsm.exp() * lsm).sum(-1) * mt.double()
    ((lp * gt.double()).sum() + (ent * et.double()).sum()).backward()
    tol = 2e-5
    close(f"rank {rank} torch logprob", o.logprob.detach().numpy(), lp.detach().numpy(), tol * 20)
    close(f"rank {rank} torch dhidden", ht.grad.numpy(), hd.grad.numpy(),
          tol * max(1, hd.grad.abs().max().item()))
    close(f"rank {rank} torch dweight", wl.grad.numpy(), wd.grad[v0:v1].numpy(),
          tol * max(1, wd.grad.abs().max().item()))


def topk_check(ctx, sc, h, w, wl, t, mask, v0, V, rank):
    """Issue 25's top-k and sum_p2 over the TP group (NumPy and torch): every rank holds the
    merged lists, equal to a float64 sort over the whole vocabulary (ids where the gaps to
    both neighbours exceed the tolerance), and sum p^2 of the whole distribution."""
    K = 40  # above some ranks' share of the top
    r = spanhead.head_forward(h, wl, t, vocab_start=v0, vocab_total=V, temperature=0.8,
                              active_mask=mask, topk=K, sum_p2=True, context=ctx)
    z = h.astype(np.float64) @ w.astype(np.float64).T / 0.8
    lse = z.max(1) + np.log(np.exp(z - z.max(1, keepdims=True)).sum(1))
    order = np.argsort(-z, axis=1, kind="stable")  # equal z: the lower id first
    ref = np.take_along_axis(z, order, 1) - lse[:, None]
    a = mask.astype(bool)
    close(f"rank {rank} topk_logprobs", r.topk_logprobs[a], ref[a, :K], 2e-5 * 30)
    gap = 1e-4
    sep = np.ones((a.sum(), K), bool)
    sep[:, 1:] &= (ref[a, :K - 1] - ref[a, 1:K]) > gap
    sep &= (ref[a, :K] - ref[a, 1:K + 1]) > gap
    bad = ((r.topk_ids[a] != order[a, :K]) & sep).sum()
    assert bad == 0, f"rank {rank}: {bad} top-k ids differ at separated ranks"
    assert np.all(r.topk_ids[~a] == -1) and np.all(r.topk_logprobs[~a] == 0)
    p = np.exp(z - lse[:, None])
    close(f"rank {rank} sum_p2", r.sum_p2, np.where(a, (p * p).sum(1), 0), 2e-5)
    try:
        import torch
    except ImportError:
        return
    import spanhead.torch as sht
    o = sht.logprobs(torch.from_numpy(h), torch.from_numpy(wl), torch.from_numpy(t),
                     loss_mask=torch.from_numpy(a), temperature=0.8, topk=K,
                     tp_group=sc, vocab_start=v0, vocab_total=V, threads=1)
    assert np.array_equal(o.topk_ids.numpy(), r.topk_ids), f"rank {rank}: torch top-k ids"
    assert np.array_equal(o.topk_logprobs.numpy(), r.topk_logprobs), f"rank {rank}: torch lp"


def main():
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    seed = int(sys.argv[1])
    rng = np.random.default_rng(seed)  # same inputs on every rank
    N, H, V = 37, 12, 101
    h = rng.standard_normal((N, H)).astype(np.float32)
    w = (rng.standard_normal((V, H)) * 0.7).astype(np.float32)
    t = rng.integers(0, V, N).astype(np.int64)
    t[::6] = -100
    mask = (rng.random(N) < 0.7).astype(np.uint8)
    g, e = rng.standard_normal((2, N)).astype(np.float32)
    bounds = np.linspace(0, V, size + 1).astype(int)  # uneven shards when size does not divide V
    v0, v1 = int(bounds[rank]), int(bounds[rank + 1])
    sc = spanhead.Comm.from_mpi4py(comm, vocab_total=V, vocab_start=v0, vocab_local=v1 - v0,
                                   dtype="float32", temperature=0.8)
    backend, crank, csize = sc.info()
    assert (backend, crank, csize) == ("mpi", rank, size), sc.info()
    ctx = spanhead.Context("cpu", comm=sc, threads=1)
    wl = np.ascontiguousarray(w[v0:v1])
    r = spanhead.head_forward(h, wl, t, vocab_start=v0, vocab_total=V, temperature=0.8,
                              active_mask=mask, entropy=True, lse=True, context=ctx)
    ref = head_ref(h, w, t, temperature=0.8, active=mask.astype(bool), g=g, e=e)
    tol = 2e-5
    for k in ("logprob", "entropy", "lse"):
        close(f"rank {rank} {k}", r[k], ref[k], tol * max(1, np.abs(ref[k]).max()))
    topk_check(ctx, sc, h, w, wl, t, mask, v0, V, rank)
    b = spanhead.head_backward(h, wl, t, stats=r.stats, dlogprob=g, dentropy=e,
                               vocab_start=v0, vocab_total=V, temperature=0.8,
                               active_mask=mask, grad_dtype="float32", allreduce_dhidden=True,
                               context=ctx)
    s = max(1, np.abs(ref["dhidden"]).max())
    close(f"rank {rank} dhidden (all-reduced)", b.dhidden, ref["dhidden"], tol * s)
    close(f"rank {rank} dweight (shard)", b.dweight, ref["dweight"][v0:v1],
          tol * max(1, np.abs(ref["dweight"]).max()))
    torch_check(sc, h, w, t, mask, g, e, v0, v1, V, rank)
    # a rank disagreeing on the configuration: every rank gets MismatchError
    try:
        spanhead.Comm.from_mpi4py(comm, vocab_total=V + (rank == 0), vocab_start=v0,
                                  vocab_local=v1 - v0)
    except spanhead.MismatchError:
        pass
    else:
        raise AssertionError(f"rank {rank}: a mismatched configuration was accepted")
    ctx.close()
    comm.Barrier()
    if rank == 0:
        print(f"mpi tp ok: {size} ranks, seed {seed}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # report, then make every rank stop
        print(f"rank {MPI.COMM_WORLD.Get_rank()}: {type(exc).__name__}: {exc}", flush=True)
        MPI.COMM_WORLD.Abort(1)
