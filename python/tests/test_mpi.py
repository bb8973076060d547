"""Tensor parallelism through the binding: spanhead.Comm.from_mpi4py under mpirun (skipped
without mpi4py, mpirun or an MPI build of the library)."""

import os
import shutil
import subprocess
import sys

import pytest

import spanhead

pytest.importorskip("mpi4py")
if "sph_comm_create_mpi" in spanhead.missing_functions():
    pytest.skip("the loaded libspanhead has no MPI communicator", allow_module_level=True)
MPIRUN = shutil.which("mpirun") or shutil.which("mpiexec")
if not MPIRUN:
    pytest.skip("no mpirun on PATH", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = {"OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1",
       "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,vader",
       "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
       "OMPI_MCA_btl_base_warn_component_unused": "0", "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("np_", [2, 3])
def test_tp_from_mpi4py(rng, np_):
    seed = int(rng.integers(1 << 31))
    env = dict(os.environ, **ENV)
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", str(np_),
                        sys.executable, os.path.join(HERE, "mpi_tp_worker.py"), str(seed)],
                       capture_output=True, text=True, timeout=240, env=env)
    if p.returncode != 0 and "built without MPI" in p.stdout + p.stderr:
        pytest.skip("the loaded libspanhead was built without MPI (sph_comm_create_mpi says so)")
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"mpi tp ok: {np_} ranks" in p.stdout
