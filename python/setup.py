"""Build of the spanhead Python package: one C extension (stable ABI) plus the C library.

Where the C library comes from, first match wins:
  SPANHEAD_LIB=/path/libspanhead.so   use that file
  SPANHEAD_BUILD_DIR=/path/build      use <dir>/libspanhead.so of an existing CMake build
  otherwise                           configure and build the repository with CMake into
                                      <repo>/build-python (incremental on later installs)
The library is copied into the package (spanhead/libspanhead.so); the extension does not link
it but dlopens it at import, so the same extension binary serves every build of the library.
`python setup.py build_ext --inplace` (what `make python-test` runs) builds only the extension;
the package then finds the library through SPANHEAD_LIB or the repository's build/ folder.

The extension uses the CPython stable ABI (Py_LIMITED_API = 3.9), so the file it produces,
_spanhead.abi3.so, imports on every CPython >= 3.9 (3.11 here, 3.12 on the GPU machine).
"""

import os
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


def _cmake_library():
    """Configures and builds libspanhead with CMake; returns the path of the shared library."""
    build = os.path.join(ROOT, "build-python")
    jobs = str(os.cpu_count() or 2)
    cfg = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
           "-DSPH_BUILD_TESTS=OFF", "-DSPH_BUILD_BENCH=OFF", "-DSPH_BUILD_CLI=OFF"]
    cfg += os.environ.get("SPANHEAD_CMAKE_ARGS", "").split()
    subprocess.check_call(cfg)
    subprocess.check_call(["cmake", "--build", build, "--target", "spanhead", "-j", jobs])
    return os.path.join(build, "libspanhead.so")


def _library():
    lib = os.environ.get("SPANHEAD_LIB")
    if lib:
        return lib
    bdir = os.environ.get("SPANHEAD_BUILD_DIR")
    if bdir:
        return os.path.join(bdir, "libspanhead.so")
    return _cmake_library()


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
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
