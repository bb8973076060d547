"""spanhead.torch.distill_loss and spanhead.distill_loss (CPU) against the same losses written
in plain torch (spanhead/_distill_eager.py: logits materialized, autograd) in float64: values
and gradients for every kind (jsd 0.3 and its special cases), dense and sparse teachers
(padding, a tail of mass 0), reductions (none with a non-uniform incoming gradient), masks,
temperatures (the student's and the dense teacher's, scalar and per row), softcap, bf16 inputs; the NumPy entry point against the reference kernels;
errors. The CUDA half is test_distill_cuda.py."""

import numpy as np
import pytest

import spanhead

torch = pytest.importorskip("torch")
import spanhead.torch as st  # noqa: E402
from spanhead._distill_eager import distill_eager  # noqa: E402

KINDS = (("forward_kl", 0.5), ("reverse_kl", 0.5), ("jsd", 0.3), ("jsd", 0.0), ("jsd", 1.0))


def case(rng, N=23, H=12, V=41, HT=9, K=6, dense=True, tail0=False):
    h = rng.standard_normal((N, H)).astype(np.float32)
    w = (rng.standard_normal((V, H)) * 1.5 / H ** 0.5).astype(np.float32)
    mask = (rng.random(N) < 0.7).astype(np.uint8)
    mask[0] = 1
    if dense:
        th = rng.standard_normal((N, HT)).astype(np.float32)
        tw = (rng.standard_normal((V, HT)) * 2 / HT ** 0.5).astype(np.float32)
        return h, w, mask, dict(teacher_hidden=th, teacher_weight=tw)
    z = rng.standard_normal((N, V)) * 2
    lp = z - np.log(np.exp(z).sum(1, keepdims=True))
    ids = np.argsort(-lp, 1)[:, :K].copy()
    tl = np.take_along_axis(lp, ids, 1)
    if tail0:
        tl = tl - np.log(np.exp(tl).sum(1, keepdims=True)) + 2e-6
    ids[:, 2] = -1
    return h, w, mask, dict(teacher_topk_ids=ids.astype(np.int64),
                            teacher_topk_logprobs=tl.astype(np.float32))


def t64(x):
    return torch.tensor(x).double() if np.asarray(x).dtype.kind == "f" else torch.tensor(x)


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("kind,beta", KINDS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_torch_vs_eager(rng, dense, kind, beta, reduction):
    h, w, mask, teacher = case(rng, dense=dense, tail0=(not dense and beta == 1.0))
    T, TT = (0.8, 1.6) if dense else (1.3, None)
    H = torch.tensor(h, requires_grad=True)
    W = torch.tensor(w, requires_grad=True)
    tt = {k: torch.tensor(v) for k, v in teacher.items()}
    got = st.distill_loss(H, W, loss_mask=torch.tensor(mask), kind=kind, beta=beta,
                          temperature=T, teacher_temperature=TT, reduction=reduction, **tt)
    H64 = torch.tensor(h).double().requires_grad_(True)
    W64 = torch.tensor(w).double().requires_grad_(True)
    want = distill_eager(H64, W64, loss_mask=torch.tensor(mask), kind=kind, beta=beta,
                         temperature=T, teacher_temperature=TT, reduction=reduction,
                         **{k: t64(v) for k, v in teacher.items()})
    g = torch.linspace(0.5, 1.5, h.shape[0]) if reduction == "none" else torch.tensor(0.7)
    (got * g).sum().backward()
    (want * g.double()).sum().backward()
    assert got.shape == want.shape
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=2e-5, atol=1e-6)
    for a, b in ((H.grad, H64.grad), (W.grad, W64.grad)):
        scale = b.abs().max().item()
        assert scale > 1e-6
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=2e-5 * scale)


