"""The policy-gradient example runs, learns, and its head log-probs match its sampler."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
EXAMPLE = os.path.join(ROOT, "examples", "policy_gradient.py")


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


def test_readme_python_quick_start():
    """The Python block of README.md's "Python quick start" runs as written."""
    pytest.importorskip("torch")
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Python quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "README.md: no python block in the quick start"
    p = subprocess.run([sys.executable, "-c", blocks[0]], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "torch.Size([8])" in p.stdout


def test_grpo_hf_example():
    """examples/grpo_hf.py: spanhead's GRPO step (general path, and the fused policy loss
    where this spanhead has it) gives plain torch's loss and gradients, and the loss falls."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "grpo_hf.py"),
                        "--device", "cpu", "--steps", "2"], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "general  loss" in p.stdout and "MISMATCH" not in p.stdout
    first = float(p.stdout.split("step 0: loss ")[1].split()[0])
    after = float(p.stdout.split("after 2 steps: loss ")[1].split()[0])
    assert after < first, p.stdout
