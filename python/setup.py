"""Build of the spanhead Python package: one C extension (stable ABI) plus the C library.

Where the C library comes from, first match wins:
  SPANHEAD_LIB=/path/libspanhead.so   use that file
  SPANHEAD_BUILD_DIR=/path/build      use (and bring up to date) an existing CMake build
  otherwise                           configure and build the repository with CMake into
                                      <repo>/build-python (incremental on later installs)
CMake's progress is shown even without pip's -v (on the terminal, /dev/tty) and logged in
<build>/spanhead-pip-build.log; SPANHEAD_QUIET=1 keeps it in the log.
The library is copied into the package (spanhead/libspanhead.so); the extension does not link
it but dlopens it at import, so the same extension binary serves every build of the library.
`python setup.py build_ext --inplace` (what `make python-test` runs) builds only the extension;
the package then finds the library through SPANHEAD_LIB or the repository's build/ folder.

The extension uses the CPython stable ABI (Py_LIMITED_API = 3.9), so the file it produces,
_spanhead.abi3.so, imports on every CPython >= 3.9 (3.11 here, 3.12 on the GPU machine).
"""

import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("SPANHEAD_SOURCE_DIR") or os.path.dirname(HERE)
HEADER = os.path.join(ROOT, "include", "spanhead.h")
if not os.path.exists(HEADER):
    sys.exit(f"spanhead: cannot find include/spanhead.h under {ROOT}; build from the repository "
             "checkout (pip install ./python) or set SPANHEAD_SOURCE_DIR")


def _version():
    """The package's version: the library's, SPH_VERSION_MAJOR/MINOR/PATCH of spanhead.h."""
    with open(HEADER) as f:
        text = f.read()
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(r"^#define SPH_VERSION_%s +([0-9]+)" % part, text, re.M)
        if not m:
            sys.exit(f"spanhead: {HEADER} has no SPH_VERSION_{part}")
        parts.append(m.group(1))
    return ".".join(parts)


class _Progress:
    """Build progress for a person at a terminal: pip captures a build backend's output and
    shows it only with -v, so while pip's stderr is not a terminal the progress lines also go
    to /dev/tty when there is one. Every line of the CMake output goes to the log file."""

    def __init__(self, log_path):
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        self.log = open(log_path, "w")
        self.tty = None
        if not sys.stderr.isatty() and os.environ.get("SPANHEAD_QUIET") != "1":
            try:
                self.tty = open("/dev/tty", "w")
            except OSError:
                self.tty = None

    def say(self, line, full=False):
        self.log.write(line + "\n")
        self.log.flush()
        if full:
            return
        print(line, file=sys.stderr, flush=True)
        if self.tty is not None:
            self.tty.write(line + "\n")
            self.tty.flush()

    def run(self, cmd):
        self.say("spanhead: $ " + " ".join(cmd))
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             bufsize=1)
        for line in p.stdout:
            line = line.rstrip()
            # CMake's own lines and make's "[ 42%] Building ..." lines, errors and warnings
            keep = (line.startswith(("-- ", "[", "CMake")) or "error" in line.lower() or
                    "warning" in line.lower())
            self.say("spanhead: " + line if keep else line, full=not keep)
        if p.wait() != 0:
            self.say(f"spanhead: {cmd[0]} failed (exit {p.returncode}); the full output is in "
                     f"{self.log.name}")
            sys.exit(p.returncode)


def _cmake_build(build, configure):
    """Configures (when asked) and builds the library target of a CMake build folder, with
    progress (see _Progress); returns the path of the shared library."""
    prog = _Progress(os.path.join(build, "spanhead-pip-build.log"))
    jobs = os.environ.get("SPANHEAD_JOBS") or str(os.cpu_count() or 2)
    if configure:
        cfg = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
               "-DSPH_BUILD_TESTS=OFF", "-DSPH_BUILD_BENCH=OFF", "-DSPH_BUILD_CLI=OFF"]
        cfg += os.environ.get("SPANHEAD_CMAKE_ARGS", "").split()
        prog.say(f"spanhead: building libspanhead with CMake in {build} ({jobs} jobs; CUDA "
                 f"kernels take minutes on a small machine; log: {prog.log.name})")
        prog.run(cfg)
    else:
        prog.say(f"spanhead: bringing the CMake build {build} up to date")
    prog.run(["cmake", "--build", build, "--target", "spanhead", "-j", jobs])
    return os.path.join(build, "libspanhead.so")


def _library():
    lib = os.environ.get("SPANHEAD_LIB")
    if lib:
        return lib
    bdir = os.environ.get("SPANHEAD_BUILD_DIR")
    if bdir:
        return _cmake_build(os.path.abspath(bdir), configure=False)
    return _cmake_build(os.path.join(ROOT, "build-python"), configure=True)


class BuildExt(build_ext):
    def run(self):
        super().run()
        if self.inplace:
            return  # in-tree use: the package finds the library at run time
        lib = os.path.realpath(_library())
        if not os.path.exists(lib):
            sys.exit(f"spanhead: {lib} does not exist")
        dest = os.path.join(self.build_lib, "spanhead", "libspanhead.so")
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(lib, dest)
        # a previous build's carried libraries (setuptools reuses build/) never ride along
        shutil.rmtree(os.path.join(self.build_lib, "spanhead", ".libs"), ignore_errors=True)
        if os.environ.get("SPANHEAD_WHEEL_LIBS") == "auto":
            _vendor(dest, os.path.join(self.build_lib, "spanhead", ".libs"))


# Libraries every Linux has (glibc and the C++ runtime): never carried. CUDA libraries are not
# in the list because libspanhead does not need any (docs/python.md, coexistence).
_SYSTEM = ("libc.so", "libm.so", "libdl.so", "libpthread.so", "librt.so", "ld-linux",
           "libstdc++.so", "libgcc_s.so", "linux-vdso")


def _vendor(lib, dest):
    """SPANHEAD_WHEEL_LIBS=auto: copies the shared libraries libspanhead needs beyond glibc
    (OpenBLAS, its Fortran runtime, libgomp, MPI when built with it) into spanhead/.libs, for
    a wheel that goes to a machine without them; the package loads them only where the
    machine lacks a library of that soname (spanhead/_lib.py)."""
    out = subprocess.run(["ldd", lib], capture_output=True, text=True, check=True).stdout
    os.makedirs(dest, exist_ok=True)
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/"):
            name, path = parts[0], parts[2]
            if not name.startswith(_SYSTEM):
                shutil.copyfile(path, os.path.join(dest, name))
                print(f"spanhead: carrying {name} ({path}) in the wheel", file=sys.stderr)


ext = Extension(
    "spanhead._spanhead",
    sources=sorted(os.path.join("csrc", f) for f in os.listdir(os.path.join(HERE, "csrc"))
                   if f.endswith(".c")),
    include_dirs=[os.path.join(ROOT, "include")],
    define_macros=[("Py_LIMITED_API", "0x03090000")],
    py_limited_api=True,
    libraries=["dl"],
    extra_compile_args=["-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
)

setup(
    version=_version(),
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
