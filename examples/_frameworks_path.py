"""For the integration examples: with a full install of the framework (`pip install verl`,
`skyrl`, `trl`) this does nothing. With scripts/setup.sh's dependency-free installs in
build-integrations/<framework> (CI, this repository), it loads the framework the way the
integration tests do (python/tests/frameworks.py: the framework's folder on sys.path, and
the package __init__ files that pull in ray skipped)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load(framework, probe):
    try:
        __import__(probe)
        return
    except ImportError:
        pass
    sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))
    import frameworks
    loader = getattr(frameworks, f"load_{framework}", None)
    try:
        loader() if loader else frameworks.use(framework)
    except (Exception, getattr(frameworks.pytest, "skip").Exception) as e:
        sys.exit(f"{framework} is not installed ({e}); run scripts/setup.sh or "
                 f"pip install {framework}")
