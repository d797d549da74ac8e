"""Tr(F) with sampled labels (paper B.1): the estimate with k labels per input is unbiased for the
exact trace, and its variance falls as 1/k (the k labels of one input are i.i.d. draws from
p_theta), so B.1's 50 labels per input cost 50 backward passes for a 50-fold smaller label noise.

The population is the pool of ``test_flatness`` (every (sentence, position) pair, weighted), the
exact per-pair value sum_c p_c ||grad log p_c||^2 enumerates every label. An estimate is the
weighted sum over the pairs of per-pair means of k sampled labels; repeats are independent (the
pairs replicated within a call, and several seeds).
"""

import pytest
import torch
from torch.func import jacrev

from flatlm.measure.curvature.common import B1_LABELS_PER_INPUT, FlatnessConfig, masked_inputs
from flatlm.measure.curvature.fisher import per_input_values
from tests.measure.test_flatness import POOL, POOL_LENGTHS, Exact, tiny_bert

# k -> (seeds, replicas of the pool per call): independent estimates = seeds x replicas, fewer
# where each costs more backward passes (one per label)
BUDGET = {1: (20, 20), 8: (5, 20), B1_LABELS_PER_INPUT: (4, 10)}


def _exact_per_pair(exact: Exact) -> torch.Tensor:
    """(n_pairs,) sum_c p_c ||grad log p_c||^2 at each pair, every label c enumerated."""
    J = jacrev(lambda th: exact.logits(th).log_softmax(-1))(exact.theta)  # (n_pairs, V, P)
    return (exact.probs() * J.square().sum(-1)).sum(-1).detach()


def _estimates(model, exact: Exact, k: int) -> torch.Tensor:
    """(seeds * replicas,) weighted sums over the pool's pairs, k sampled labels per pair."""
    seeds, replicas = BUDGET[k]
    n = len(exact.rows)
    x = masked_inputs(POOL[exact.rows].repeat(replicas, 1), POOL_LENGTHS[exact.rows].repeat(
        replicas), 0, positions=exact.positions.repeat(replicas))
    out = []
    for seed in range(seeds):
        cfg = FlatnessConfig(labels_per_input=k, batch_size=len(x), seed=seed)
        values = per_input_values(model, x, cfg).view(replicas, n)
        out.append((values * exact.w).sum(-1))
    return torch.cat(out)


@pytest.fixture(scope="module")
def sampled():
    model = tiny_bert("d16-h2-l1-i32", seed=5)
    exact = Exact(model, FlatnessConfig().exclude)
    per_pair = _exact_per_pair(exact)
    truth = float((exact.w * per_pair).sum())
    assert truth == pytest.approx(float(exact.fisher().trace()), rel=1e-10)
    return truth, {k: _estimates(model, exact, k) for k in BUDGET}


@pytest.mark.parametrize("k", list(BUDGET))
def test_sampled_labels_are_unbiased(sampled, k):
    truth, estimates = sampled
    e = estimates[k]
    se = float(e.std()) / len(e) ** 0.5
    assert abs(float(e.mean()) - truth) < 3 * se, (k, float(e.mean()), truth, se)
    assert se < 0.05 * truth  # not a vacuous interval


def test_variance_falls_as_one_over_the_labels(sampled):
    """Var(k labels) = Var(1 label) / k. With 400 / 100 / 40 repeats the sample variances are
    within ~7% / 14% / 22% (1 s.e.); labels drawn once and repeated, or not averaged, would give
    a ratio of 1."""
    _, estimates = sampled
    var = {k: float(e.var()) for k, e in estimates.items()}
    assert var[1] > var[8] > var[B1_LABELS_PER_INPUT]
    for k in (8, B1_LABELS_PER_INPUT):
        assert 0.4 * k < var[1] / var[k] < 2.0 * k, (k, var)


def test_b1_value():
    assert B1_LABELS_PER_INPUT == 50  # "we sample 10000 x_{-t} and sample 50 x_t for each"
    assert FlatnessConfig(labels_per_input=B1_LABELS_PER_INPUT).labels_per_input == 50
