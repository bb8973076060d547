"""Packaging: `pip wheel ./python` gives a wheel that carries libspanhead and imports from
anywhere without LD_LIBRARY_PATH, SPANHEAD_LIB or the source tree; the build shows its
progress without pip's -v when a person is at a terminal (a pseudo-terminal here).

Uses the CMake build of $SPANHEAD_BUILD_DIR (make python-test sets it; the wheel then brings it
up to date, a few seconds), setuptools from the running environment (no build isolation, no
download) and pip. Skipped, saying why, where one of them is missing.
"""

import glob
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("SPANHEAD_BUILD_DIR")

pytestmark = [
    pytest.mark.skipif(not BUILD or not os.path.exists(os.path.join(BUILD or "", "CMakeCache.txt")),
                       reason="SPANHEAD_BUILD_DIR (a configured CMake build) is not set"),
]


def _need(mod):
    try:
        __import__(mod)
    except ImportError:
        pytest.skip(f"{mod} is not installed in this environment (no build isolation here)")


def _need_bdist_wheel():
    """pip wheel --no-build-isolation needs bdist_wheel: setuptools >= 70.1 has it, older ones
    take it from the wheel package."""
    _need("setuptools")
    try:
        import setuptools.command.bdist_wheel  # noqa: F401
    except ImportError:
        _need("wheel")


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_LIBRARY_PATH", "SPANHEAD_LIB", "PYTHONPATH", "SPANHEAD_CLI")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    _need_bdist_wheel()
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
           "-w", str(out), os.path.join(ROOT, "python")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                       env=_clean_env(SPANHEAD_BUILD_DIR=BUILD, SPANHEAD_QUIET="1",
                                      SPANHEAD_WHEEL_LIBS="auto"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    found = glob.glob(str(out / "spanhead-*.whl"))
    assert len(found) == 1, found
    return found[0]


def test_wheel_carries_library_and_stable_abi_extension(wheel):
    assert wheel.endswith("-cp39-abi3-linux_x86_64.whl"), wheel
    names = zipfile.ZipFile(wheel).namelist()
    for f in ("spanhead/libspanhead.so", "spanhead/_spanhead.abi3.so", "spanhead/torch.py",
              "spanhead/hf.py", "spanhead/_torch_ops.py", "spanhead/integrations/__init__.py",
              "spanhead/integrations/verl.py", "spanhead/integrations/skyrl.py",
              "spanhead/integrations/trl.py", "spanhead/integrations/_tp.py"):
        assert f in names, f"{f} missing from {names}"
    # SPANHEAD_WHEEL_LIBS=auto: the non-glibc libraries libspanhead needs ride along
    carried = {os.path.basename(n) for n in names if n.startswith("spanhead/.libs/")}
    assert "libopenblas.so.0" in carried and "libgomp.so.1" in carried, carried
    assert not any(n.startswith(("libc.so", "libstdc++", "libcudart", "libcublas", "libnccl"))
                   for n in carried), carried


def test_wheel_installs_and_runs_without_ld_library_path(wheel, tmp_path):
    target = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                        str(target), wheel], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    lib = target / "spanhead" / "libspanhead.so"
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    assert "NEEDED" in needed
    for bad in ("libcudart", "libcublas", "libnccl"):
        assert bad not in needed, f"the wheel's library needs {bad}:\n{needed}"
    code = ("import spanhead, numpy as np\n"
            "h = np.ones((3, 4), np.float32); w = np.eye(5, 4, dtype=np.float32)\n"
            "r = spanhead.head_forward(h, w, np.array([0, 1, -1]))\n"
            "print(spanhead.LIBRARY_PATH); print(r.logprob.tolist())")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(tmp_path), timeout=120,
                         env=_clean_env(PYTHONPATH=str(target), SPANHEAD_BUILD_DIR=""))
    assert run.returncode == 0, run.stderr[-3000:]
    path, lp = run.stdout.strip().splitlines()
    assert os.path.realpath(path) == os.path.realpath(str(lib))  # the wheel's own copy
    lp = eval(lp)  # noqa: S307 - our own printout
    assert lp[2] == 0.0 and abs(lp[0] - lp[1]) < 1e-6 and lp[0] < 0


@pytest.mark.skipif(shutil.which("script") is None, reason="util-linux `script` (a pty) missing")
def test_build_shows_progress_on_a_terminal(tmp_path):
    """pip without -v captures the build's output; the progress still reaches the terminal."""
    _need_bdist_wheel()
    cmd = (f"{sys.executable} -m pip wheel --no-build-isolation --no-deps -w {tmp_path} "
           f"{os.path.join(ROOT, 'python')}")
    p = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, text=True,
                       timeout=900, env=_clean_env(SPANHEAD_BUILD_DIR=BUILD))
    assert p.returncode == 0, p.stdout[-3000:]
    assert "spanhead: bringing the CMake build" in p.stdout, p.stdout[-3000:]
    assert "spanhead: [" in p.stdout and "Built target spanhead" in p.stdout, p.stdout[-3000:]
    assert os.path.exists(os.path.join(BUILD, "spanhead-pip-build.log"))
