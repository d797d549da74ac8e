"""The Bayes ceiling of a task whose labels the sentence does not determine (issue 50): an HMM's
rule ``sampled`` labels task-k by the state z_k the sampler drew, so no probe beats the mean of
max_s Pr(z_k = s | x) over its test sentences. Checked against every hidden path of a tiny HMM,
and as the probe rows record it."""

import itertools

import numpy as np
import pytest
import torch

from flatlm.measure import BAYES_CEILING, probe_key
from flatlm.measure.probes.probe import ProbeConfig, split_indices
from flatlm.measure.run import MeasureConfig, eval_data, measure_model
from flatlm.models import build_model, parse_model
from flatlm.sources import load
from flatlm.sources.hmm import HMM

STATES, WORDS, LENGTH = 3, 4, 4


@pytest.fixture(scope="module")
def tiny() -> HMM:
    rng = np.random.default_rng(7)
    return HMM(rng.dirichlet(np.ones(STATES)), rng.dirichlet(np.ones(STATES), STATES),
               rng.dirichlet(np.ones(WORDS), STATES), LENGTH)


def every_sentence() -> tuple[torch.Tensor, torch.Tensor]:
    """All WORDS^LENGTH sentences of the tiny HMM."""
    tokens = torch.tensor(list(itertools.product(range(WORDS), repeat=LENGTH)))
    return tokens, torch.full((len(tokens),), LENGTH)


def enumerated_state_posteriors(hmm: HMM, sentence: list[int]) -> np.ndarray:
    """Pr(z_k = s | x) [LENGTH, STATES] by summing Pr(z, x) over every hidden sequence z."""
    out = np.zeros((LENGTH, STATES))
    for z in itertools.product(range(STATES), repeat=LENGTH):
        joint = hmm.initial[z[0]] * hmm.emission[z[0], sentence[0]]
        for t in range(1, LENGTH):
            joint *= hmm.transition[z[t - 1], z[t]] * hmm.emission[z[t], sentence[t]]
        for t in range(LENGTH):
            out[t, z[t]] += joint
    return out / out.sum(1, keepdims=True)


def test_bayes_accuracies_are_the_largest_state_posterior_of_every_hidden_path(tiny):
    tokens, lengths = every_sentence()
    got = tiny.bayes_accuracies(tokens, lengths, "sampled", tiny.tasks)
    want = np.stack([enumerated_state_posteriors(tiny, s).max(1) for s in tokens.tolist()])
    assert set(got) == set(tiny.tasks)
    for k, task in enumerate(tiny.tasks):
        assert got[task].dtype == torch.float64 and got[task].shape == (len(tokens),)
        np.testing.assert_allclose(got[task].numpy(), want[:, k], rtol=0, atol=1e-10)


def test_bayes_accuracies_do_not_depend_on_the_batch_size(tiny):
    tokens, lengths = every_sentence()
    whole = tiny.bayes_accuracies(tokens, lengths, "sampled", ("task-2",))
    batched = tiny.bayes_accuracies(tokens, lengths, "sampled", ("task-2",), batch_size=7)
    assert torch.equal(whole["task-2"], batched["task-2"])


def test_labels_the_sentence_determines_have_no_bayes_ceiling(tiny):
    tokens, lengths = every_sentence()
    assert tiny.bayes_accuracies(tokens, lengths, "posterior", tiny.tasks) == {}
    dyck = load("dyck:4")
    assert dyck.bayes_accuracies(*dyck.sample(5, 0), dyck.label_rules[0], dyck.tasks) == {}


def measured(src, rule: str | None) -> tuple[dict, object, MeasureConfig]:
    """One checkpoint's probe rows on 200 downstream sentences (seconds on a CPU)."""
    cfg = MeasureConfig(what=("probe", "lookup"), n_eval=4, n_downstream=200,
                        label_rule=rule, tasks=("task-3",) if rule else None,
                        sections=dict(probe=ProbeConfig(epochs=2, seeds=2)))
    data = eval_data(src, cfg)
    model = build_model(parse_model("d16-h1-l1-i32"), src.V, src.max_length, seed=1)
    return measure_model(model, src, data, cfg, "cpu"), data, cfg


def test_the_probe_rows_of_sampled_labels_carry_their_bayes_ceiling():
    src = load("hmm:seed=0,vocab=12,states=8,length=6,blocks=2")
    out, data, cfg = measured(src, "sampled")
    for stage in ("probe", "lookup"):
        ceiling = out[probe_key("task-3", BAYES_CEILING, stage)]
        assert out[probe_key("task-3", "majority_acc", stage)] < ceiling < 1, stage
    _, test = split_indices(cfg.n_downstream, cfg.probe.test_fraction, cfg.probe.seed)
    on_test = data.bayes["task-3"][test].mean()  # every sentence has a label: none dropped
    assert out[probe_key("task-3", BAYES_CEILING)] == pytest.approx(float(on_test), abs=1e-12)
    assert out[probe_key("task-3", "n_test")] == len(test)


@pytest.mark.parametrize("spec, rule", [("hmm:seed=0,vocab=12,states=8,length=6,blocks=2",
                                         "posterior"), ("dyck:4", None)])
def test_labels_of_the_sentence_record_no_ceiling(spec, rule):
    out, _, _ = measured(load(spec), rule)
    assert not any(key.endswith("/" + BAYES_CEILING) for key in out)
