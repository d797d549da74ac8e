"""The core library imports neither Ray nor MLflow (only flatlm/track.py may import MLflow)."""

import pkgutil
import subprocess
import sys

import flatlm

CORE = sorted(m.name for m in pkgutil.walk_packages(flatlm.__path__, "flatlm.")
              if m.name != "flatlm.track")


def test_core_imports_without_ray_or_mlflow():
    code = (
        "import sys, importlib\n"
        "sys.modules['ray'] = None\nsys.modules['mlflow'] = None\n"
        f"for name in {CORE!r}:\n    importlib.import_module(name)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert "flatlm.sources.pcfg" in CORE
