"""The LM head through the Python binding against the float64 NumPy reference."""

import numpy as np
import pytest

import spanhead
from conftest import run_or_skip
from reference import close, gemm_bound, head_ref

# Tolerances from the arithmetic (issue 20), relative to the scale of the values:
F32_TOL = 2e-5   # float32 arithmetic on O(1) values: per-row outputs and gradients
# Half-precision inputs: their products are exact in float32, so the float32 outputs
# (logprob, entropy, lse, ...) are float32 arithmetic on the inputs as given: F32_TOL too.
# Half gradients: dlogits may be rounded to the input dtype before the two gradient products
# and the result is rounded once: reference.gemm_bound + u * |g| (u: the format's roundoff).
HALF_U = {"bf16": 2.0 ** -8, "f16": 2.0 ** -11}


def case(rng, N, H, V, K=0, ignore_every=7):
    """Random inputs whose logits are neither flat nor one-hot."""
    h = rng.standard_normal((N, H)).astype(np.float32)
    w = (rng.standard_normal((V, H)) * 2.5 / np.sqrt(H)).astype(np.float32)
    t = rng.integers(0, V, N).astype(np.int64)
    cand = None
    if K:
        cand = np.full((N, K), -1, np.int64)
        for i in range(N):
            k = int(rng.integers(1, K + 1))  # some rows padded with -1
            cand[i, :k] = rng.choice(V, size=k, replace=False)
            t[i] = cand[i, int(rng.integers(0, k))]
    if ignore_every:
        t[::ignore_every] = -100
    return h, w, t, cand


def nan_outputs(N, H, V):
    """Output buffers poisoned with NaN, so an unwritten entry fails the comparison."""
    f = lambda *s: np.full(s, np.nan, np.float32)  # noqa: E731
    return dict(logprob=f(N), entropy=f(N), lse=f(N), logit_mean=f(N), stats=f(N, 3))


def scale(x):
    return max(1.0, float(np.max(np.abs(x))) if np.size(x) else 1.0)


def check_forward(r, ref, tol, outputs=("logprob", "entropy", "lse", "logit_mean")):
    for k in outputs:
        close(k, r[k], ref[k], tol * scale(ref[k]))


@pytest.mark.parametrize("N,H,V", [(1, 1, 1), (5, 3, 2), (37, 19, 103), (64, 32, 257)])
@pytest.mark.parametrize("temperature,softcap", [(1.0, 0.0), (0.7, 0.0), (1.3, 4.0)])
def test_forward_backward_dense(ctx, rng, N, H, V, temperature, softcap):
    h, w, t, _ = case(rng, N, H, V)
    outs = nan_outputs(N, H, V)
    r = run_or_skip(ctx, spanhead.head_forward, h, w, t, temperature=temperature,
                    softcap=softcap, entropy=outs["entropy"], lse=outs["lse"],
                    logit_mean=outs["logit_mean"], logprob=outs["logprob"], stats=outs["stats"])
    ref = head_ref(h, w, t, temperature=temperature, softcap=softcap)
    check_forward(r, ref, F32_TOL)
    assert r.logprob is outs["logprob"]  # written in place
    close("stats[:, 1] (lse)", r.stats[:, 1], ref["lse"], F32_TOL * scale(ref["lse"]))
    # entropy lies in [0, log V]
    assert np.all(r.entropy >= -1e-5) and np.all(r.entropy <= np.log(V) + 1e-4)

    g = rng.standard_normal(N).astype(np.float32)
    e = rng.standard_normal(N).astype(np.float32)
    gl = rng.standard_normal(N).astype(np.float32)
    gm = rng.standard_normal(N).astype(np.float32)
    dh = np.full((N, H), np.nan, np.float32)
    dw = np.full((V, H), np.nan, np.float32)
    b = run_or_skip(ctx, spanhead.head_backward, h, w, t, stats=r.stats, dlogprob=g,
                    dentropy=e, dlse=gl, dlogit_mean=gm, temperature=temperature,
                    softcap=softcap, dhidden=dh, dweight=dw)
    ref = head_ref(h, w, t, temperature=temperature, softcap=softcap, g=g, e=e, gl=gl, gm=gm)
    close("dhidden", b.dhidden, ref["dhidden"], F32_TOL * scale(ref["dhidden"]))
    close("dweight", b.dweight, ref["dweight"], F32_TOL * scale(ref["dweight"]))


