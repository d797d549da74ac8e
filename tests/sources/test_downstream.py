"""The one path for downstream data: ``Source.sample_downstream`` for every source, and every
stage (corpus, measurements, the adversarial pool) labelling by the same default rule."""

import pytest
import torch

from flatlm.core.seeds import derive_seed
from flatlm.measure.run import MeasureConfig, eval_data
from flatlm.sources import load
from flatlm.train.data import DownstreamPool

SPECS = {
    "pcfg": {"kind": "pcfg", "random": {"vocab": 10, "depth": 2, "nonterminals_per_level": 3},
             "seed": 1},
    "hmm": "hmm:seed=0,vocab=12,states=8,length=6,blocks=2",
    "dyck": "dyck:6",
}


@pytest.mark.parametrize("kind", SPECS)
def test_class_ids_are_in_range_seeded_and_default_to_the_first_rule(kind):
    src = load(SPECS[kind])
    tokens, lengths, classes = src.sample_downstream(200, seed=3)
    assert tokens.shape == (200, src.max_length) and lengths.shape == (200,)
    assert set(classes) == set(src.tasks)
    for task, y in classes.items():
        assert y.dtype == torch.int64 and y.device.type == "cpu"
        defined = y[y != -1]
        assert len(defined) and int(defined.min()) >= 0
        assert int(defined.max()) < src.num_classes(task)
    again = src.sample_downstream(200, seed=3, rule=src.label_rules[0])
    assert torch.equal(again[0], tokens)
    assert all(torch.equal(again[2][t], classes[t]) for t in src.tasks)
    other = src.sample_downstream(200, seed=4, tasks=src.tasks[:1])
    assert set(other[2]) == {src.tasks[0]} and not torch.equal(other[0], tokens)


def test_dyck_class_ids_are_g_star_plus_the_offset():
    src = load("dyck:6")
    tokens, lengths, classes = src.sample_downstream(100, seed=0)
    assert torch.equal(classes["g_star"], src.labels(tokens, lengths) + 6)
    assert int(src.labels(tokens, lengths).min()) < 0  # raw g* is signed


@pytest.mark.parametrize(("kind", "rule", "task", "match"), [
    ("hmm", "viterbi", None, "label rule 'viterbi'"),
    ("pcfg", "sampled", None, "label rule 'sampled'"),
    ("dyck", None, ("A",), "unknown task"),
])
def test_bad_rules_and_tasks_are_named(kind, rule, task, match):
    with pytest.raises(ValueError, match=match):
        load(SPECS[kind]).sample_downstream(10, seed=0, rule=rule, tasks=task)


def test_hmm_adversarial_pool_and_probe_label_by_the_same_rule():
    """The bug this path fixed: the pool labelled HMM sentences by the posterior while the probe
    was measured on the sampled states. Both now use the source's default, "sampled"."""
    src = load(SPECS["hmm"])
    assert src.label_rules[0] == "sampled"
    pool = DownstreamPool(src, "task-3", size=64, d1=8, d2=8, seed=5)
    _, _, states = src.sample_with_states(64, derive_seed(5, "pool", 0))
    assert torch.equal(pool.labels, states[:, 2])
    posterior = src.labels(*src.sample(64, derive_seed(5, "pool", 0)), "task-3")
    assert not torch.equal(pool.labels, posterior)  # the rules differ on this HMM
    cfg = MeasureConfig(n_eval=4, n_downstream=50, tasks=("task-3",), what=("probe",))
    data = eval_data(src, cfg)
    classes = data.classes["task-3"]
    _, _, drawn = src.sample_with_states(50, _eval_downstream_seed(cfg))
    assert torch.equal(classes, drawn[:, 2])


def _eval_downstream_seed(cfg):
    import numpy as np

    return int(np.random.SeedSequence(cfg.seed, spawn_key=(7,)).generate_state(2)[1])
