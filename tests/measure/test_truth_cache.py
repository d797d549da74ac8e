"""The true conditionals behind the loss and the flatness, computed once per trial: a second
checkpoint computes none, and reads the same numbers it would have computed."""

import dataclasses

import pytest

from flatlm.measure.curvature.common import FlatnessConfig
from flatlm.measure.probes.probe import ProbeConfig
from flatlm.measure.run import MeasureConfig, eval_data, measure_model
from flatlm.models import build_model, parse_model
from flatlm.sources import load
from tests.measure.conftest import TINY_PCFG

WHAT = ("loss", "fisher", "hessian", "probe", "lookup")


def _counted(src, monkeypatch) -> list:
    """Each call of ``src.conditionals`` appends its number of sentences."""
    calls, plain = [], src.conditionals

    def counting(tokens, lengths, **kw):
        calls.append(len(tokens))
        return plain(tokens, lengths, **kw)

    monkeypatch.setattr(src, "conditionals", counting)
    return calls


def _checkpoints(cfg, monkeypatch):
    src = load(TINY_PCFG)
    shape = parse_model("d16-h1-l1-i32")
    data = eval_data(src, cfg, shape)
    calls = _counted(src, monkeypatch)
    rows, counts = [], []
    for seed in (1, 2):  # two checkpoints: two different models, one trial
        model = build_model(shape, src.V, src.max_length, seed=seed)
        before = len(calls)
        rows.append(measure_model(model, src, data, cfg, "cpu"))
        counts.append(len(calls) - before)
    return rows, counts


def _numbers(row):
    return {k: v for k, v in row.items() if not k.startswith("time/")}


def test_second_checkpoint_computes_no_truth_and_reads_the_same_numbers(monkeypatch):
    cfg = MeasureConfig(what=WHAT, n_eval=60, n_downstream=40, sections=dict(
        probe=ProbeConfig(epochs=1, seeds=1),
        flatness=FlatnessConfig(n_inputs=30, batch_size=16, hutchinson_batch_size=10)))
    (first, second), (n1, n2) = _checkpoints(cfg, monkeypatch)
    assert all(v == v for v in _numbers(first).values())  # no NaN: equality means equality
    assert n1 > 0 and n2 == 0  # lookup, loss and flatness at the first; nothing at the second
    recomputed, (m1, m2) = _checkpoints(dataclasses.replace(cfg, truth_cache_mb=0.0),
                                        monkeypatch)
    assert m2 > 0  # without the cache the truth is computed again (the check can fail)
    assert _numbers(recomputed[0]) == _numbers(first)  # bit for bit
    assert _numbers(recomputed[1]) == _numbers(second)


def test_truth_cache_budget_is_checked():
    with pytest.raises(ValueError, match="measure.truth_cache_mb=-1"):
        MeasureConfig(truth_cache_mb=-1)