@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("use_spans", [False, True])
def test_masked_rows(ctx, rng, density, use_spans):
    N, H, V = 53, 16, 97
    h, w, t, _ = case(rng, N, H, V)
    mask = rng.random(N) < density
    spans = spanhead.spans_from_mask(mask, gap=3) if use_spans else None
    outs = nan_outputs(N, H, V)
    r = run_or_skip(ctx, spanhead.head_forward, h, w, t, active_mask=mask.astype(np.uint8),
                    spans=spans, entropy=outs["entropy"], lse=outs["lse"],
                    logit_mean=outs["logit_mean"], logprob=outs["logprob"], stats=outs["stats"])
    ref = head_ref(h, w, t, active=mask)
    check_forward(r, ref, F32_TOL)
    for k in ("logprob", "entropy", "lse", "logit_mean"):
        assert np.all(r[k][~mask] == 0.0), f"{k}: inactive rows must be exactly 0"
    g, e = rng.standard_normal((2, N)).astype(np.float32)
    dh = np.full((N, H), np.nan, np.float32)
    dw = np.full((V, H), np.nan, np.float32)
    b = run_or_skip(ctx, spanhead.head_backward, h, w, t, stats=r.stats, dlogprob=g,
                    dentropy=e, active_mask=mask, spans=spans, dhidden=dh, dweight=dw)
    ref = head_ref(h, w, t, active=mask, g=g, e=e)
    close("dhidden", b.dhidden, ref["dhidden"], F32_TOL * scale(ref["dhidden"]))
    close("dweight", b.dweight, ref["dweight"], F32_TOL * scale(ref["dweight"]))
    assert np.all(b.dhidden[~mask] == 0.0), "dhidden of inactive rows must be exactly 0"


def test_spans_without_mask(ctx, rng):
    """Spans alone select the active rows."""
    N, H, V = 40, 8, 33
    h, w, t, _ = case(rng, N, H, V)
    spans = np.array([[3, 9], [20, 21], [30, 40]], np.int64)
    active = np.zeros(N, bool)
    for a, b in spans:
        active[a:b] = True
    r = run_or_skip(ctx, spanhead.head_forward, h, w, t, spans=spans, entropy=True)
    ref = head_ref(h, w, t, active=active)
    check_forward(r, ref, F32_TOL, ("logprob", "entropy"))


def test_one_pass_equals_two_pass(ctx, rng):
    N, H, V = 29, 12, 61
    h, w, t, _ = case(rng, N, H, V)
    mask = rng.random(N) < 0.6
    g, e = rng.standard_normal((2, N)).astype(np.float32)
    one = run_or_skip(ctx, spanhead.head_forward, h, w, t, entropy=True, active_mask=mask,
                      dlogprob=g, dentropy=e, dhidden=True, dweight=True, temperature=0.9)
    ref = head_ref(h, w, t, active=mask, g=g, e=e, temperature=0.9)
    check_forward(one, ref, F32_TOL, ("logprob", "entropy"))
    close("dhidden", one.dhidden, ref["dhidden"], F32_TOL * scale(ref["dhidden"]))
    close("dweight", one.dweight, ref["dweight"], F32_TOL * scale(ref["dweight"]))


def test_sample_support(ctx, rng):
    N, H, V, K = 31, 10, 200, 6
    h, w, t, cand = case(rng, N, H, V, K=K)
    for cdt in (np.int64, np.int32):
        r = run_or_skip(ctx, spanhead.head_forward, h, w, t.astype(cdt),
                        candidates=cand.astype(cdt), entropy=True, lse=True)
        ref = head_ref(h, w, t, cand=cand)
        check_forward(r, ref, F32_TOL, ("logprob", "entropy", "lse"))
    g, e = rng.standard_normal((2, N)).astype(np.float32)
    b = run_or_skip(ctx, spanhead.head_backward, h, w, t, candidates=cand, stats=r.stats,
                    dlogprob=g, dentropy=e)
    ref = head_ref(h, w, t, cand=cand, g=g, e=e)
    close("dhidden", b.dhidden, ref["dhidden"], F32_TOL * scale(ref["dhidden"]))
    close("dweight", b.dweight, ref["dweight"], F32_TOL * scale(ref["dweight"]))


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_half_inputs(ctx, rng, dtype):
    N, H, V = 23, 16, 71
    h, w, t, _ = case(rng, N, H, V)
    if dtype == "bf16":
        hb, wb = spanhead.to_bf16_bits(h), spanhead.to_bf16_bits(w)
        h64, w64 = spanhead.from_bf16_bits(hb), spanhead.from_bf16_bits(wb)
        hx, wx = spanhead.bfloat16(hb), spanhead.bfloat16(wb)
    else:
        hx, wx = h.astype(np.float16), w.astype(np.float16)
        h64, w64 = hx.astype(np.float64), wx.astype(np.float64)
    r = run_or_skip(ctx, spanhead.head_forward, hx, wx, t, entropy=True)
    ref = head_ref(h64, w64, t)
    check_forward(r, ref, F32_TOL, ("logprob", "entropy"))
    g = rng.standard_normal(N).astype(np.float32)
    # gradients in the input dtype (default) and in float32
    b = run_or_skip(ctx, spanhead.head_backward, hx, wx, t, stats=r.stats, dlogprob=g)
    b32 = run_or_skip(ctx, spanhead.head_backward, hx, wx, t, stats=r.stats, dlogprob=g,
                      grad_dtype="float32")
    ref = head_ref(h64, w64, t, g=g)
    if dtype == "bf16":
        assert isinstance(b.dhidden, spanhead.bfloat16)
        dh = spanhead.from_bf16_bits(b.dhidden)
        dw = spanhead.from_bf16_bits(b.dweight)
    else:
        assert b.dhidden.dtype == np.float16
        dh, dw = b.dhidden, b.dweight
    u = HALF_U[dtype]
    bound_h = gemm_bound(ref["du"], w64, u) + u * np.abs(ref["dhidden"])
    bound_w = gemm_bound(ref["du"].T, h64, u) + u * np.abs(ref["dweight"])
    close("dhidden", dh, ref["dhidden"], bound_h + F32_TOL * scale(ref["dhidden"]), 0.0)
    close("dweight", dw, ref["dweight"], bound_w + F32_TOL * scale(ref["dweight"]), 0.0)
    assert b32.dhidden.dtype == np.float32
    close("dhidden f32", b32.dhidden, ref["dhidden"],
          gemm_bound(ref["du"], w64, u) + F32_TOL * scale(ref["dhidden"]), 0.0)


