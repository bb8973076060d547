"""Bad input raises the right spanhead exception with the C message, never crashes."""

import numpy as np
import pytest

import spanhead


@pytest.fixture
def c():
    ctx = spanhead.Context(kernel="ref")
    yield ctx
    ctx.close()


def inputs(N=6, H=4, V=9):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((N, H)).astype(np.float32),
            rng.standard_normal((V, H)).astype(np.float32),
            rng.integers(0, V, N).astype(np.int64))


class FakeCuda:
    """Claims to live on cuda:0 (this machine has no GPU)."""

    def __init__(self, a):
        self.a = a
        self.shape = a.shape

    def __dlpack__(self, **kw):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return (2, 0)


def test_hierarchy():
    assert issubclass(spanhead.ShapeError, spanhead.Error)
    assert issubclass(spanhead.ShapeError, ValueError)
    assert issubclass(spanhead.DTypeError, TypeError)
    assert issubclass(spanhead.SizeOverflowError, OverflowError)
    assert issubclass(spanhead.UnsupportedError, NotImplementedError)
    for code, cls in enumerate(spanhead.BY_STATUS):
        assert cls.status == (code if code else -1)


def test_wrong_dtype(c):
    h, w, t = inputs()
    with pytest.raises(spanhead.DTypeError, match="hidden: dtype is f64") as e:
        spanhead.head_forward(h.astype(np.float64), w.astype(np.float64), t, context=c)
    assert e.value.status == 3
    with pytest.raises(spanhead.DTypeError, match="weight"):
        spanhead.head_forward(h, w.astype(np.float16), t, context=c)
    with pytest.raises(spanhead.DTypeError, match="targets"):
        spanhead.head_forward(h, w, t.astype(np.float32), context=c)
    with pytest.raises(spanhead.DTypeError, match="active_mask"):
        spanhead.head_forward(h, w, t, active_mask=np.ones(6, np.float32), context=c)
    with pytest.raises(spanhead.DTypeError, match="dhidden"):
        spanhead.head_forward(h, w, t, dlogprob=np.ones(6, np.float32),
                              dhidden=np.zeros((6, 4), np.float64), context=c)


def test_not_a_tensor(c):
    h, w, t = inputs()
    with pytest.raises(spanhead.DTypeError, match="hidden: expected a tensor"):
        spanhead.head_forward(h.tolist(), w, t, context=c)
    with pytest.raises(spanhead.DTypeError, match="targets: expected a tensor"):
        spanhead.head_forward(h, w, [1, 2, 3, 4, 5, 6], context=c)


def test_shape_mismatch(c):
    h, w, t = inputs()
    with pytest.raises(spanhead.ShapeError, match="weight"):
        spanhead.head_forward(h, w[:, :3].copy(), t, context=c)
    with pytest.raises(spanhead.ShapeError, match="targets"):
        spanhead.head_forward(h, w, t[:5], context=c)
    with pytest.raises(spanhead.ShapeError, match="active_mask"):
        spanhead.head_forward(h, w, t, active_mask=np.ones(7, np.uint8), context=c)
    with pytest.raises(spanhead.ShapeError, match="stats"):
        spanhead.head_backward(h, w, t, stats=np.zeros((6, 2), np.float32),
                               dlogprob=np.ones(6, np.float32), context=c)
    with pytest.raises(spanhead.ShapeError, match="hidden"):
        spanhead.head_forward(h[0], w, t, context=c)
    with pytest.raises(spanhead.ShapeError, match="spans"):
        spanhead.head_forward(h, w, t, spans=[1, 2, 3], context=c)


def test_non_contiguous(c):
    h, w, t = inputs(H=8)
    with pytest.raises(spanhead.ShapeError, match="hidden: inner stride"):
        spanhead.head_forward(h[:, ::2], w[:, :4].copy(), t, context=c)
    with pytest.raises(spanhead.ShapeError, match="weight"):
        spanhead.head_forward(h, np.asfortranarray(w), t, context=c)
    with pytest.raises(spanhead.ShapeError):
        spanhead.head_forward(h, w, t[::-1], context=c)  # negative stride


def test_mixed_devices(c):
    h, w, t = inputs()
    with pytest.raises(spanhead.DeviceError, match="weight is on cuda:0 but hidden is on cpu"):
        spanhead.head_forward(h, FakeCuda(w), t, context=c)
    with pytest.raises(spanhead.DeviceError, match="context runs on cpu"):
        spanhead.head_forward(FakeCuda(h), FakeCuda(w), FakeCuda(t), context=c)


