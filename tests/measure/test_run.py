"""measure_model: every probe result comes with its reference rows, computed once per trial."""


import torch

from flatlm.measure import PROBE_STATS, probe_key
from flatlm.measure.probes.probe import ProbeConfig
from flatlm.measure.run import MeasureConfig, eval_data, measure_model
from flatlm.models import build_model, parse_model
from flatlm.sources import load


def test_probe_results_come_with_majority_random_and_lookup_rows():
    src = load("dyck:4")
    shape = parse_model("d16-h1-l1-i32")
    cfg = MeasureConfig(what=("probe", "lookup"), n_eval=4, n_downstream=60,
                        sections=dict(probe=ProbeConfig(epochs=2, seeds=2)))
    data = eval_data(src, cfg, shape)
    model = build_model(shape, src.V, src.max_length, seed=1)
    first = measure_model(model, src, data, cfg, "cpu")
    for stage in ("probe", "random_init", "lookup"):
        assert {probe_key("g_star", stat, stage) for stat in PROBE_STATS} <= set(first), stage
    assert first[probe_key("g_star", "num_classes")] == 9
    assert data.random_model is None  # measured once, then freed
    assert first["probe/feature_rank"] >= 1.0 and first["random_init/feature_rank"] >= 1.0
    assert min(first[f"time/{k}_s"] for k in ("lookup", "random_init", "eval_data")) > 0
    second = measure_model(model, src, data, cfg, "cpu")
    assert "time/probe_s" in second  # every checkpoint; the once-per-trial work once
    assert not {"time/lookup_s", "time/random_init_s", "time/eval_data_s"} & set(second)
    reference = {k: v for k, v in first.items() if k.startswith(("random_init/", "lookup/"))}
    assert all(second[k] == v for k, v in reference.items())
    no_random = measure_model(model, src, eval_data(src, cfg), cfg, "cpu")
    assert not any(k.startswith("random_init/") for k in no_random)
    # the random model is a different initialisation than the one measured
    assert first[probe_key("g_star")] == no_random[probe_key("g_star")]


def test_evaluation_data_is_cached_by_what_defines_it(tmp_path, monkeypatch):
    src = load("hmm:seed=0,vocab=12,states=8,length=6,blocks=2")
    cfg = MeasureConfig(what=("probe",), n_eval=5, n_downstream=30)
    first = eval_data(src, cfg, cache_dir=tmp_path)
    files = list(tmp_path.glob("eval-*.pt"))
    assert len(files) == 1
    monkeypatch.setattr(type(src), "sample_downstream", None)  # a second draw would fail
    again = eval_data(src, cfg, cache_dir=tmp_path)
    for name in ("tokens", "lengths", "downstream_tokens", "downstream_lengths"):
        assert torch.equal(getattr(first, name), getattr(again, name)), name
    assert all(torch.equal(first.classes[t], again.classes[t]) for t in src.tasks)
    monkeypatch.undo()
    eval_data(src, MeasureConfig(what=("probe",), n_eval=5, n_downstream=30, seed=1),
              cache_dir=tmp_path)
    eval_data(src, MeasureConfig(what=("probe",), n_eval=5, n_downstream=30,
                                 label_rule="posterior"), cache_dir=tmp_path)
    assert len(list(tmp_path.glob("eval-*.pt"))) == 3  # seed and rule are part of the key


def test_the_trial_config_names_the_label_rule_and_tasks(tmp_path):
    import json

    from flatlm.core.config import apply_overrides
    from flatlm.runs.trial import TrialConfig, run_trial

    cfg = apply_overrides(TrialConfig(), {
        "source": "dyck:4", "model": "d16-h1-l1-i32", "train.steps": 1, "train.batch_size": 4,
        "train.checkpoint_steps": [1], "train.warmup_steps": 0, "measure.n_eval": 4,
        "measure.n_downstream": 20, "measure.what": ["probe"], "measure.probe.epochs": 1,
        "measure.probe.seeds": 1})
    assert cfg.measure.label_rule is None and cfg.measure.tasks == ()
    run_trial(cfg, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())["measure"]
    assert written["label_rule"] == "count" and written["tasks"] == ["g_star"]


def test_labels_are_computed_on_the_device_given_and_equal_the_plain_and_cached_ones(
        tmp_path, monkeypatch):
    """eval_data hands its device to the labelling (a spy records it); the labels equal those of
    the plain path (no device) and of the cache."""
    from flatlm.sources.pcfg import PCFG

    src = load({"kind": "pcfg", "random": {"vocab": 6, "depth": 2, "nonterminals_per_level": 2,
                                           "roots": 2}, "seed": 0, "spans": {"B": 2}})
    cfg = MeasureConfig(what=("probe",), n_eval=5, n_downstream=40)
    seen, labels_of_tasks = [], PCFG.labels_of_tasks

    def spy(self, tokens, lengths, *args, **kwargs):
        seen.append(tokens.device)
        return labels_of_tasks(self, tokens, lengths, *args, **kwargs)

    monkeypatch.setattr(PCFG, "labels_of_tasks", spy)
    on_device = eval_data(src, cfg, device=torch.device("cpu"), cache_dir=tmp_path)
    assert seen == [torch.device("cpu")]
    plain = eval_data(src, cfg)
    cached = eval_data(src, cfg, device=torch.device("cpu"), cache_dir=tmp_path)
    assert len(seen) == 2  # the cached call labelled nothing
    for task in src.tasks:
        assert torch.equal(on_device.classes[task], plain.classes[task])
        assert torch.equal(cached.classes[task], plain.classes[task])
        assert on_device.classes[task].dtype == torch.int64
