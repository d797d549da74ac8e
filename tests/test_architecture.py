"""The house's import edges: data flows down, nothing flows back up.

- The core library imports neither Ray nor MLflow (only flatlm/tracking/tracker.py may import
  MLflow).
- ``flatlm.measure`` imports neither ``flatlm.corpus`` nor ``flatlm.train`` nor ``datasets``: a
  trial on a host without ``datasets`` measures.
- ``flatlm.corpus`` imports no model code; ``flatlm.sources`` imports nothing of the stages below.
- A whole trial (train + measure, fresh data) runs with ``datasets`` unavailable.
"""

import json
import pkgutil
import subprocess
import sys

import pytest

import flatlm

CORE = sorted(m.name for m in pkgutil.walk_packages(flatlm.__path__, "flatlm.")
              if m.name != "flatlm.tracking.tracker")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_core_imports_without_ray_or_mlflow():
    code = (
        "import sys, importlib\n"
        "sys.modules['ray'] = None\nsys.modules['mlflow'] = None\n"
        f"for name in {CORE!r}:\n    importlib.import_module(name)\n"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr
    assert "flatlm.sources.pcfg" in CORE


def _loaded_after(modules: list[str]) -> set[str]:
    """The flatlm/datasets modules that importing ``modules`` loads, in a fresh interpreter."""
    code = (
        "import sys, importlib, json\n"
        f"for name in {modules!r}:\n    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('flatlm', 'datasets', "
        "'pyarrow')))))\n"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout))


MEASURE = [m for m in CORE if m.startswith("flatlm.measure")]


@pytest.mark.parametrize(("importer", "forbidden"), [
    (MEASURE, ("flatlm.corpus", "flatlm.train", "datasets", "pyarrow")),
    (["flatlm.corpus"], ("flatlm.models", "flatlm.train", "flatlm.measure")),
    ([m for m in CORE if m.startswith("flatlm.sources")],
     ("flatlm.models", "flatlm.train", "flatlm.measure", "flatlm.corpus", "datasets")),
])
def test_forbidden_import_edges(importer, forbidden):
    loaded = _loaded_after(importer)
    hits = sorted(m for m in loaded if m.startswith(forbidden))
    assert not hits, f"importing {importer[0]}.. loads {hits}"


def test_a_trial_runs_without_datasets(tmp_path):
    code = f"""
import sys
sys.modules["datasets"] = None  # import datasets -> ImportError
import torch
torch.set_num_threads(1)
from flatlm.core.config import apply_overrides
from flatlm.runs.trial import TrialConfig, run_trial
cfg = apply_overrides(TrialConfig(), {{
    "source": "dyck:4", "model": "d16-h1-l1-i32", "train.steps": 2, "train.batch_size": 4,
    "train.checkpoint_steps": [2], "train.warmup_steps": 1, "measure.n_eval": 8,
    "measure.n_downstream": 20, "measure.what": ["loss", "fisher", "probe", "lookup"],
    "measure.probe.epochs": 1, "measure.probe.seeds": 2}})
done = run_trial(cfg, {str(tmp_path)!r})
assert "probe/g_star/acc_mean" in done[2], done
"""
    result = _run(code)
    assert result.returncode == 0, result.stderr[-3000:]


def _internal_imports() -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    """module -> [(imported module, names imported from it)] over flatlm, sweeps and analysis,
    every import statement (module level or in a function), from their source."""
    import ast
    from pathlib import Path

    repo = Path(flatlm.__file__).resolve().parents[1]
    found = {}
    for package in ("flatlm", "sweeps", "analysis"):
        for path in sorted((repo / package).rglob("*.py")):
            parts = path.relative_to(repo).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            edges = []
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    edges.append((node.module, tuple(a.name for a in node.names)))
                elif isinstance(node, ast.Import):
                    edges += [(a.name, ()) for a in node.names]
            found[module] = [(m, names) for m, names in edges
                             if m.split(".")[0] in ("flatlm", "sweeps", "analysis")]
    return found


def test_no_import_cycle():
    imports = _internal_imports()

    def owner(name: str) -> str | None:  # the module an import names, or its package
        while name and name not in imports:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: {owner(t) for t, _ in edges} - {None, m} for m, edges in imports.items()}
    # a package importing its own submodules (lazy re-exports) is no cycle of layers
    graph = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    done, path = set(), []

    def visit(m: str) -> None:
        if m in path:
            raise AssertionError(f"import cycle: {' -> '.join([*path[path.index(m):], m])}")
        if m in done:
            return
        path.append(m)
        for t in sorted(graph.get(m, ())):
            visit(t)
        path.pop()
        done.add(m)

    for module in sorted(graph):
        visit(module)


def test_no_module_imports_another_modules_private_names():
    private = [f"{m}: from {t} import {name}" for m, edges in _internal_imports().items()
               for t, names in edges for name in names
               if name.startswith("_") and not name.startswith("__")]
    assert not private, private