def test_bad_values(c):
    h, w, t = inputs()
    bad = t.copy()
    bad[2] = 9
    with pytest.raises(spanhead.InvalidArgumentError, match=r"targets\[2\]"):
        spanhead.head_forward(h, w, bad, context=c)
    for temp in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(spanhead.InvalidArgumentError, match="temperature"):
            spanhead.head_forward(h, w, t, temperature=temp, context=c)
    for cap in (-1.0, float("nan"), float("inf")):
        with pytest.raises(spanhead.InvalidArgumentError, match="softcap"):
            spanhead.head_forward(h, w, t, softcap=cap, context=c)
    with pytest.raises(spanhead.InvalidArgumentError, match="logprob: requested without"):
        spanhead.head_forward(h, w, None, logprob=True, context=c)
    with pytest.raises(spanhead.InvalidArgumentError, match="active_mask"):
        spanhead.head_forward(h, w, t, active_mask=np.full(6, 2, np.uint8), context=c)
    with pytest.raises(spanhead.InvalidArgumentError, match="spans"):
        spanhead.head_forward(h, w, t, spans=[[4, 2]], context=c)
    with pytest.raises(spanhead.InvalidArgumentError, match="vocab_start"):
        spanhead.head_forward(h, w, t, vocab_start=5, vocab_total=10, context=c)


def test_upstream_gradient_without_output(c):
    h, w, t = inputs()
    st = spanhead.head_forward(h, w, t, context=c).stats
    with pytest.raises(spanhead.InvalidArgumentError, match="dlogprob: given without targets"):
        spanhead.head_backward(h, w, None, stats=st, dlogprob=np.ones(6, np.float32), context=c)
    with pytest.raises(spanhead.InvalidArgumentError, match="nothing to compute"):
        spanhead.head_backward(h, w, t, stats=st, dlogprob=np.ones(6, np.float32),
                               dhidden=False, dweight=False, context=c)


def test_read_only_output(c):
    h, w, t = inputs()
    out = np.zeros(6, np.float32)
    out.flags.writeable = False
    with pytest.raises(spanhead.InvalidArgumentError, match="logprob: output tensor is read-only"):
        spanhead.head_forward(h, w, t, logprob=out, context=c)


def test_capsule_used_twice(c):
    h, w, t = inputs()
    cap = h.__dlpack__()
    spanhead.describe_tensor(cap)
    with pytest.raises(TypeError, match="already used"):
        spanhead.describe_tensor(cap)


def test_reinterpret_wrong_size():
    with pytest.raises(spanhead.DTypeError, match="16-bit"):
        spanhead.bfloat16(np.zeros(3, np.float32))


def test_overflow_sizes(c):
    with pytest.raises(spanhead.SizeOverflowError):
        spanhead.pack([2 ** 63], capacity=10)
    with pytest.raises(spanhead.SizeOverflowError):
        spanhead.layout([2 ** 62, 2 ** 62, 2 ** 62])
    with pytest.raises(spanhead.Error):
        spanhead.pack([2 ** 62, 2 ** 62, 2 ** 62], capacity=2 ** 63 - 1)
    # huge views without memory behind them: rejected by validation, never dereferenced
    base = np.zeros(4, np.float32)
    huge = np.lib.stride_tricks.as_strided(base, shape=(2 ** 30, 2 ** 30), strides=(0, 4))
    tgt = np.lib.stride_tricks.as_strided(np.zeros(1, np.int64), shape=(2 ** 30,), strides=(8,))
    with pytest.raises(spanhead.ShapeError):
        spanhead.head_forward(huge, huge, tgt, logprob=False,
                              stats=np.zeros((1, 3), np.float32), context=c)


def test_bad_context_arguments():
    with pytest.raises(spanhead.DeviceError):
        spanhead.Context("tpu")
    with pytest.raises(spanhead.InvalidArgumentError, match="stream"):
        spanhead.Context("cpu", stream=5)
    with pytest.raises(spanhead.InvalidArgumentError):
        spanhead.Context("cpu", threads=-3)
    if spanhead.cuda_device_count() == 0:
        with pytest.raises((spanhead.NoDeviceError, spanhead.UnsupportedError)):
            spanhead.Context("cuda:0")


