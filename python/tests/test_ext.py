"""The C extension itself: DLPack ownership (every consumed capsule's deleter runs, on success
and on every error path), and garbage arguments raise instead of crashing."""

import sys

import numpy as np
import pytest

import spanhead
from spanhead import _spanhead as ext
from spanhead.head import _SLOTS


def _args(h, w, t, stats):
    caps = [None] * len(_SLOTS)
    caps[_SLOTS.index("hidden")] = h.__dlpack__()
    caps[_SLOTS.index("weight")] = w.__dlpack__()
    caps[_SLOTS.index("targets")] = t.__dlpack__()
    caps[_SLOTS.index("stats")] = stats.__dlpack__()
    return tuple(caps)


def test_deleters_run_on_success_and_errors():
    c = spanhead.Context(kernel="ref")
    h = np.ones((3, 4), np.float32)
    w = np.ones((5, 4), np.float32)
    t = np.zeros(3, np.int64)
    st = np.zeros((3, 3), np.float32)
    bad_t = np.full(3, 99, np.int64)
    before = [sys.getrefcount(a) for a in (h, w, t, st, bad_t)]
    for _ in range(50):
        spanhead.head_forward(h, w, t, stats=st, context=c)
        with pytest.raises(spanhead.InvalidArgumentError):
            spanhead.head_forward(h, w, bad_t, stats=st, context=c)
        with pytest.raises(spanhead.DTypeError):  # fails while consuming the 4th slot
            spanhead.head_forward(h, w, t, stats=st, logprob=[1.0], context=c)
    after = [sys.getrefcount(a) for a in (h, w, t, st, bad_t)]
    assert before == after, "a DLPack capsule was consumed without calling its deleter"
    c.close()


