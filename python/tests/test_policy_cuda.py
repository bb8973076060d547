"""spanhead.torch.policy_loss on a CUDA device against verl's formulation in torch on top of
spanhead.torch.logprobs on the same device (values, metrics, gradients), every loss x KL x
aggregation, f32 and bf16; the metrics stay on the device (no host sync in the call). Skips
without torch or without a GPU."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import numpy as np  # noqa: E402

import spanhead.torch as sht  # noqa: E402
from test_policy import AGGS, KLS, LOSSES, case, torch_formulation  # noqa: E402


def to(x, dev, dtype=None):
    t = torch.from_numpy(np.ascontiguousarray(x)).to(dev)
    return t.to(dtype) if dtype is not None else t


@pytest.mark.parametrize("loss_type", LOSSES)
@pytest.mark.parametrize("kl_type", KLS)
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_every_combination(rng, loss_type, kl_type, agg, dtype):
    dev = torch.device("cuda")
    h, w, t, mask, seq, adv, old, ref, isw = case(rng, N=700, H=64, V=1003)
    kw = dict(loss_type=loss_type, clip_low=0.2, clip_high=0.28, kl_type=kl_type,
              kl_coef=0.07, entropy_coef=0.013, agg=agg, norm_length=11.0)
    if loss_type != "cispo":
        kw["clip_ratio_c"] = 3.0
    hh = to(h, dev, dtype).requires_grad_(True)
    ww = to(w, dev, dtype).requires_grad_(True)
    tt, mm = to(t, dev), to(mask, dev).bool()
    A, O, R, I, S = (to(adv, dev), to(old, dev), to(ref, dev), to(isw, dev), to(seq, dev))
    out = sht.policy_loss(hh, ww, tt, A, O, loss_mask=mm, ref_logprobs=R, seq_ids=S,
                          is_weights=I, **kw)
    assert out.metrics["loss"].device.type == "cuda"
    out.loss.backward()
    h2 = to(h, dev, dtype).requires_grad_(True)
    w2 = to(w, dev, dtype).requires_grad_(True)
    r = sht.logprobs(h2, w2, tt, loss_mask=mm, entropy=True)
    act = ((mm) & (tt >= 0)).float()
    opts = {k: v for k, v in kw.items() if k != "loss_type"}
    opts.setdefault("clip_ratio_c", None)
    opts.update(num_tokens=None, num_seqs=None)
    loss, met = torch_formulation(torch, r.logprob, r.entropy, A, O, act, loss_type=loss_type,
                                  ref=R, seq=S, isw=I, **opts)
    loss.backward()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert out.loss.item() == pytest.approx(loss.item(), rel=tol, abs=tol * 0.1)
    for k, v in met.items():
        assert out.metrics[k].item() == pytest.approx(v.item(), rel=tol, abs=tol * 0.1), k
    for got, want in ((hh.grad, h2.grad), (ww.grad, w2.grad)):
        scale = max(1e-6, want.float().abs().max().item())
        assert (got.float() - want.float()).abs().max().item() <= 3 * tol * scale


@pytest.mark.parametrize("loss_type", LOSSES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_extras(rng, loss_type, dtype):
    """topk=K / sum_p2=True through the loss on the GPU (issue 25): the head's +extras paths,
    against a float64 full sort of the logits on the rounded inputs the GPU sees."""
    from test_policy_extras import check_sp2
    from test_topk import check
    dev = torch.device("cuda")
    h, w, t, mask, seq, adv, old, ref, isw = case(rng, N=700, H=64, V=1003)
    hh = to(h, dev, dtype).requires_grad_(True)
    ww = to(w, dev, dtype).requires_grad_(True)
    out = sht.policy_loss(hh, ww, to(t, dev), to(adv, dev), to(old, dev),
                          loss_mask=to(mask, dev).bool(), seq_ids=to(seq, dev),
                          loss_type=loss_type, agg="seq-mean-token-mean", topk=64, sum_p2=True)
    out.loss.backward()
    assert hh.grad is not None and out.topk_ids.device.type == "cuda"
    hr = hh.detach().float().cpu().numpy()  # the rounded inputs
    wr = ww.detach().float().cpu().numpy()
    rows = (mask == 1) & (t >= 0)
    check(out.topk_ids.cpu().numpy(), out.topk_logprobs.cpu().numpy(), hr, wr, 1.0, 0.0, rows,
          64, 1e-3)
    check_sp2(out.sum_p2.cpu().numpy(), hr, wr, 1.0, rows)