def test_error_message_is_thread_local_and_fresh(c):
    h, w, t = inputs()
    with pytest.raises(spanhead.DTypeError) as e1:
        spanhead.head_forward(h.astype(np.float64), w, t, context=c)
    with pytest.raises(spanhead.ShapeError) as e2:
        spanhead.head_forward(h, w, t[:2], context=c)
    assert "targets" in str(e2.value) and "targets" not in str(e1.value)


def test_comm_none_and_close():
    comm = spanhead.Comm.none()
    assert comm.info() == ("none", 0, 1)
    ctx = spanhead.Context("cpu", comm=comm, kernel="ref")
    h, w, t = inputs()
    ref = spanhead.head_forward(h, w, t, context=spanhead.Context(kernel="ref")).logprob
    assert np.array_equal(spanhead.head_forward(h, w, t, context=ctx).logprob, ref)
    ctx.close()
    comm.close()
    comm.close()
    with pytest.raises(spanhead.InvalidArgumentError, match="after close"):
        comm.info()
    with pytest.raises(spanhead.InvalidArgumentError, match="closed"):
        spanhead.Context("cpu", comm=comm)


def test_accumulate_needs_a_tensor(c):
    h, w, t = inputs()
    st = spanhead.head_forward(h, w, t, context=c).stats
    with pytest.raises(spanhead.InvalidArgumentError, match="accumulate_dweight"):
        spanhead.head_backward(h, w, t, stats=st, dlogprob=np.ones(6, np.float32),
                               accumulate_dweight=True, context=c)


def test_tune_needs_cuda(c):
    with pytest.raises(spanhead.UnsupportedError):
        c.tune("bfloat16", H=64, V_loc=128, N=32)
    with pytest.raises(spanhead.UnsupportedError):
        c.gemm_rate("bfloat16", M=64, N=64, K=64)
    with pytest.raises(spanhead.UnsupportedError, match="not a CUDA context|no CUDA"):
        c.gemm_rate_sustained("bfloat16", M=64, N=64, K=64, chain=4)
    with pytest.raises(spanhead.InvalidArgumentError, match="dtype"):
        c.tune("int8", H=64, V_loc=128, N=32)


def test_gemm_rate_sustained_chain(c):
    """A bad chain is named before the context is looked at (a build with CUDA); a build
    without CUDA answers every call with UnsupportedError."""
    for chain in (0, 65):
        with pytest.raises((spanhead.InvalidArgumentError, spanhead.UnsupportedError),
                           match=rf"chain {chain}, expected in \[1, 64\]|no CUDA backend"):
            c.gemm_rate_sustained("bfloat16", M=64, N=64, K=64, chain=chain)


def test_gemm_rates_on_gpu():
    """Burst and sustained rates on the GPU: positive and finite (speeds depend on the card)."""
    if spanhead.cuda_device_count() == 0:
        pytest.skip("the loaded libspanhead has no CUDA backend or sees no device")
    g = spanhead.Context("cuda:0")
    burst = g.gemm_rate("bfloat16", M=512, N=1024, K=256, repeats=3)
    sustained = g.gemm_rate_sustained("bfloat16", M=512, N=1024, K=256, chain=4, repeats=3)
    assert np.isfinite(burst) and burst > 0
    assert np.isfinite(sustained) and sustained > 0
    with pytest.raises(spanhead.InvalidArgumentError, match="chain 65"):
        g.gemm_rate_sustained("bfloat16", M=64, N=64, K=64, chain=65)
    g.close()

# ---- issue 18: Python values the C types cannot hold -> spanhead's exceptions, named --------

@pytest.mark.parametrize("kw, cls, words", [
    (dict(vocab_start=2**63), spanhead.SizeOverflowError, ["vocab_start", str(2**63)]),
    (dict(vocab_total=-2**63 - 1), spanhead.SizeOverflowError, ["vocab_total", str(-2**63 - 1)]),
    (dict(vocab_start=1.5), spanhead.DTypeError, ["vocab_start", "1.5"]),
    (dict(temperature=10**400), spanhead.InvalidArgumentError, ["temperature"]),
    (dict(temperature="hot"), spanhead.DTypeError, ["temperature", "hot"]),
    (dict(spans=[[0.5, 3.2]]), spanhead.DTypeError, ["spans", "0.5"]),
    (dict(spans=np.array([[0.0, 3.0]])), spanhead.DTypeError, ["spans", "float64"]),
    (dict(spans=[[0, 2**64]]), spanhead.SizeOverflowError, ["spans", str(2**64)]),
    (dict(spans=np.array([[0, 2**63]], dtype=np.uint64)), spanhead.SizeOverflowError,
     ["spans", str(2**63)]),
])
def test_head_arguments_out_of_c_range(c, kw, cls, words):
    h, w, t = inputs()
    lp = np.full(len(t), 7.0, np.float32)
    with pytest.raises(cls) as e:
        spanhead.head_forward(h, w, t, logprob=lp, context=c, **kw)
    assert isinstance(e.value, spanhead.Error) and e.value.status == cls.status
    for word in words:
        assert word in str(e.value)
    assert (lp == 7.0).all()  # refused before any write


