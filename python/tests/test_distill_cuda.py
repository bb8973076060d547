"""spanhead.torch.distill_loss on a CUDA device against the plain-torch float64 formulas
(spanhead/_distill_eager.py) on the host: every kind, dense and sparse teachers, reductions,
f32 and bf16. Skips without a CUDA device."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import spanhead  # noqa: E402
import spanhead.torch as st  # noqa: E402
from spanhead._distill_eager import distill_eager  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or spanhead.cuda_device_count() == 0,
                                reason="no CUDA device")

from test_distill import KINDS, case, t64  # noqa: E402


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("kind,beta", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_vs_eager(rng, dense, kind, beta, dtype):
    h, w, mask, teacher = case(rng, N=301, H=64, V=1031, HT=48, K=20, dense=dense)
    dev = torch.device("cuda")
    H = torch.tensor(h).to(dev, dtype).requires_grad_(True)
    W = torch.tensor(w).to(dev, dtype).requires_grad_(True)
    tt = {k: torch.tensor(v).to(dev, dtype if k.startswith("teacher_h") or k == "teacher_weight"
                                else None) for k, v in teacher.items()}
    red = "none" if kind == "reverse_kl" else "mean"
    got = st.distill_loss(H, W, loss_mask=torch.tensor(mask, device=dev), kind=kind, beta=beta,
                          reduction=red, **tt)
    g = torch.linspace(0.5, 1.5, h.shape[0], device=dev) if red == "none" else torch.tensor(1.0, device=dev)
    (got * g).sum().backward()
    H64 = H.detach().cpu().double().requires_grad_(True)
    W64 = W.detach().cpu().double().requires_grad_(True)
    want = distill_eager(H64, W64, loss_mask=torch.tensor(mask), kind=kind, beta=beta,
                         reduction=red, **{k: t64(v.cpu().float().numpy() if v.is_floating_point()
                                                  else v.cpu().numpy()) for k, v in tt.items()})
    (want * g.cpu().double()).sum().backward()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    np.testing.assert_allclose(got.detach().cpu().numpy(), want.detach().numpy(), rtol=tol,
                               atol=tol * 0.1)
    for a, b in ((H.grad, H64.grad), (W.grad, W64.grad)):
        scale = b.abs().max().item()
        np.testing.assert_allclose(a.float().cpu().numpy(), b.numpy(), rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("dense", [True, False])
def test_cuda_per_row_temperature(rng, dense):
    h, w, mask, teacher = case(rng, N=97, H=32, V=517, HT=24, K=9, dense=dense)
    dev = torch.device("cuda")
    T = torch.tensor(rng.uniform(0.5, 2.0, h.shape[0]), dtype=torch.float32)
    H = torch.tensor(h, device=dev, requires_grad=True)
    W = torch.tensor(w, device=dev, requires_grad=True)
    tt = {k: torch.tensor(v, device=dev) for k, v in teacher.items()}
    got = st.distill_loss(H, W, kind="jsd", beta=0.4, temperature=T.to(dev), **tt)
    got.backward()
    H64 = torch.tensor(h).double().requires_grad_(True)
    W64 = torch.tensor(w).double().requires_grad_(True)
    want = distill_eager(H64, W64, kind="jsd", beta=0.4, temperature=T.double(),
                         **{k: t64(v) for k, v in teacher.items()})
    want.backward()
    assert abs(got.item() - want.item()) <= 1e-4 * abs(want.item()) + 1e-6
    for a, b in ((H.grad, H64.grad), (W.grad, W64.grad)):
        np.testing.assert_allclose(a.cpu().numpy(), b.numpy(), rtol=1e-4,
                                   atol=1e-4 * b.abs().max().item())


@pytest.mark.parametrize("student_rows", [False, True])
def test_cuda_teacher_temperature_rows(rng, student_rows):
    """The dense teacher's per-row temperature on CUDA (device tensors), alone and with the
    student's, against the float64 eager formulas; a bad value of an active row is counted as
    non-finite (device memory is not read at validation)."""
    h, w, mask, teacher = case(rng, N=97, H=32, V=517, HT=24, K=9, dense=True)
    dev = torch.device("cuda")
    N = h.shape[0]
    TT = torch.tensor(rng.uniform(0.4, 2.5, N), dtype=torch.float32)
    T = torch.tensor(rng.uniform(0.5, 2.0, N), dtype=torch.float32) if student_rows else 1.1
    H = torch.tensor(h, device=dev, requires_grad=True)
    W = torch.tensor(w, device=dev, requires_grad=True)
    tt = {k: torch.tensor(v, device=dev) for k, v in teacher.items()}
    got = st.distill_loss(H, W, kind="jsd", beta=0.4,
                          temperature=T.to(dev) if student_rows else T,
                          teacher_temperature=TT.to(dev), **tt)
    got.backward()
    H64 = torch.tensor(h).double().requires_grad_(True)
    W64 = torch.tensor(w).double().requires_grad_(True)
    want = distill_eager(H64, W64, kind="jsd", beta=0.4,
                         temperature=T.double() if student_rows else T,
                         teacher_temperature=TT.double(),
                         **{k: t64(v) for k, v in teacher.items()})
    want.backward()
    assert abs(got.item() - want.item()) <= 1e-4 * abs(want.item()) + 1e-6
    for a, b in ((H.grad, H64.grad), (W.grad, W64.grad)):
        np.testing.assert_allclose(a.cpu().numpy(), b.numpy(), rtol=1e-4,
                                   atol=1e-4 * b.abs().max().item())
    bad = TT.clone()
    bad[5] = float("nan")
    ctx = spanhead.Context("cuda")
    res = spanhead.distill_loss(H.detach(), W.detach(), kind="jsd", beta=0.4,
                                teacher_temperature=bad.to(dev), reduction="none",
                                context=ctx, **tt)
    torch.cuda.synchronize()
    count, first = ctx.nonfinite()
    assert (count, first) == (1, 5)
    assert torch.isnan(res.loss[5]).item() and torch.isfinite(res.loss[:5]).all().item()


@pytest.mark.parametrize("device_mask", [False, True])
def test_cuda_num_tokens_micro_batches(rng, device_mask):
    """num_tokens on CUDA: two micro-batches given the global batch's active rows add up,
    loss and gradients, to the one-call mean (the mask on the host: spans; on the device: the
    device count overridden)."""
    h, w, mask, teacher = case(rng, N=211, H=48, V=523, HT=32, K=12, dense=False)
    dev = torch.device("cuda")
    n_act = int(mask.sum())
    W = torch.tensor(w, device=dev, requires_grad=True)
    H = torch.tensor(h, device=dev, requires_grad=True)
    tt = {k: torch.tensor(v, device=dev) for k, v in teacher.items()}
    m = torch.tensor(mask, device=dev if device_mask else "cpu")
    want = st.distill_loss(H, W, loss_mask=m, kind="jsd", beta=0.4, **tt)
    want.backward()
    gh, gw = H.grad.clone(), W.grad.clone()
    H.grad = W.grad = None
    tot = 0.0
    for a, b in ((0, 97), (97, 211)):
        loss = st.distill_loss(H[a:b], W, loss_mask=m[a:b], kind="jsd", beta=0.4,
                               num_tokens=n_act, **{k: v[a:b] for k, v in tt.items()})
        loss.backward()
        tot += loss.item()
    assert abs(tot - want.item()) <= 1e-4 * abs(want.item()) + 1e-7
    for got, ref in ((H.grad, gh), (W.grad, gw)):
        np.testing.assert_allclose(got.cpu().numpy(), ref.cpu().numpy(), rtol=1e-3,
                                   atol=1e-4 * ref.abs().max().item())
