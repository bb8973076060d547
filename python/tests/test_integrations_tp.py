"""Vocabulary-parallel adapters over a real torch.distributed gloo group of 2 CPU processes
(tp_integrations_worker.py, which takes any number of ranks: verl's contract against verl's
torch functions on the full vocabulary, SkyRL's against SkyRL's own vocab-parallel torch
backend, verl's ppo_loss over the group against one process). Skips visibly without verl and
SkyRL installed."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not installed")
import frameworks  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tp_integrations_worker.py")


@pytest.mark.parametrize("world", [2])
def test_tp_gloo(tmp_path, world):
    frameworks.use("verl")
    frameworks.use("skyrl")
    store = tmp_path / "store"
    # gloo on the loopback interface (not the one the hostname resolves to): local traffic only
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    procs = [subprocess.Popen([sys.executable, WORKER, str(r), str(world), str(store)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env) for r in range(world)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for r, (p, o) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"RANK {r} OK" in o, f"rank {r}:\n{o[-4000:]}"