def test_softcap_and_bf16(rng):
    h, w, mask, teacher = case(rng, dense=False)
    H = torch.tensor(h).bfloat16().requires_grad_(True)
    W = torch.tensor(w).bfloat16().requires_grad_(True)
    tt = {k: torch.tensor(v) for k, v in teacher.items()}
    got = st.distill_loss(H, W, kind="jsd", beta=0.4, softcap=3.0, **tt)
    got.backward()
    H64 = H.detach().double().requires_grad_(True)
    W64 = W.detach().double().requires_grad_(True)
    want = distill_eager(H64, W64, kind="jsd", beta=0.4, softcap=3.0,
                         **{k: t64(v) for k, v in teacher.items()})
    want.backward()
    assert abs(got.item() - want.item()) <= 1e-4 * abs(want.item()) + 1e-6
    for a, b in ((H.grad, H64.grad), (W.grad, W64.grad)):
        np.testing.assert_allclose(a.double().numpy(), b.numpy(), rtol=2e-2,
                                   atol=2e-2 * b.abs().max().item())


def test_leading_dims_and_no_grad(rng):
    h, w, mask, teacher = case(rng, N=12, dense=True)
    H = torch.tensor(h).reshape(3, 4, -1)
    tt = {k: (torch.tensor(v).reshape(3, 4, -1) if k == "teacher_hidden" else torch.tensor(v))
          for k, v in teacher.items()}
    with torch.no_grad():
        rows = st.distill_loss(H, torch.tensor(w), reduction="none", **tt)
    assert rows.shape == (3, 4)
    want = distill_eager(torch.tensor(h).double(), torch.tensor(w).double(), reduction="none",
                         **{k: t64(v) for k, v in teacher.items()})
    np.testing.assert_allclose(rows.reshape(-1).numpy(), want.numpy(), rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("dense", [True, False])
def test_numpy_ref_vs_default(rng, dense):
    h, w, mask, teacher = case(rng, dense=dense)
    out = {}
    for kernel in ("ref", None):
        ctx = spanhead.Context("cpu", kernel=kernel)
        out[kernel] = spanhead.distill_loss(h, w, loss_mask=mask, kind="jsd", beta=0.6,
                                            reduction="sum", context=ctx, **teacher)
    a, b = out[None], out["ref"]
    assert abs(a.loss - b.loss) <= 2e-5 * abs(b.loss)
    for k in ("dhidden", "dweight"):
        np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=2e-5 * np.abs(b[k]).max())
    assert np.all(a.dhidden[mask == 0] == 0)


def test_errors(rng):
    h, w, mask, teacher = case(rng, dense=False)
    H, W = torch.tensor(h), torch.tensor(w)
    tt = {k: torch.tensor(v) for k, v in teacher.items()}
    with pytest.raises(spanhead.InvalidArgumentError, match="beta"):
        st.distill_loss(H, W, kind="jsd", beta=1.5, **tt)
    with pytest.raises(spanhead.InvalidArgumentError, match="kind"):
        st.distill_loss(H, W, kind="kl", **tt)
    with pytest.raises(spanhead.InvalidArgumentError, match="reduction"):
        st.distill_loss(H, W, reduction="avg", **tt)
    with pytest.raises(spanhead.InvalidArgumentError, match="teacher"):
        st.distill_loss(H, W)
    # an explicit 0 is not the C API's "unset" (None is): a bad temperature, in both fronts
    dense = case(rng, dense=True)[3]
    for f, args in ((st.distill_loss, (H, W, {k: torch.tensor(v) for k, v in dense.items()})),
                    (spanhead.distill_loss, (h, w, dense))):
        with pytest.raises(spanhead.InvalidArgumentError, match="teacher_temperature: 0"):
            f(args[0], args[1], teacher_temperature=0.0, **args[2])
    bad = tt["teacher_topk_ids"].clone()
    bad[0, 1] = bad[0, 0]
    with pytest.raises(spanhead.InvalidArgumentError, match="appears twice"):
        st.distill_loss(H, W, teacher_topk_ids=bad,
                        teacher_topk_logprobs=tt["teacher_topk_logprobs"])
    with pytest.raises(spanhead.InvalidArgumentError, match="sum to"):
        st.distill_loss(H, W, teacher_topk_ids=tt["teacher_topk_ids"],
                        teacher_topk_logprobs=torch.full_like(tt["teacher_topk_logprobs"], -0.1))
    with pytest.raises(spanhead.ShapeError):
        st.distill_loss(H, W, teacher_topk_ids=tt["teacher_topk_ids"][:5],
                        teacher_topk_logprobs=tt["teacher_topk_logprobs"][:5])