def test_accumulate_and_i32_targets(ctx, rng):
    N, H, V = 17, 9, 41
    h, w, t, _ = case(rng, N, H, V)
    r = run_or_skip(ctx, spanhead.head_forward, h, w, t.astype(np.int32))
    g = rng.standard_normal(N).astype(np.float32)
    dh0 = rng.standard_normal((N, H)).astype(np.float32)
    dw0 = rng.standard_normal((V, H)).astype(np.float32)
    dh, dw = dh0.copy(), dw0.copy()
    run_or_skip(ctx, spanhead.head_backward, h, w, t.astype(np.int32), stats=r.stats,
                dlogprob=g, dhidden=dh, dweight=dw, accumulate_dhidden=True,
                accumulate_dweight=True)
    ref = head_ref(h, w, t, g=g)
    close("dhidden += ", dh, dh0 + ref["dhidden"], F32_TOL * scale(dh0 + ref["dhidden"]))
    close("dweight += ", dw, dw0 + ref["dweight"], F32_TOL * scale(dw0 + ref["dweight"]))


def test_row_strided_inputs(ctx, rng):
    """Rows with padding (a column slice) are accepted: the inner stride is 1."""
    N, H, V = 11, 6, 13
    big = rng.standard_normal((N, H + 5)).astype(np.float32)
    h = big[:, :H]
    w = (rng.standard_normal((V, H)) * 0.5).astype(np.float32)
    t = rng.integers(0, V, N)
    r = run_or_skip(ctx, spanhead.head_forward, h, w, t)
    close("logprob", r.logprob, head_ref(h, w, t)["logprob"], F32_TOL * 10)


def test_empty_batch(ctx, rng):
    h = np.zeros((0, 4), np.float32)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    r = run_or_skip(ctx, spanhead.head_forward, h, w, np.zeros(0, np.int64), entropy=True)
    assert r.logprob.shape == (0,) and r.stats.shape == (0, 3)


def test_read_only_inputs_accepted(ctx, rng):
    """Read-only NumPy arrays pass as inputs (versioned DLPack carries the flag)."""
    N, H, V = 6, 4, 9
    h, w, t, _ = case(rng, N, H, V, ignore_every=0)
    for a in (h, w, t):
        a.flags.writeable = False
    r = run_or_skip(ctx, spanhead.head_forward, h, w, t)
    close("logprob", r.logprob, head_ref(h, w, t)["logprob"], F32_TOL * 10)


def test_workspace_cached_per_context(rng):
    c = spanhead.Context(kernel="ref")
    h, w, t, _ = case(rng, 8, 4, 6)
    a = spanhead.head_forward(h, w, t, context=c).logprob
    b = spanhead.head_forward(h, w, t, context=c).logprob
    assert np.array_equal(a, b)  # deterministic
    c.close()
    with pytest.raises(spanhead.InvalidArgumentError, match="after close"):
        spanhead.head_forward(h, w, t, context=c)


def test_nonfinite_refused_and_counted(ctx, rng):
    """A NaN hidden row on an active row: the host pass refuses it with NonFiniteError, writes
    nothing, and Context.nonfinite() reports the row once (then resets)."""
    N, H, V = 9, 5, 13
    h, w, t, _ = case(rng, N, H, V, ignore_every=0)
    assert ctx.nonfinite() == (0, -1)
    h[6, 2] = np.nan
    h[4, 0] = np.inf
    outs = nan_outputs(N, H, V)
    outs["logprob"][:] = 7.0
    with pytest.raises(spanhead.NonFiniteError, match="4"):
        run_or_skip(ctx, spanhead.head_forward, h, w, t, logprob=outs["logprob"])
    assert np.all(outs["logprob"] == 7.0)  # nothing written
    assert ctx.nonfinite() == (2, 4)
    assert ctx.nonfinite() == (0, -1)  # reset by the call
    # a non-finite row the mask leaves out is not counted
    m = np.ones(N, np.uint8)
    m[[4, 6]] = 0
    run_or_skip(ctx, spanhead.head_forward, h, w, t, active_mask=m)
    assert ctx.nonfinite() == (0, -1)