def test_workspace_allocator_errors():
    """A pass that needs a workspace: a raising allocator, a too small buffer and a non-tensor
    are errors, and the consumed input capsules are still released."""
    c = spanhead.Context()
    rng = np.random.default_rng(1)
    N, H, V = 512, 64, 4096
    h = rng.standard_normal((N, H)).astype(np.float32)
    w = rng.standard_normal((V, H)).astype(np.float32)
    t = rng.integers(0, V, N)
    st = np.zeros((N, 3), np.float32)
    asked = []

    def record(n):
        asked.append(n)
        return np.zeros(n, np.uint8).__dlpack__()

    ext.head(c._handle, 0, _args(h, w, t, st), None, record, 0, 0, 1.0, 0.0, 0, 0, 0)
    if not asked:
        pytest.skip("this kernel set needs no workspace for the case")
    before = [sys.getrefcount(a) for a in (h, w, t, st)]
    with pytest.raises(ZeroDivisionError):
        ext.head(c._handle, 0, _args(h, w, t, st), None, lambda n: 1 / 0, 0, 0, 1.0, 0.0,
                 0, 0, 0)
    with pytest.raises(spanhead.WorkspaceError, match="at least the requested size"):
        ext.head(c._handle, 0, _args(h, w, t, st), None,
                 lambda n: np.zeros(n // 2, np.uint8).__dlpack__(), 0, 0, 1.0, 0.0, 0, 0, 0)
    with pytest.raises(TypeError):
        ext.head(c._handle, 0, _args(h, w, t, st), None, lambda n: "x", 0, 0, 1.0, 0.0,
                 0, 0, 0)
    with pytest.raises(spanhead.WorkspaceError, match="no allocator"):
        ext.head(c._handle, 0, _args(h, w, t, st), None, None, 0, 0, 1.0, 0.0, 0, 0, 0)
    assert [sys.getrefcount(a) for a in (h, w, t, st)] == before
    c.close()


def test_garbage_arguments():
    c = spanhead.Context()
    with pytest.raises(TypeError):
        ext.head(c._handle, 0, (None,) * 3, None, None, 0, 0, 1.0, 0.0, 0, 0, 0)
    with pytest.raises(TypeError):
        ext.head(c._handle, 0, (1,) * len(_SLOTS), None, None, 0, 0, 1.0, 0.0, 0, 0, 0)
    with pytest.raises(TypeError):
        ext.head("not a context", 0, (None,) * len(_SLOTS), None, None, 0, 0, 1.0, 0.0, 0, 0, 0)
    with pytest.raises(TypeError):
        ext.ctx_describe(np.zeros(2).__dlpack__())  # a capsule, but not a context
    with pytest.raises(TypeError):
        ext.layout_packed(1, 1, 0, ["a"])
    with pytest.raises(spanhead.ShapeError):
        ext.spans_build(0, 2, 5, 2, b"\x01", None, None, None, 1, 1, 0, 0, 128)
    with pytest.raises(spanhead.ShapeError):
        ext.spans_build(1, 1, 5, 2, b"\x01\x00", b"\x01", None, None, 1, 1, 0, 0, 128)
    with pytest.raises(spanhead.ShapeError):
        ext.spans_build(1, 2, 5, 2, b"\x01\x00\x00\x01", None, [5, 5], [3, 0], 1, 1, 0, 0, 128)
    with pytest.raises(spanhead.ShapeError):  # B * A overflows: checked before multiplying
        ext.spans_build(0, 2 ** 62, 5, 4, b"", None, None, None, 1, 1, 0, 0, 128)
    with pytest.raises(spanhead.InvalidArgumentError):
        ext.cp_local_rows(-4, 2, 0)
    with pytest.raises(spanhead.InvalidArgumentError):
        ext.comm_create(7, 0, None)
    with pytest.raises(spanhead.InvalidArgumentError):
        ext.comm_create(2, 0, (1, 1, 1, 10, 0, 10, (2, 32), 1.0))  # NULL ncclComm_t
    ext.ctx_destroy(c._handle)
    ext.ctx_destroy(c._handle)  # idempotent
    with pytest.raises(TypeError):
        ext.ctx_describe(c._handle)


class Legacy:
    """A producer of the pre-1.0 protocol: no max_version, legacy capsules only."""

    def __init__(self, a):
        self.a, self.shape = a, a.shape

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_legacy_producer_and_capsules():
    c = spanhead.Context(kernel="ref")
    rng = np.random.default_rng(3)
    h = rng.standard_normal((4, 3)).astype(np.float32)
    w = rng.standard_normal((6, 3)).astype(np.float32)
    t = np.array([0, 5, -1, 2])
    ref = spanhead.head_forward(h, w, t, context=c).logprob
    got = spanhead.head_forward(Legacy(h), Legacy(w), Legacy(t), context=c).logprob
    assert np.array_equal(got, ref)
    # a bare capsule is a fine input for shapeless slots, but hidden needs its shape
    got = spanhead.head_forward(h, w, t.__dlpack__(), context=c).logprob
    assert np.array_equal(got, ref)
    with pytest.raises(spanhead.DTypeError, match="hidden: expected a tensor"):
        spanhead.head_forward(h.__dlpack__(), w, t, context=c)


def test_threads_share_nothing():
    """Calls from several threads at once (the GIL is released during the compute): default
    contexts are per thread, and each thread reads its own error message."""
    import threading

    rng = np.random.default_rng(4)
    N, H, V = 64, 16, 300
    h = rng.standard_normal((N, H)).astype(np.float32)
    w = rng.standard_normal((V, H)).astype(np.float32)
    t = rng.integers(0, V, N)
    ref = spanhead.head_forward(h, w, t).logprob
    failures = []

    def work(k):
        try:
            for i in range(20):
                if (i + k) % 3 == 0:
                    bad = t.copy()
                    bad[k] = V + k
                    try:
                        spanhead.head_forward(h, w, bad)
                    except spanhead.InvalidArgumentError as e:
                        if f"targets[{k}]" not in str(e):
                            failures.append(f"thread {k}: foreign message {e}")
                    else:
                        failures.append(f"thread {k}: bad target accepted")
                elif not np.array_equal(spanhead.head_forward(h, w, t).logprob, ref):
                    failures.append(f"thread {k}: result differs")
        except Exception as e:  # noqa: BLE001
            failures.append(f"thread {k}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not failures, failures


def test_clean_interpreter_exit():
    """Contexts and communicators left open are closed at exit without a crash."""
    import os
    import subprocess

    code = ("import numpy as np, spanhead\n"
            "c = spanhead.Context(comm=spanhead.Comm.none())\n"
            "spanhead.head_forward(np.ones((2, 2), np.float32), np.ones((3, 2), np.float32),\n"
            "                      np.zeros(2, np.int64), context=c)\n"
            "keep = (c, spanhead.Context(kernel='ref'))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
