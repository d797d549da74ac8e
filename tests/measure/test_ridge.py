"""The closed-form ridge probe: the least-squares solution it says, separable features read off,
random labels at chance, the penalty picked on held-out sentences, its keys beside the probe's."""

import pytest
import torch

from flatlm.measure import RIDGE_STATS, probe_key, ridge_stage
from flatlm.measure.probes.probe import ProbeConfig, prepared_features, split_indices
from flatlm.measure.probes.probe_batched import Task
from flatlm.measure.probes.ridge import (
    ALPHAS,
    _cholesky_solve,
    _ridge_tasks,
    ridge_feature_sets,
    ridge_metrics,
)
from tests.measure.conftest import blobs

CFG = ProbeConfig()


def _task(y, C, n=None):
    return Task("A", torch.ones(len(y) if n is None else n, dtype=torch.bool), y, C)


def test_separable_features_are_read_off_and_random_labels_are_at_chance():
    x, y = blobs(0)
    out = ridge_feature_sets({"probe": x}, [_task(y, 4)], CFG)["probe"]["A"]
    assert set(out) == set(RIDGE_STATS) and out["acc_mean"] == 1.0 and out["alpha"] in ALPHAS
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(1000, 30, generator=g), torch.randint(0, 2, (1000,), generator=g)
    out = ridge_feature_sets({"probe": x}, [_task(y, 2)], CFG)["probe"]["A"]
    assert 0.38 < out["acc_mean"] < 0.62
    assert out["acc_se"] == pytest.approx((out["acc_mean"] * (1 - out["acc_mean"]) / 200) ** 0.5)


def test_the_fit_is_the_penalised_least_squares_solution_in_float64():
    x, y = blobs(2, noise=2.0)
    train, test = split_indices(300, 0.2, 0)
    xs = prepared_features(x, train, CFG)
    out = _ridge_tasks(xs, [y], [4], train, test, seed=0)[0]
    X = xs[train].double()
    Y = torch.nn.functional.one_hot(y[train], 4).double()
    penalty = out["alpha"] * len(train)
    W = torch.linalg.solve(X.T @ X + penalty * torch.eye(20, dtype=torch.float64),
                           X.T @ (Y - Y.mean(0)))
    pred = (xs[test].double() @ W + Y.mean(0)).argmax(1)
    assert out["acc_mean"] == pytest.approx(float((pred == y[test]).double().mean()), abs=1e-12)


def test_tasks_on_the_same_sentences_get_the_results_they_get_alone():
    x, y = blobs(3, noise=1.5)
    y2 = (y + torch.arange(300) % 2) % 3
    keep = torch.ones(300, dtype=torch.bool)
    both = ridge_feature_sets({"probe": x}, [Task("A", keep, y, 4), Task("B", keep, y2, 3)],
                              CFG)["probe"]
    alone = ridge_feature_sets({"probe": x}, [Task("B", keep, y2, 3)], CFG)["probe"]
    assert both["B"] == pytest.approx(alone["B"], abs=1e-6)


def test_keys_are_the_stages_ridge_twins():
    metrics = ridge_metrics("random_init", {"A": {"acc_mean": 0.5, "alpha": 0.1}})
    assert metrics == {probe_key("A", "acc_mean", ridge_stage("random_init")): 0.5,
                       "random_init_ridge/A/alpha": 0.1}


def test_an_indefinite_gram_is_solved_on_its_positive_part_and_a_definite_one_exactly():
    """A Gram summed in float32 can come out slightly indefinite (an SGD run's features made
    the replication's trial crash in Cholesky): the solve then uses the Gram's PSD part."""
    g = torch.Generator().manual_seed(3)
    vectors = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))[0]
    rhs = torch.randn(6, 2, generator=g, dtype=torch.float64)
    penalty = 0.5
    definite = vectors @ torch.diag(torch.arange(1.0, 7.0, dtype=torch.float64)) @ vectors.T
    expected = torch.linalg.solve(definite + penalty * torch.eye(6, dtype=torch.float64), rhs)
    assert torch.allclose(_cholesky_solve(definite, rhs, penalty), expected, atol=1e-12)
    values = torch.tensor([-2.0, 0.0, 1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    indefinite = vectors @ torch.diag(values) @ vectors.T  # + penalty I is indefinite too
    assert torch.linalg.cholesky_ex(indefinite + penalty * torch.eye(6, dtype=torch.float64)
                                    )[1] > 0
    by_hand = vectors @ torch.diag(1 / (values.clamp(min=0) + penalty)) @ vectors.T @ rhs
    assert torch.allclose(_cholesky_solve(indefinite, rhs, penalty), by_hand, atol=1e-12)


def test_non_finite_features_give_nan_rows_not_an_exception():
    x, y = blobs(4)
    x[5, 3] = float("inf")
    train, test = split_indices(300, 0.2, 0)
    (out,) = _ridge_tasks(x, [y], [4], train, test, seed=0)
    assert set(out) == set(RIDGE_STATS) and all(v != v for v in out.values())  # NaN
