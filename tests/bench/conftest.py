"""What the bench script tests share: a script of bench/ imported as a module."""

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).parents[2] / "bench"


def bench_script(name: str) -> ModuleType:
    """bench/<name>.py imported as the module ``name`` (bench/ is no package: its scripts are
    run by path), not run as __main__."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
