"""The adapters import no framework: `import spanhead` and `import spanhead.integrations`
import neither torch nor any framework; importing an adapter imports torch but not its
framework (that happens in patch() and the fallbacks); check_version's errors."""
import subprocess
import sys

import pytest

import spanhead
from spanhead.integrations import check_version

FRAMEWORKS = ("verl", "skyrl", "trl", "megatron", "accelerate", "datasets", "ray")


def _loaded(code):
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sorted("
                          "m for m in sys.modules if m.split('.')[0] in "
                          f"{FRAMEWORKS + ('torch',)!r})))"],
                         capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_import_spanhead_imports_no_framework():
    assert _loaded("import spanhead, spanhead.integrations") == set()


def test_adapters_import_no_framework():
    pytest.importorskip("torch", reason="torch is not installed")
    for adapter in ("verl", "skyrl", "trl"):
        mods = _loaded(f"import spanhead.integrations.{adapter}")
        roots = {m.split(".")[0] for m in mods}
        assert "torch" in roots and not roots & set(FRAMEWORKS), (adapter, mods)


def test_check_version_errors(monkeypatch):
    import importlib.metadata as md
    with pytest.raises(spanhead.UnsupportedError, match="not installed"):
        check_version("spanhead-no-such-distribution", "1.0", "2")
    monkeypatch.setattr(md, "version", lambda d: "2.0.1")
    with pytest.raises(spanhead.UnsupportedError, match=r"x 2\.0\.1 .*>=1\.0,<2"):
        check_version("x", "1.0", "2")
    monkeypatch.setattr(md, "version", lambda d: "1.9.9rc1")
    assert check_version("x", "1.0", "2") == "1.9.9rc1"
    monkeypatch.setattr(md, "version", lambda d: "garbage")
    with pytest.raises(spanhead.UnsupportedError, match="garbage"):
        check_version("x", "1.0", "2")
