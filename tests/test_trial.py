"""A trial end to end on a tiny PCFG: measurements at every checkpoint, resume, bad configs."""

import json
import math
import time

import pytest

from flatlm.core.config import apply_overrides
from flatlm.runs.trial import TrialConfig, read_metrics, run_trial, tracked_params, validate_trial
from flatlm.storage.metrics_log import read_train_log

TINY = {
    "source": '{"kind":"pcfg","random":{"vocab":12,"depth":2,"nonterminals_per_level":3,'
              '"roots":2},"seed":0}',
    "model": "d16-h2-l1-i32",
    "train.batch_size": 16, "train.warmup_steps": 2,
    "measure.n_eval": 64, "measure.n_downstream": 40, "measure.tasks": ["B"],
    "measure.probe.epochs": 5, "measure.probe.seeds": 2,
    "measure.flatness.batch_size": 32, "measure.flatness.hutchinson_batch_size": 16,
}


def tiny(**overrides):
    return apply_overrides(TrialConfig(), {**TINY, **overrides})


def test_trial_measures_every_checkpoint_and_reports(tmp_path):
    seen = []
    cfg = tiny(**{"train.steps": 6, "train.checkpoint_steps": [0, 3, 6]})
    rows = run_trial(cfg, tmp_path, lambda step, m, d: seen.append((step, m, d)))
    assert [s for s, _, _ in seen] == [0, 3, 6] == sorted(rows)
    for step, metrics, ckpt in seen:
        for key in ("pretrain/loss", "pretrain/kl", "pretrain/entropy", "flat/trace_fisher",
                    "flat/trace_fisher_se", "flat/trace_hessian", "probe/B/acc_mean",
                    "lookup/B/acc_mean"):
            assert key in metrics, key
        assert metrics["pretrain/loss"] == pytest.approx(
            metrics["pretrain/entropy"] + metrics["pretrain/kl"], abs=1e-6)
        assert json.loads((ckpt / "metrics.json").read_text())["step"] == step
    assert read_metrics(tmp_path)[6]["pretrain/kl"] == rows[6]["pretrain/kl"]
    assert json.loads((tmp_path / "config.json").read_text())["model"] == "d16-h2-l1-i32"


def test_trial_logs_its_training_curve_and_parameter_count(tmp_path):
    cfg = tiny(**{"train.steps": 6, "train.checkpoint_steps": [3, 6], "train.log_every": 2,
                  "train.algorithm": "sam"})
    rows = run_trial(cfg, tmp_path)
    curve = read_train_log(tmp_path)
    assert sorted(curve) == [2, 4, 6]  # every log window, also past the first checkpoint
    assert all(math.isfinite(r["train/loss"]) and "train/sam_loss_perturbed" in r
               for r in curve.values())
    from flatlm.models.checkpoint import load_checkpoint
    model = load_checkpoint(tmp_path / "checkpoints" / "step-6")[0]
    assert rows[6]["n_params"] == sum(p.numel() for p in model.parameters())


def test_each_checkpoint_records_the_training_before_it_and_the_measurement_share(tmp_path):
    def slow_report(step, metrics, ckpt):  # inside the checkpoint: no training time
        time.sleep(1.0 if step == 3 else 0.0)

    cfg = tiny(**{"train.steps": 6, "train.checkpoint_steps": [0, 3, 6]})
    rows = run_trial(cfg, tmp_path, slow_report)
    assert "time/train_s" not in rows[0] and rows[0]["time/measure_s"] > 0  # no update before
    for step in (3, 6):
        info = json.loads((tmp_path / "checkpoints" / f"step-{step}" / "flatlm.json").read_text())
        interval = info["extra"]["training_interval"]
        assert interval["updates"] == 3
        assert rows[step]["time/train_s"] == interval["seconds"] > 0
        assert rows[step]["time/measure_share"] == pytest.approx(
            rows[step]["time/measure_s"] / interval["seconds"])
    assert rows[6]["time/train_s"] < 1.0  # the report's second at step 3 is not training
    # measuring covers the whole hook's measurement, its parts among it
    parts = sum(v for k, v in rows[6].items() if k.startswith("time/") and k.endswith("_s")
                and k not in ("time/measure_s", "time/train_s"))
    assert parts <= rows[6]["time/measure_s"]