def test_torch_compile_fullgraph(rng):
    h, w, mask, teacher = case(rng, dense=False)
    tt = {k: torch.tensor(v) for k, v in teacher.items()}

    def step(H, W):
        return st.distill_loss(H, W, kind="jsd", beta=0.4, **tt)

    out = {}
    for name, fn in (("eager", step), ("compiled", torch.compile(step, fullgraph=True))):
        H = torch.tensor(h, requires_grad=True)
        W = torch.tensor(w, requires_grad=True)
        loss = fn(H, W)
        loss.backward()
        out[name] = (loss.detach(), H.grad, W.grad)
    for a, b in zip(out["eager"], out["compiled"]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("student_rows", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_teacher_temperature_rows(rng, student_rows, reduction):
    """The dense teacher's per-row temperature (issue 25 item 1 for the distillation's second
    temperature): float64 eager values and gradients, alone and with the student's per-row
    one; the scalar's path when every row holds the scalar; the NumPy entry point (float64
    array, converted); the errors."""
    h, w, mask, teacher = case(rng, dense=True)
    N = h.shape[0]
    TT = torch.tensor(rng.uniform(0.4, 2.5, N), dtype=torch.float32)
    T = torch.tensor(rng.uniform(0.5, 2.0, N), dtype=torch.float32) if student_rows else 0.9
    H = torch.tensor(h, requires_grad=True)
    W = torch.tensor(w, requires_grad=True)
    tt = {k: torch.tensor(v) for k, v in teacher.items()}
    got = st.distill_loss(H, W, loss_mask=torch.tensor(mask), kind="jsd", beta=0.3,
                          temperature=T, teacher_temperature=TT, reduction=reduction, **tt)
    H64 = torch.tensor(h).double().requires_grad_(True)
    W64 = torch.tensor(w).double().requires_grad_(True)
    T64 = T.double() if student_rows else T
    want = distill_eager(H64, W64, loss_mask=torch.tensor(mask), kind="jsd", beta=0.3,
                         temperature=T64, teacher_temperature=TT.double(), reduction=reduction,
                         **{k: t64(v) for k, v in teacher.items()})
    g = torch.linspace(0.5, 1.5, N) if reduction == "none" else torch.tensor(0.7)
    (got * g).sum().backward()
    (want * g.double()).sum().backward()
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=2e-5, atol=1e-7)
    for a, b in ((H.grad, H64.grad), (W.grad, W64.grad)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4,
                                   atol=2e-5 * b.abs().max().item())
    # the rows differ from the student's: a teacher at the student's temperature is another loss
    same = distill_eager(H64.detach(), W64.detach(), loss_mask=torch.tensor(mask), kind="jsd",
                         beta=0.3, temperature=T64, reduction=reduction,
                         **{k: t64(v) for k, v in teacher.items()})
    assert (same - want.detach()).abs().max().item() > 1e-3
    # every row at the scalar (1.25: the same in float32 and float64): the scalar's path, bit for
    # bit
    Hd, Wd = H.detach(), W.detach()
    rows = st.distill_loss(Hd, Wd, kind="jsd", beta=0.3, temperature=T,
                           teacher_temperature=torch.full((N,), 1.25), **tt)
    sc = st.distill_loss(Hd, Wd, kind="jsd", beta=0.3, temperature=T, teacher_temperature=1.25,
                         **tt)
    assert torch.equal(rows, sc)
    # NumPy: a float64 array (converted to float32, as the torch path does)
    Tn = T.numpy() if student_rows else T
    res = spanhead.distill_loss(h, w, loss_mask=mask, kind="jsd", beta=0.3, temperature=Tn,
                                teacher_temperature=TT.numpy().astype(np.float64),
                                reduction=reduction, **teacher)
    np.testing.assert_allclose(res.loss, want.detach().numpy(), rtol=2e-5, atol=1e-7)
    # errors: a bad value (named by row), a shape, a dtype, a sparse teacher
    bad = TT.clone()
    bad[3] = 0.0
    with pytest.raises(spanhead.InvalidArgumentError, match=r"teacher_temperature_rows\[3\]: 0"):
        st.distill_loss(Hd, Wd, teacher_temperature=bad, **tt)
    with pytest.raises(spanhead.InvalidArgumentError, match=r"teacher_temperature_rows\[3\]: 0"):
        spanhead.distill_loss(h, w, teacher_temperature=bad.numpy(), **teacher)
    with pytest.raises(spanhead.ShapeError, match="teacher_temperature: shape"):
        st.distill_loss(Hd, Wd, teacher_temperature=TT[:-1], **tt)
    with pytest.raises(spanhead.ShapeError, match="teacher_temperature_rows"):
        spanhead.distill_loss(h, w, teacher_temperature=TT.numpy()[:-1], **teacher)
    with pytest.raises(spanhead.DTypeError, match="teacher_temperature: dtype"):
        st.distill_loss(Hd, Wd, teacher_temperature=torch.ones(N, dtype=torch.int32), **tt)
    sparse = {k: torch.tensor(v) for k, v in case(rng, dense=False)[3].items()}
    with pytest.raises(spanhead.InvalidArgumentError, match="given with a sparse teacher"):
        st.distill_loss(Hd, Wd, teacher_temperature=TT, **sparse)
    with pytest.raises(spanhead.InvalidArgumentError, match="given with a sparse teacher"):
        st.distill_loss(Hd, Wd, teacher_temperature=1.5, **sparse)


@pytest.mark.parametrize("dense", [True, False])
def test_per_row_temperature(rng, dense):
    h, w, mask, teacher = case(rng, dense=dense)
    T = torch.tensor(rng.uniform(0.5, 2.0, h.shape[0]), dtype=torch.float32)
    H = torch.tensor(h, requires_grad=True)
    W = torch.tensor(w, requires_grad=True)
    tt = {k: torch.tensor(v) for k, v in teacher.items()}
    got = st.distill_loss(H, W, loss_mask=torch.tensor(mask), kind="jsd", beta=0.3,
                          temperature=T, **tt)
    got.backward()
    H64 = torch.tensor(h).double().requires_grad_(True)
    W64 = torch.tensor(w).double().requires_grad_(True)
    want = distill_eager(H64, W64, loss_mask=torch.tensor(mask), kind="jsd", beta=0.3,
                         temperature=T.double(), **{k: t64(v) for k, v in teacher.items()})
    want.backward()
    assert abs(got.item() - want.item()) <= 2e-5 * abs(want.item()) + 1e-7
    for a, b in ((H.grad, H64.grad), (W.grad, W64.grad)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4,
                                   atol=2e-5 * b.abs().max().item())
    # the scalar path of the same temperature everywhere is the per-row path's
    one = st.distill_loss(H.detach(), W.detach(), kind="jsd", beta=0.3,
                          temperature=torch.full((h.shape[0],), 1.3), **tt)
    sc = st.distill_loss(H.detach(), W.detach(), kind="jsd", beta=0.3, temperature=1.3, **tt)
    assert abs(one.item() - sc.item()) <= 1e-6 * abs(sc.item())
    # NumPy entry point with a per-row array
    res = spanhead.distill_loss(h, w, loss_mask=mask, kind="jsd", beta=0.3,
                                temperature=T.numpy(), **teacher)
    assert abs(res.loss - want.item()) <= 2e-5 * abs(want.item()) + 1e-7
    with pytest.raises(spanhead.InvalidArgumentError, match="temperature_rows"):
        bad = T.clone()
        bad[0] = -1.0
        st.distill_loss(H.detach(), W.detach(), kind="jsd", temperature=bad, **tt)


@pytest.mark.parametrize("dense", [True, False])
def test_num_tokens_micro_batches(rng, dense):
    """num_tokens = the global batch's active rows: the micro-batches' losses and gradients
    add up to the one-call mean's (torch), and a NumPy call's loss and gradients are the sum's
    over num_tokens (the float64 eager loss's)."""
    h, w, mask, teacher = case(rng, N=29, dense=dense)
    n_act = int(mask.sum())
    W = torch.tensor(w, requires_grad=True)
    H = torch.tensor(h, requires_grad=True)
    tt = {k: torch.tensor(v) for k, v in teacher.items()}
    want = st.distill_loss(H, W, loss_mask=torch.tensor(mask), kind="jsd", beta=0.3, **tt)
    want.backward()
    gh, gw = H.grad.clone(), W.grad.clone()
    H.grad = W.grad = None
    tot = 0.0
    for a, b in ((0, 11), (11, 29)):
        part = {k: v[a:b] if k != "teacher_weight" else v for k, v in tt.items()}
        loss = st.distill_loss(H[a:b], W, loss_mask=torch.tensor(mask[a:b]), kind="jsd",
                               beta=0.3, num_tokens=n_act, **part)
        loss.backward()
        tot = tot + loss.item()
    assert abs(tot - want.item()) <= 2e-5 * abs(want.item()) + 1e-7
    for got, ref in ((H.grad, gh), (W.grad, gw)):
        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-4,
                                   atol=2e-5 * ref.abs().max().item())
    # NumPy, one call with a global T larger than its rows, against the float64 eager sum / T
    T_glob = 3 * n_act + 1
    r = spanhead.distill_loss(h, w, loss_mask=mask, kind="forward_kl", num_tokens=T_glob,
                              seq_group=spanhead.Comm.none(), **teacher)
    H64 = torch.tensor(h).double().requires_grad_(True)
    W64 = torch.tensor(w).double().requires_grad_(True)
    s = distill_eager(H64, W64, loss_mask=torch.tensor(mask), kind="forward_kl",
                      reduction="sum", **{k: t64(v) for k, v in teacher.items()}) / T_glob
    s.backward()
    assert abs(r.loss - s.item()) <= 2e-5 * abs(s.item()) + 1e-8
    for got, ref in ((r.dhidden, H64.grad), (r.dweight, W64.grad)):
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4,
                                   atol=2e-5 * ref.abs().max().item())


def test_num_tokens_and_seq_group_errors(rng):
    h, w, mask, teacher = case(rng, dense=False)
    H, W = torch.tensor(h), torch.tensor(w)
    tt = {k: torch.tensor(v) for k, v in teacher.items()}
    with pytest.raises(spanhead.InvalidArgumentError, match="num_tokens: 0"):
        st.distill_loss(H, W, num_tokens=0, **tt)
    with pytest.raises(spanhead.DTypeError, match="num_tokens"):
        st.distill_loss(H, W, num_tokens=2.5, **tt)
    with pytest.raises(spanhead.InvalidArgumentError, match="seq_group"):
        st.distill_loss(H, W, seq_group="world", **tt)
    with pytest.raises(spanhead.InvalidArgumentError, match="seq_group"):
        spanhead.distill_loss(h, w, seq_group="world", **teacher)
    with pytest.raises(spanhead.InvalidArgumentError, match="num_tokens: -2"):
        spanhead.distill_loss(h, w, num_tokens=-2, **teacher)
