"""examples/verl_fused_kernels.py, skyrl_fused_logprob.py and trl_grpo.py run and print PASS
(each skips visibly when its framework is not installed in build-integrations/)."""
import os
import subprocess
import sys

import pytest

import frameworks

EXAMPLES = os.path.join(frameworks.ROOT, "examples")


@pytest.mark.parametrize("framework,script", [("verl", "verl_fused_kernels.py"),
                                              ("skyrl", "skyrl_fused_logprob.py"),
                                              ("trl", "trl_grpo.py")])
def test_integration_example(framework, script):
    pytest.importorskip("torch", reason="torch is not installed")
    base = os.environ.get("SPANHEAD_INTEGRATIONS_DIR") or os.path.join(frameworks.ROOT,
                                                                       "build-integrations")
    if not os.path.isdir(os.path.join(base, framework, framework)):
        pytest.skip(f"{framework} is not installed in {base} (scripts/setup.sh installs it)")
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, script)], capture_output=True,
                       text=True, timeout=600, cwd=EXAMPLES, env=dict(os.environ))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "PASS", p.stdout[-3000:]
