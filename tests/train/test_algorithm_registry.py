"""A new algorithm is one file: the toy in tests/assets/toy_algorithm.py, registered through
``flatlm.train.registry.register_algorithm`` and nothing else, runs a whole trial, trains
data-parallel, and appears in every table derived from the registry."""

import dataclasses
import pickle
import sys

import pytest
import torch

from flatlm.core.config import apply_overrides
from flatlm.models.checkpoint import load_checkpoint
from flatlm.runs.trial import TrialConfig, run_trial, tracked_params
from flatlm.storage.metrics_log import read_train_log
from flatlm.train import TrainConfig, resolve, train
from flatlm.train.algorithms import STEPS
from flatlm.train.config import ALGORITHMS
from flatlm.train.distributed import DATA_PARALLEL_STEPS
from flatlm.train.registry import (
    BUILT_IN,
    REGISTRY,
    Algorithm,
    AlgorithmDefaults,
    register_algorithm,
    unused_sections,
)
from tests.train.conftest import plugin_algorithm

TOY = "tests.assets.toy_algorithm"
LR = 1e-2


@pytest.fixture
def sign_sgd():
    """The toy, registered by importing its module as a user's code would; the registry is put
    back after, so that the other tests see the built-in table."""
    with plugin_algorithm(TOY) as toy:
        yield toy.SIGN_SGD


def _trial(**overrides) -> TrialConfig:
    return apply_overrides(TrialConfig(), {
        "source": "dyck:4", "model": "d16-h1-l1-i32", "train.algorithm": "sign_sgd",
        "train.steps": 3, "train.batch_size": 8, "train.lr": LR, "train.log_every": 1,
        "train.checkpoint_steps": [0, 1, 3], "measure.n_eval": 16, "measure.what": ["loss"],
        "train.warmup_steps": None,  # the toy's default, 0 (a trial's default config sets 20)
        **overrides})


def test_a_registered_toy_algorithm_runs_a_trial(sign_sgd, tmp_path):
    metrics = run_trial(_trial(), tmp_path)
    assert sorted(metrics) == [0, 1, 3] and "pretrain/kl" in metrics[3], metrics[3]
    losses = [row["train/loss"] for row in read_train_log(tmp_path).values()]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    before, after = (load_checkpoint(tmp_path / "checkpoints" / f"step-{s}")[0] for s in (0, 1))
    moved = total = 0
    for (name, a), b in zip(before.named_parameters(), after.parameters(), strict=True):
        delta = (b - a).detach().abs()
        changed = delta > 0
        # the toy's rule: an entry with a gradient moves by exactly the rate (warmup 0, its
        # default), to float32 rounding of the parameter
        assert torch.allclose(delta[changed], torch.full_like(delta[changed], LR),
                              rtol=1e-4), name
        moved, total = moved + int(changed.sum()), total + delta.numel()
    assert moved > total / 2, (moved, total)


def test_the_derived_tables_include_the_toy(sign_sgd):
    toy = sys.modules[TOY]
    assert ALGORITHMS["sign_sgd"] is sign_sgd.defaults
    assert STEPS["sign_sgd"] is toy.sign_sgd_step
    assert DATA_PARALLEL_STEPS["sign_sgd"] is toy.data_parallel_sign_sgd_step
    assert unused_sections("sign_sgd") == ["sam", "adversarial", "grow", "label_noise", "muon"]
    assert resolve(TrainConfig(algorithm="sign_sgd")).warmup_steps == 0  # its defaults
    params = tracked_params(_trial())
    assert params["train.algorithm"] == "sign_sgd" and params["train.dropout"] == 0.0
    assert not [k for k in params if k.startswith(("train.sam.", "train.label_noise."))]