@pytest.mark.parametrize("kw, cls, words", [
    (dict(threads=2**40), spanhead.InvalidArgumentError, ["threads", str(2**40)]),
    (dict(threads=2**70), spanhead.SizeOverflowError, ["threads", str(2**70)]),
    (dict(threads=2.5), spanhead.DTypeError, ["threads", "2.5"]),
    (dict(chunk_rows=2**63), spanhead.SizeOverflowError, ["chunk_rows"]),
    (dict(chunk_bytes=-2**64), spanhead.SizeOverflowError, ["chunk_bytes"]),
])
def test_context_arguments_out_of_c_range(kw, cls, words):
    with pytest.raises(cls) as e:
        spanhead.Context(**kw)
    for word in words:
        assert word in str(e.value)


def test_metadata_integers_out_of_range():
    with pytest.raises(spanhead.SizeOverflowError, match=r"lengths\[1\]"):
        spanhead.layout([4, 2**63])
    with pytest.raises(spanhead.SizeOverflowError, match="capacity"):
        spanhead.pack([4, 5], capacity=2**64)
    with pytest.raises(spanhead.SizeOverflowError, match="tp"):
        spanhead.alignment(tp=2**63)
    with pytest.raises(spanhead.DTypeError, match="spans"):
        spanhead.validate_spans([[0.5, 3.2]], 4)
    spanhead.validate_spans([[0, 3]], 4)  # integers still pass
    spanhead.validate_spans([], 4)


def test_comm_config_out_of_range():
    with pytest.raises(spanhead.SizeOverflowError, match="vocab_total"):
        spanhead.Comm.from_nccl(1, tp=1, vocab_total=2**63, vocab_start=0, vocab_local=4)
    with pytest.raises(spanhead.InvalidArgumentError, match="handle"):
        spanhead.Comm.from_nccl(-1, tp=1, vocab_total=4, vocab_start=0, vocab_local=4)


@pytest.mark.parametrize("which", ["policy_loss", "head_forward"])
def test_context_two_threads(which):
    """One Context used from two threads at once (issue 26 case 10): a call that finds the
    context busy raises naming the cause; a call that runs returns the one-thread answer
    (was: wrong results in 30 of 30 calls, no error)."""
    import threading
    import time
    rng = np.random.default_rng(7)
    N, H, V = 96, 64, 1500
    h = rng.standard_normal((N, H)).astype(np.float32)
    w = (rng.standard_normal((V, H)) / 8).astype(np.float32)
    t = rng.integers(0, V, N).astype(np.int64)
    adv = rng.standard_normal(N).astype(np.float32)
    old = np.full(N, -7.0, np.float32)
    ctx = spanhead.Context("cpu", threads=1)

    def call():
        if which == "policy_loss":
            r = spanhead.policy_loss(h, w, t, adv, old, context=ctx)
            return r["logprob"].copy(), r["dhidden"].copy()
        r = spanhead.head_forward(h, w, t, logprob=True, entropy=True, context=ctx)
        return r["logprob"].copy(), r["entropy"].copy()

    want = call()
    refused, wrong, ran = [], [], [0]
    stop = threading.Event()

    def worker():
        while not stop.is_set():
            try:
                got = call()
            except spanhead.InvalidArgumentError as e:
                refused.append(str(e))
                continue
            ran[0] += 1
            if not all(np.array_equal(a, b) for a, b in zip(got, want)):
                wrong.append(ran[0])

    ts = [threading.Thread(target=worker) for _ in range(2)]
    for th in ts:
        th.start()
    deadline = time.time() + 60
    while time.time() < deadline and len(refused) < 3:
        time.sleep(0.01)
    stop.set()
    for th in ts:
        th.join()
    assert not wrong, f"{len(wrong)} wrong results"
    assert refused, "two threads on one context were never refused"
    assert all("in use by another call" in m for m in refused), refused[0]
    assert np.array_equal(call()[0], want[0])  # the context serves the next call
    ctx.close()
