"""Loading the RL frameworks' own code for the integration tests (test_integrations_*.py).

scripts/setup.sh installs each framework from PyPI without its heavy dependencies into
build-integrations/<framework> (``pip install --no-deps --target``, plus the few small
packages its tested modules import); SPANHEAD_INTEGRATIONS_DIR overrides the folder. A test
module calls :func:`use` first: it puts that folder at the front of sys.path, or skips the
module visibly when the framework is not installed.

Two frameworks' package ``__init__`` files import far more than the tested modules need
(verl's imports ray through verl.protocol; skyrl.backends' imports its pydantic API types,
which need Python 3.12): :func:`bare_package` registers such a package without running its
``__init__``, so its submodules (the real files) import as usual. Only
``verl.workers.config`` (ActorConfig, a type the loss functions check with isinstance; its
module pulls in ray through the profiler) is replaced, by :func:`verl_actor_config_stub`.
"""
from __future__ import annotations

import os
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def use(framework: str) -> str:
    base = os.environ.get("SPANHEAD_INTEGRATIONS_DIR") or os.path.join(ROOT, "build-integrations")
    d = os.path.join(base, framework)
    if not os.path.isdir(os.path.join(d, framework)):
        pytest.skip(f"{framework} is not installed in {d} (scripts/setup.sh installs it)",
                    allow_module_level=True)
    if d not in sys.path:
        sys.path.insert(0, d)
        _refresh_transformers()
    return d


def _refresh_transformers():
    """transformers caches which optional packages exist (accelerate, for TRL's trainer) when
    first asked: a module imported before this folder joined sys.path (test_hf.py, verl's
    tests) would leave it saying "not installed". Clear those caches."""
    import importlib
    importlib.invalidate_caches()
    iu = sys.modules.get("transformers.utils.import_utils")
    if iu is None:
        return
    for name in dir(iu):
        f = getattr(iu, name)
        if name.startswith("is_") and hasattr(f, "cache_clear"):
            f.cache_clear()


def bare_package(name: str, path: str) -> types.ModuleType:
    """Register package ``name`` (folder ``path``) without executing its __init__.py."""
    m = sys.modules.get(name)
    if m is not None:
        return m
    m = types.ModuleType(name)
    m.__path__ = [path]
    m.__file__ = os.path.join(path, "__init__.py")
    m.__package__ = name
    sys.modules[name] = m
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, m)
    return m


class ActorConfig:
    """Stand-in for verl.workers.config.ActorConfig: the attributes the loss functions read,
    and its dict-style get()."""

    def __init__(self, **kw):
        self.clip_ratio = 0.2
        self.clip_ratio_low = None
        self.clip_ratio_high = None
        self.loss_agg_mode = "token-mean"
        self.entropy_coeff = 0.0
        self.use_kl_loss = False
        self.kl_loss_type = "low_var_kl"
        self.kl_loss_coef = 0.0
        self.loss_scale_factor = None
        self.policy_loss = {"loss_mode": "vanilla"}
        self.global_batch_info = {}
        for k, v in kw.items():
            setattr(self, k, v)

    def get(self, key, default=None):
        return getattr(self, key, default)


def verl_actor_config_stub() -> None:
    if "verl.workers.config" not in sys.modules:
        m = types.ModuleType("verl.workers.config")
        m.ActorConfig = ActorConfig
        m.CriticConfig = type("CriticConfig", (), {})
        sys.modules["verl.workers.config"] = m


def load_verl():
    """The verl folder on sys.path, its top package registered bare; returns the folder."""
    d = use("verl")
    bare_package("verl", os.path.join(d, "verl"))
    verl_actor_config_stub()
    return d


def load_skyrl():
    """The skyrl folder (and its bundled skyrl-gym) on sys.path, skyrl.backends registered
    bare. ``ray`` is absent (it is SkyRL's distributed runtime, not the math): the policy-loss
    registry module imports it for its registry actor, used only once ray is initialized, so
    a stand-in with ``remote`` (identity) and ``is_initialized`` (False) takes its place."""
    d = use("skyrl")
    gym = os.path.join(d, "skyrl-gym")
    if os.path.isdir(gym) and gym not in sys.path:
        sys.path.insert(1, gym)
    import skyrl
    bare_package("skyrl.backends", os.path.join(os.path.dirname(skyrl.__file__), "backends"))
    if "ray" not in sys.modules:
        try:
            import ray  # noqa: F401
        except ImportError:
            ray = types.ModuleType("ray")
            ray.remote = lambda cls: cls
            ray.is_initialized = lambda: False
            sys.modules["ray"] = ray
    return d


def init_single_process_group(tmp_path_factory):
    """torch.distributed's default group of one gloo process (SkyRL's torch path all-reduces
    over its group unconditionally)."""
    import torch.distributed as dist
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")    # loopback only
    if not dist.is_initialized():
        f = tmp_path_factory.mktemp("dist") / "store"
        dist.init_process_group("gloo", init_method=f"file://{f}", rank=0, world_size=1)
    return dist.group.WORLD


def off_sys_path_afterwards(*frameworks):
    """A module-scoped fixture body: after the module's tests the framework folders leave
    sys.path (pytest collects every module first, so they are on it meanwhile; the venv and
    these folders share no package but idna and certifi, pinned alike)."""
    yield
    base = os.environ.get("SPANHEAD_INTEGRATIONS_DIR") or os.path.join(ROOT, "build-integrations")
    for fw in frameworks:
        for d in (os.path.join(base, fw), os.path.join(base, fw, "skyrl-gym")):
            while d in sys.path:
                sys.path.remove(d)


def close(a, b, tol=2e-5, what=""):
    """a (spanhead's, fp32) against b (the framework's, float64) within tol of b's scale.

    The losses are means of O(1e-2..1) per-token terms that can cancel: an absolute floor of
    5e-2 on a scalar's scale keeps the bound (1e-6, ~8 fp32 ulps of 1) at fp32 rounding of the
    O(1) terms; tensors (the gradients) keep a floor of 1e-2. The device's torch 2.11 rounded a
    verl pg_loss of 1.6e-3 6.6e-8 away from the float64 one (4e-5 of it); a fresh seed in CI
    put a SkyRL SAPO loss of 6e-4 2.4e-8 away; one put a verl pg_loss of -0.0117 2.34e-7 away,
    just past the old scalar floor of 1e-2's bound (2.34e-7). A wrong term or aggregation moves
    such a loss by 1e-3 or more."""
    import torch
    a = a.detach().double()
    b = b.detach().double()
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert torch.isfinite(a).all(), what
    scale = max(b.abs().max().item(), 5e-2 if b.dim() == 0 else 1e-2)
    err = (a - b).abs().max().item()
    assert err <= tol * scale, f"{what}: max error {err:.3g} vs scale {scale:.3g}"
