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
