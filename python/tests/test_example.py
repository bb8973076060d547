"""The policy-gradient example runs, learns, and its head log-probs match its sampler."""

import os
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "policy_gradient.py")


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_policy_gradient_example(backend):
    if backend == "torch":
        pytest.importorskip("torch")
    p = subprocess.run([sys.executable, EXAMPLE, "--steps", "30", "--kernel", "ref",
                        "--backend", backend], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    assert p.returncode == 0, p.stdout + p.stderr
    rewards = [float(line.split()[3]) for line in p.stdout.splitlines()
               if line.startswith("step")]
    assert rewards[-1] > rewards[0] + 0.3, p.stdout
