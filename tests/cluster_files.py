"""The cluster files the cluster tests read, never launch: cluster.yaml (AWS) and
cluster-local.yaml (on-premises), each as YAML. Importing this module skips the importing test
module where yaml or Ray is missing."""

import os
from pathlib import Path

import pytest

# Ray reads these when it is imported: set (unless the caller set them) before any test imports it
for _k, _v in {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
               "RAY_AUTH_MODE": "disabled"}.items():
    os.environ.setdefault(_k, _v)

yaml = pytest.importorskip("yaml")
pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[1]
FILES = ["cluster.yaml", "cluster-local.yaml"]


def load(name: str) -> dict:
    """The repository's cluster file ``name``, parsed."""
    return yaml.safe_load((REPO / name).read_text())
