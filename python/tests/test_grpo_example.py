"""examples/grpo_step.py runs (GRPO and DAPO steps) and agrees with the torch formulation."""

import os
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "grpo_step.py")


@pytest.mark.parametrize("kernel", ["ref", None])
def test_grpo_step_example(kernel):
    pytest.importorskip("torch")
    cmd = [sys.executable, EXAMPLE, "--steps", "1", "--prompts", "3"]
    if kernel:
        cmd += ["--kernel", kernel]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PASS" in p.stdout.splitlines()[-1], p.stdout
    assert sum(line.startswith("step 0 epoch") for line in p.stdout.splitlines()) == 8
