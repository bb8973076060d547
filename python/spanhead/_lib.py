"""Finds and loads the C library into the extension module."""

from __future__ import annotations

import ctypes
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


def _carried(lib_dir: str) -> None:
    """A wheel built with SPANHEAD_WHEEL_LIBS=auto carries the libraries libspanhead needs
    beyond glibc in spanhead/.libs. Each is used only where the process has no library of that
    soname and the machine's dynamic linker finds none: then it is loaded from the wheel, so
    libspanhead's dependency resolves to it. No LD_LIBRARY_PATH either way."""
    libs = os.path.join(lib_dir, ".libs")
    if not os.path.isdir(libs):
        return
    pending = sorted(os.listdir(libs))
    for _ in range(len(pending) + 1):  # dependencies among them: retry until no progress
        left = []
        for name in pending:
            try:
                ctypes.CDLL(name)  # already loaded, or the machine has it
                continue
            except OSError:
                pass
            try:
                ctypes.CDLL(os.path.join(libs, name))
            except OSError:
                left.append(name)
        if len(left) == len(pending):
            break
        pending = left


def load() -> str:
    """Loads libspanhead (first candidate that exists) and returns its path."""
    _ext.set_error_classes(_errors.BY_STATUS)
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        _carried(os.path.dirname(os.path.abspath(path)))
        _ext.load(path)
        return path
    raise ImportError("spanhead: cannot find libspanhead.so (tried: " + ", ".join(tried) +
                      "); set SPANHEAD_LIB to the library built by CMake")


LIBRARY_PATH = load()