def test_tracked_params_are_resolved_and_only_of_what_ran():
    params = tracked_params(tiny(**{"measure.what": ["loss", "probe"]}))
    assert None not in params.values()
    # the algorithm's defaults spelled out, not None
    assert params["train.dropout"] == 0.1 and params["train.weight_decay"] == 0.01
    assert params["train.micro_batch_size"] == 16 and params["train.warmup_steps"] == 2
    assert not [k for k in params if k.startswith(("train.sam.", "train.adversarial.",
                                                   "train.grow.", "train.label_noise.",
                                                   "measure.finetune.", "measure.flatness."))]
    assert "measure.probe.epochs" in params and "measure.loss.batch_size" in params
    sam = tracked_params(tiny(**{"train.algorithm": "sam", "measure.what": ["fisher"]}))
    assert sam["train.sam.rho"] == 0.05 and sam["train.micro_batch_size"] == 8  # half batch
    assert "measure.probe.epochs" not in sam
    noisy = tracked_params(tiny(**{"train.algorithm": "label_noise"}))
    assert noisy["train.label_noise.p"] == 0.1 and not [k for k in noisy if "grow." in k]
    assert tracked_params(tiny(**{"measure.flatness.n_inputs": None}))[
        "measure.flatness.n_inputs"] == "all"
    assert tracked_params(tiny(**{"measure.flatness.n_inputs": 32}))[
        "measure.flatness.n_inputs"] == 32


def test_a_growing_trial_measures_the_grown_model(tmp_path):
    cfg = tiny(**{"train.algorithm": "grow", "train.steps": 4, "train.checkpoint_steps": [2, 4],
                  "train.grow.steps": [2], "train.grow.to": ["d32-h4-l2-i64"],
                  "measure.what": ["loss", "fisher"]})
    rows = run_trial(cfg, tmp_path)
    assert rows[4]["n_params"] > 2 * rows[2]["n_params"]
    assert all(math.isfinite(rows[s]["flat/trace_fisher"]) for s in (2, 4))
    assert tracked_params(cfg)["train.grow.to"] == ("d32-h4-l2-i64",)
    with pytest.raises(ValueError, match=r"train\.grow\.to\[0\]='d24-h2-l1-i32'"):
        validate_trial(apply_overrides(cfg, {"train.grow.to": ["d24-h2-l1-i32"]}))


def test_resume_continues_and_remeasures_a_lost_checkpoint(tmp_path):
    straight = run_trial(tiny(**{"train.steps": 4, "train.checkpoint_steps": [2, 4]}),
                         tmp_path / "straight")
    part = tmp_path / "part"
    run_trial(tiny(**{"train.steps": 2, "train.checkpoint_steps": [2]}), part)
    lines = (part / "metrics.jsonl").read_text().splitlines()
    (part / "metrics.jsonl").write_text("")  # the measurement of step 2 was lost
    (part / "checkpoints" / "step-2" / "metrics.json").unlink()
    resumed = run_trial(tiny(**{"train.steps": 4, "train.checkpoint_steps": [2, 4]}), part)
    assert sorted(resumed) == [2, 4]
    assert json.loads(lines[0])["pretrain/kl"] == resumed[2]["pretrain/kl"]
    for key in ("pretrain/kl", "flat/trace_fisher"):
        assert resumed[4][key] == pytest.approx(straight[4][key], rel=1e-6)
    info = json.loads((part / "checkpoints" / "step-4" / "flatlm.json").read_text())
    assert info["extra"]["training_interval"]["updates"] == 2  # from the checkpoint resumed


