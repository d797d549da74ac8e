"""The analysis library raises, its scripts exit: what a user can fix (no accuracy column, no
store, a password in the URI, no tracking URI) is a ValueError naming the fix, which a caller
can catch; only a script's ``main`` turns it into one ``error:`` line and an exit status
(tests/test_architecture.py pins that no library function exits)."""

import argparse

import pytest

from analysis.replication import load
from analysis.store import accuracy_key, check_store, refuse_password


def test_the_store_helpers_raise_a_value_error_naming_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"no probe/<task>/acc_mean column in the runs; pass "
                                         "--task"):
        accuracy_key(["pretrain/kl"], None)
    assert accuracy_key(["probe/B/acc_mean", "probe/A/acc_mean"], None) == "probe/A/acc_mean"
    missing = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(ValueError, match="no MLflow store at .*: run the report where the "
                                         "sweep ran"):
        check_store(missing, "synth")
    assert list(tmp_path.iterdir()) == []  # no store created by looking
    with pytest.raises(ValueError, match="holds a password") as e:
        refuse_password("http://me:s3cret@host:5000")
    assert "s3cret" not in str(e.value)


def test_replication_load_without_a_store_is_a_value_error(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    args = argparse.Namespace(trials=None, tracking_uri=None, experiments="replicate.paper.steps")
    with pytest.raises(ValueError, match=r"--experiments needs --tracking-uri \(or "
                                         r"\$MLFLOW_TRACKING_URI\)"):
        load(args)
