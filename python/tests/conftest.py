"""Shared fixtures: a seeded RNG (SPH_TEST_SEED or fresh, printed on failure), contexts for
each CPU kernel set, and the float64 NumPy reference of the LM head."""

import os
import time

import numpy as np
import pytest

import spanhead

_SEED = int(os.environ.get("SPH_TEST_SEED") or (time.time_ns() & 0xFFFFFFFF))


def pytest_report_header(config):
    return [f"spanhead: library {spanhead.LIBRARY_PATH} ({spanhead.library_version()}), "
            f"SPH_TEST_SEED={_SEED}"]


@pytest.fixture
def rng(request):
    # one stream per test, reproducible from the printed seed and the test's name
    h = sum(ord(c) * 131 ** (i % 7) for i, c in enumerate(request.node.name)) & 0xFFFFFFFF
    return np.random.default_rng([_SEED, h])


@pytest.fixture(params=["ref", "default"])
def ctx(request):
    """A CPU context for the float64 reference kernels and one for the default (optimized)."""
    kernel = None if request.param == "default" else request.param
    c = spanhead.Context("cpu", kernel=kernel)
    c.kind = request.param
    yield c
    c.close()


def run_or_skip(ctx, fn, *a, **kw):
    """Runs fn; where the optimized CPU kernels are not in this build yet, skips visibly."""
    try:
        return fn(*a, context=ctx, **kw)
    except spanhead.UnsupportedError as e:
        if ctx.kind == "default" and "not built" in str(e):
            pytest.skip(f"default CPU kernels not in this library build: {e}")
        raise


# Context options for the two CPU kernel sets the torch tests run on: the float64 reference
# and the library's default (optimized) kernels.
@pytest.fixture(params=["ref", "default"])
def kernel(request):
    if request.param == "default":
        try:
            c = spanhead.Context("cpu")
            spanhead.head_forward(np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32),
                                  np.zeros(1, np.int64), context=c)
        except spanhead.UnsupportedError as e:
            pytest.skip(f"default CPU kernels not in this library build: {e}")
        return {}
    return {"kernel": request.param}