def test_two_ranks_train_the_toy_as_one_process(sign_sgd, src, tiny_model, tmp_path):
    """Rank 1 is a process of its own: it gets the toy from rank 0. Two ranks sum the gradient
    in another order, which may flip the sign of an entry's near-zero gradient, no more."""
    cfg = TrainConfig(algorithm="sign_sgd", steps=2, batch_size=16, lr=LR, seed=1)
    one = train(cfg, src, tiny_model, tmp_path / "one", progress=False)
    two = train(dataclasses.replace(cfg, world_size=2), src, tiny_model, tmp_path / "two",
                progress=False)
    a = torch.cat([p.detach().reshape(-1) for p in one.model.parameters()])
    b = torch.cat([p.detach().reshape(-1) for p in two.model.parameters()])
    assert (a != b).float().mean() < 0.01
    assert [r["step"] for r in two.history] == [r["step"] for r in one.history]


def test_an_algorithm_without_a_data_parallel_update_runs_in_one_process(sign_sgd):
    register_algorithm(dataclasses.replace(sign_sgd, name="sign_sgd_alone",
                                           data_parallel_step=None))
    TrainConfig(algorithm="sign_sgd_alone", batch_size=8)
    with pytest.raises(ValueError, match=r"train\.world_size=2: train\.algorithm="
                                         r"'sign_sgd_alone' runs in one process only \(it has "
                                         r"no data-parallel update\); use train\.world_size=1"):
        TrainConfig(algorithm="sign_sgd_alone", batch_size=8, world_size=2)
    assert "sign_sgd_alone" not in DATA_PARALLEL_STEPS and "sign_sgd_alone" in STEPS


def test_every_built_in_crosses_to_a_rank():
    """A data-parallel rank gets the run's ``Algorithm`` by pickle: no lambdas in it."""
    for algorithm in BUILT_IN:
        assert pickle.loads(pickle.dumps(algorithm)) == algorithm


def test_an_unknown_algorithm_names_the_field_and_the_known_ones(sign_sgd):
    with pytest.raises(ValueError, match=r"train\.algorithm='signsgd': use one of adamw, sgd, "
                                         r"noreg, sam, adversarial, grow, label_noise, muon, "
                                         r"sign_sgd"):
        TrainConfig(algorithm="signsgd")
    with pytest.raises(ValueError, match=r"train\.algorithm='signsgd': use one of"):
        _trial(**{"train.algorithm": "signsgd"})


def test_a_name_is_registered_once_and_an_algorithm_is_checked_when_made(sign_sgd):
    assert register_algorithm(sign_sgd) is sign_sgd  # the same object again: a no-op
    other = dataclasses.replace(sign_sgd, one_process_reason="another")
    with pytest.raises(ValueError, match="'sign_sgd' is registered already"):
        register_algorithm(other)
    assert register_algorithm(other, replace=True) is REGISTRY["sign_sgd"] is other
    defaults = sign_sgd.defaults
    with pytest.raises(ValueError, match="name='sign-sgd': use an identifier"):
        Algorithm(name="sign-sgd", defaults=defaults, step=sign_sgd.step)
    with pytest.raises(ValueError, match="step='sign_sgd_step': give a function or 'module:name'"):
        Algorithm(name="x", defaults=defaults, step="sign_sgd_step")
    with pytest.raises(ValueError, match="optimizer='lion': use one of adamw, sgd"):
        AlgorithmDefaults(optimizer="lion", weight_decay=0.0, dropout=0.0, warmup_steps=0)
    with pytest.raises(ValueError, match="exactly one of warmup_steps and warmup_proportion"):
        AlgorithmDefaults(optimizer="sgd", weight_decay=0.0, dropout=0.0)


def test_an_algorithm_whose_section_has_no_settings_class_is_refused_by_name(sign_sgd):
    with pytest.raises(ValueError, match=r"algorithm: sign_sgd_tuned: section='sign' but "
                                         r"config=None: give the dataclass of its settings"):
        dataclasses.replace(sign_sgd, name="sign_sgd_tuned", section="sign")
