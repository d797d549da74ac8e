"""Reference rows shared across trials: computed once for the same data, shape and settings,
recomputed for others, and a damaged file (reference or evaluation data) drawn again."""

import dataclasses
import json

import torch

from flatlm.measure.eval_cache import cached_tensors
from flatlm.measure.probes.probe import ProbeConfig
from flatlm.measure.reference_cache import cached_metrics, reference_rows
from flatlm.measure.run import MeasureConfig, eval_data, measure_model
from flatlm.models import build_model, parse_model
from flatlm.sources import load

CFG = MeasureConfig(what=("probe", "lookup"), n_eval=4, n_downstream=60,
                    sections=dict(probe=ProbeConfig(epochs=2, seeds=2)))


def _measure(src, shape, cfg, cache):
    data = eval_data(src, cfg, shape, cache_dir=cache)
    model = build_model(shape, src.V, src.max_length, seed=1)
    return measure_model(model, src, data, cfg, "cpu")


def test_a_second_trial_reads_the_reference_rows_of_the_first(tmp_path, monkeypatch):
    src, shape = load("dyck:4"), parse_model("d16-h1-l1-i32")
    first = _measure(src, shape, CFG, tmp_path)
    assert len(list(tmp_path.glob("reference-*.json"))) == 2  # lookup, random_init
    import flatlm.measure.builtin as builtin

    probes = builtin._probes

    def fail(*args, **kwargs):
        raise AssertionError("a cached reference row was computed again")

    def trained_only(model, source, data, cfg, stage, device):
        return fail() if stage == "random_init" else probes(model, source, data, cfg, stage,
                                                            device)

    monkeypatch.setattr(builtin, "lookup_features", fail)
    monkeypatch.setattr(builtin, "_probes", trained_only)
    again = _measure(src, shape, CFG, tmp_path)
    reference = {k: v for k, v in first.items() if k.startswith(("random_init", "lookup"))}
    assert reference and all(again[k] == v for k, v in reference.items())
    assert {"time/random_init_s", "time/lookup_s"} <= set(again)


def test_another_shape_or_probe_setting_is_another_row(tmp_path):
    src = load("dyck:4")
    _measure(src, parse_model("d16-h1-l1-i32"), CFG, tmp_path)
    _measure(src, parse_model("d16-h2-l1-i32"), CFG, tmp_path)  # random_init only: 3 files
    assert len(list(tmp_path.glob("reference-*.json"))) == 3
    other = CFG.with_settings(probe=dataclasses.replace(CFG.probe, lr=3e-3))
    _measure(src, parse_model("d16-h1-l1-i32"), other, tmp_path)
    assert len(list(tmp_path.glob("reference-*.json"))) == 5


def test_damaged_files_are_computed_again_not_read(tmp_path, caplog):
    calls = []

    def make():
        calls.append(1)
        return {"lookup/A/acc_mean": 0.5}

    assert cached_metrics(tmp_path, "k", make) == ({"lookup/A/acc_mean": 0.5}, False)
    assert cached_metrics(tmp_path, "k", make) == ({"lookup/A/acc_mean": 0.5}, True)
    path = tmp_path / "reference-k.json"
    for damaged in ('{"format": "flatlm.reference/1", "metr', '[1, 2]',
                    json.dumps({"format": "flatlm.reference/1", "metrics": {"a": "x"}})):
        path.write_text(damaged)
        assert cached_metrics(tmp_path, "k", make) == ({"lookup/A/acc_mean": 0.5}, False)
    assert len(calls) == 4 and "cannot be read" in caplog.text
    assert reference_rows(None, "d", "lookup", CFG.probe, "cpu", make) == make()  # no cache

    tensors = {"tokens": torch.arange(3)}
    cached_tensors(tmp_path, "e", lambda: tensors)
    (tmp_path / "eval-e.pt").write_bytes(b"PK\x03\x04 torn")
    again = cached_tensors(tmp_path, "e", lambda: {"tokens": torch.arange(3) + 1})
    assert torch.equal(again["tokens"], torch.arange(3) + 1)  # drawn again, and stored
    assert torch.equal(cached_tensors(tmp_path, "e", lambda: tensors)["tokens"],
                       torch.arange(3) + 1)


def test_progress_bar_names_each_measurement_and_every_one_is_timed(capsys):
    src, shape = load("dyck:4"), parse_model("d16-h1-l1-i32")
    cfg = dataclasses.replace(CFG, what=("loss", "fisher", "probe", "lookup"))
    data = eval_data(src, cfg, shape)
    model = build_model(shape, src.V, src.max_length, seed=1)
    out = measure_model(model, src, data, cfg, "cpu", progress=True)
    assert {f"time/{k}_s" for k in ("loss", "flatness", "probe", "lookup", "random_init",
                                    "eval_data")} <= set(out)
    assert "measure probe" in capsys.readouterr().err
