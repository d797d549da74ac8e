"""A new source is one file: the toy in tests/assets/toy_source.py, registered through
``flatlm.sources.register_source`` when imported and nothing else, runs a whole trial (train,
loss, Tr(F), probes with their reference rows) and gets a corpus."""

import importlib
import sys

import pytest

from flatlm.core.config import apply_overrides
from flatlm.runs.trial import TrialConfig, run_trial
from flatlm.sources import load, spec

TOY = "tests.assets.toy_source"


@pytest.fixture
def uniform_kind():
    """The toy, registered by importing its module as a plug-in; the registry is put back after."""
    saved = dict(spec.REGISTRY)
    sys.modules.pop(TOY, None)
    importlib.import_module(TOY)
    yield
    spec.REGISTRY.clear()
    spec.REGISTRY.update(saved)
    sys.modules.pop(TOY, None)


def test_a_registered_toy_source_runs_a_trial(uniform_kind, tmp_path):
    src = load("uniform:5,length=3")
    assert src.V == 5 and src.max_length == 3
    cfg = apply_overrides(TrialConfig(), {
        "source": "uniform:5,length=3", "model": "d16-h1-l1-i32", "train.steps": 4,
        "train.batch_size": 8, "train.warmup_steps": 1, "train.checkpoint_steps": [4],
        "measure.n_eval": 16, "measure.n_downstream": 60,
        "measure.what": ["loss", "fisher", "probe", "lookup"], "measure.probe.epochs": 2,
        "measure.probe.seeds": 2})
    metrics = run_trial(cfg, tmp_path / "trial")[4]
    assert metrics["pretrain/entropy"] == pytest.approx(1.6094379, abs=1e-6)  # log 5
    for key in ("probe/first/acc_mean", "random_init/first/acc_mean", "lookup/first/acc_mean",
                "probe/first/majority_acc", "flat/trace_fisher"):
        assert key in metrics, key
    with pytest.raises(ValueError, match="unknown"):
        load("uniform:5,colour=2")


def test_a_registered_toy_source_gets_a_corpus(uniform_kind, tmp_path):
    from flatlm.corpus import CorpusConfig, load_corpus, make_corpus

    src = load("uniform:5,length=3")
    splits, meta = load_corpus(make_corpus(src, CorpusConfig(n_train=20, seed=1), tmp_path / "c",
                                           progress=False), source=src)
    assert meta["label_rule"] == "word" and meta["num_classes"] == {"first": 5}
    assert len(splits["downstream"]["label_first"]) == 2
