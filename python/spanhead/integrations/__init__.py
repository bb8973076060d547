"""One-line adapters of spanhead for RL frameworks (docs/integrations.md).

    import spanhead.integrations.verl as shv;  shv.patch()      # verl's use_fused_kernels path
    import spanhead.integrations.skyrl as shs; shs.patch()      # SkyRL's fused LM-head backend
    import spanhead.integrations.trl as sht;   sht.patch_grpo(trainer)   # TRL's GRPOTrainer

Nothing here imports a framework (or torch) at ``import spanhead`` or at the import of this
package: each submodule imports torch, and its framework only inside ``patch()`` and the
functions that need the framework's own code. Each ``patch()`` checks the installed framework
version against the range the adapter was tested with (:func:`check_version`).
"""
from __future__ import annotations

import importlib.metadata
import re
import warnings
from typing import Set, Tuple

from .._errors import UnsupportedError

__all__ = ["check_version", "warn_once"]


def _parse(v: str) -> Tuple[int, ...]:
    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", v)
    if not m:
        return ()
    return tuple(int(x or 0) for x in m.groups())


def check_version(dist: str, low: str, high: str) -> str:
    """The installed version of distribution ``dist`` when ``low <= version < high``;
    else :class:`spanhead.UnsupportedError` naming the version and the supported range
    (also when the distribution is not installed)."""
    try:
        v = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        raise UnsupportedError(f"{dist} is not installed (spanhead.integrations.{dist} "
                               f"supports {dist} >={low},<{high})") from None
    pv = _parse(v)
    if not pv or not (_parse(low) <= pv < _parse(high)):
        raise UnsupportedError(f"{dist} {v} is not supported by spanhead.integrations."
                               f"{dist}: supported {dist} >={low},<{high}")
    return v


_warned: Set[str] = set()


def warn_once(key: str, message: str) -> None:
    """A UserWarning the first time ``key`` is seen in this process (the fallbacks')."""
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, UserWarning, stacklevel=3)
