"""Finds and loads the C library into the extension module."""

from __future__ import annotations

import ctypes.util
import os

from . import _errors
from . import _spanhead as _ext

_PKG = os.path.dirname(os.path.abspath(__file__))


def _candidates() -> list[str]:
    env = os.environ.get("SPANHEAD_LIB")
    if env:
        return [env]  # explicit: no fallback hides a wrong path
    out = [os.path.join(_PKG, "libspanhead.so")]
    bdir = os.environ.get("SPANHEAD_BUILD_DIR")
    if bdir:
        out.append(os.path.join(bdir, "libspanhead.so"))
    repo = os.path.dirname(os.path.dirname(_PKG))  # python/spanhead -> repository root
    out += [os.path.join(repo, "build", "libspanhead.so"),
            os.path.join(repo, "build-python", "libspanhead.so")]
    found = ctypes.util.find_library("spanhead")
    if found:
        out.append(found)
    return out


def load() -> str:
    """Loads libspanhead (first candidate that exists) and returns its path."""
    _ext.set_error_classes(_errors.BY_STATUS)
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        _ext.load(path)
        return path
    raise ImportError("spanhead: cannot find libspanhead.so (tried: " + ", ".join(tried) +
                      "); set SPANHEAD_LIB to the library built by CMake")


LIBRARY_PATH = load()