@pytest.mark.parametrize("overrides, match", [
    ({"measure.tasks": ["Z"]}, "measure.tasks"),
    ({"train.checkpoint_steps": []}, "checkpoint_steps"),
    ({"source": "pcfg:nope.txt"}, "source"),
    ({"model": "bert-3m"}, "model"),
])
def test_bad_configs_fail_before_any_work(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        run_trial(tiny(**{"train.steps": 2, "train.checkpoint_steps": [2], **overrides}),
                  tmp_path)
    assert not (tmp_path / "checkpoints").exists()


def test_metrics_log_last_row_of_a_step_wins_and_a_torn_line_is_skipped(tmp_path):
    """The one reader of metrics.jsonl (trial, tracker, sweeps and analysis use it)."""
    from flatlm.storage.metrics_log import append_metrics, parse_metrics

    ckpt = tmp_path / "checkpoints" / "step-1"
    ckpt.mkdir(parents=True)
    (ckpt / "metrics.json").write_text(json.dumps({"step": 1, "a": 0.5}) + "\n")
    append_metrics(tmp_path, 2, {"a": 1.0})
    append_metrics(tmp_path, 2, {"a": 2.0, "b": 3.0})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "a')  # a crash mid-write
    append_metrics(tmp_path, 4, {"a": 4.0})  # starts a line of its own
    assert read_metrics(tmp_path) == {1: {"step": 1, "a": 0.5}, 2: {"step": 2, "a": 2.0, "b": 3.0},
                                      4: {"step": 4, "a": 4.0}}
    assert parse_metrics('{"a": 1}\n[1]\n\n{"step": "x"}\n') == {}


def test_a_trial_builds_its_source_once_and_validates_once(tmp_path, monkeypatch):
    """Issue 22: the config is validated once per trial and the source built once (building a
    PCFG's truth or a corpus is the expensive part of setting up)."""
    import flatlm.runs.trial as trial_module
    import flatlm.sources as sources

    loads, validations = [], []
    monkeypatch.setattr(trial_module, "load",
                        lambda spec: loads.append(spec) or sources.load(spec))
    real_validate = trial_module.validate_trial
    monkeypatch.setattr(trial_module, "validate_trial",
                        lambda cfg, source=None: validations.append(cfg)
                        or real_validate(cfg, source))
    cfg = apply_overrides(TrialConfig(), {
        "source": "dyck:4", "model": "d16-h1-l1-i32", "train.steps": 2, "train.batch_size": 4,
        "train.checkpoint_steps": [2], "train.warmup_steps": 1, "measure.n_eval": 8,
        "measure.n_downstream": 20, "measure.what": ["loss"]})
    run_trial(cfg, tmp_path)
    assert len(loads) == 1 and len(validations) == 1


def test_a_source_built_by_the_caller_is_not_built_again(tmp_path, monkeypatch):
    """Issue 22: the Ray trainable validates the trial (building its source) to resolve the
    tracked params, then hands that source to run_trial: one build per trial on that path too."""
    import flatlm.runs.trial as trial_module
    import flatlm.sources as sources

    cfg = apply_overrides(TrialConfig(), {
        "source": "dyck:4", "model": "d16-h1-l1-i32", "train.steps": 2, "train.batch_size": 4,
        "train.checkpoint_steps": [2], "train.warmup_steps": 1, "measure.n_eval": 8,
        "measure.n_downstream": 20, "measure.what": ["loss"]})
    source, _ = trial_module.validate_trial(cfg)
    loads = []
    monkeypatch.setattr(trial_module, "load",
                        lambda spec: loads.append(spec) or sources.load(spec))
    done = run_trial(trial_module.with_downstream_resolved(cfg, source), tmp_path / "given",
                     source=source)
    assert loads == []
    built = run_trial(cfg, tmp_path / "built")
    assert len(loads) == 1

    def measured(rows):  # the wall-clock timings differ, nothing else may
        return {s: {k: v for k, v in r.items() if not k.startswith("time/")}
                for s, r in rows.items()}
    assert measured(done) == measured(built)  # the same trial, bit for bit
