"""What a testbed search runs on one candidate, each returning a JSON row with its CPU and wall
seconds (``time.process_time`` of a one-thread process is the cost; the machine is shared):

- ``screen``: no training (seconds): T, entropy, per task the majority share and the probe on a
  random d64 model's features, on the lookup table and on both concatenated.
- ``learn``: one model under one training setting, KL every 500 steps, then the trained probe
  against random-init features of its shape.
- ``run_one``: one trial of an experiment as the replication runs it (``run_trial``).

and the experiments' trials at the scale a candidate stands for (``candidate_scale``,
``v2_scale``, ``experiment_trials``).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from apps.testbed_search import first, second
from flatlm.core.config import apply_overrides, from_dict, to_dict
from flatlm.experiments.paper import build
from flatlm.experiments.scales import CPU_ADVERSARY, TESTBED, Scale, register_scale
from flatlm.measure.probes.lookup import lookup_features
from flatlm.measure.probes.probe import (
    downstream_classes,
    encoder_probe_features,
    linear_probe_accuracy,
)
from flatlm.measure.run import MeasureConfig, eval_data, measure_model
from flatlm.models.checkpoint import load_checkpoint
from flatlm.models.presets import parse_model
from flatlm.runs.trial import TrialConfig, run_trial
from flatlm.sources import load

# ---------------------------------------------------------------- the screen (no training)


def screen(candidate: dict, keep: Callable[[dict], bool]) -> dict:
    """One candidate ``{"id", "spec"}`` screened under the ``span`` rule, then under ``inside``
    where ``keep(row)`` holds for the span rows (a report, cheap for the kept only). A spec that
    builds no source, or whose sentences exceed ``first.T_MAX``, gives a row with ``error``."""
    start, cpu = time.perf_counter(), time.process_time()
    row = {"id": candidate["id"], "spec": candidate["spec"]}
    try:
        source = load(json.dumps(candidate["spec"]))
    except ValueError as e:  # SourceError: a length filter no sentence passes, etc.
        return {**row, "error": str(e)}
    row.update({"T": source.max_length, "V": source.V, "acceptance": round(source.acceptance, 4),
                "rules": int(len(source.grammar.binary_prob) + np.count_nonzero(
                    source.grammar.emission))})
    if source.max_length > first.T_MAX:
        return {**row, "error": f"T={source.max_length} > {first.T_MAX}"}
    row["entropy"] = round(source.entropy(1000, seed=1)[0], 4)
    for rule in ("span", "inside"):
        row[rule] = screen_probes(source, rule)
        if not keep(row):
            break
    row["cpu_s"], row["wall_s"] = round(time.process_time() - cpu, 1), round(
        time.perf_counter() - start, 1)
    return row


def screen_probes(source, rule: str) -> dict:
    """Per task (labels by ``rule``): the majority share, the classes seen and the probe on random
    ``first.SCREEN_MODEL`` features, on the lookup table and on both concatenated."""
    mc = apply_overrides(MeasureConfig(), {
        **{k.removeprefix("measure."): v for k, v in first.MEASURE.items()},
        "n_downstream": first.SCREEN_DOWNSTREAM, "n_eval": 2, "what": ["probe"],
        "label_rule": rule})
    data = eval_data(source, mc, parse_model(first.SCREEN_MODEL))
    words = encoder_probe_features(data.random_model, data.downstream_tokens,
                                   data.downstream_lengths)
    truth = lookup_features(source, data.downstream_tokens, data.downstream_lengths)
    features = {"random_init": words, "lookup": truth,
                "random+lookup": torch.cat([words, truth], 1)}
    return {task: probe_row(source, task, y, mc.probe, features)
            for task, y in data.classes.items()}


def probe_row(source, task: str, y, probe_cfg, features: dict) -> dict:
    """The majority share, the classes seen and the probe's accuracy on each of ``features``
    (name -> (N, D) tensor) for one task's labels ``y``."""
    keep, classes, num_classes = downstream_classes(source, y, task)
    row = {"majority": round(float(np.bincount(classes.numpy()).max() / len(classes)), 4),
           "classes_seen": int(len(np.unique(classes.numpy())))}
    for name, x in features.items():
        row[name] = round(float(linear_probe_accuracy(x[keep], classes, num_classes,
                                                      probe_cfg)["acc_mean"]), 4)
    return row


# ---------------------------------------------------------------- training runs


def learn(job: dict) -> dict:
    """One model trained under one setting (``job``: id, spec, model, setting and its name, any
    labels), KL every 500 steps; ``passed``: the final KL meets criterion (a); ``probe``: the
    trained probe and random-init features of its shape under the span rule."""
    steps = job["setting"]["train.steps"]
    cfg = apply_overrides(TrialConfig(), {
        "source": json.dumps(job["spec"]), "model": job["model"], **job["setting"],
        "train.checkpoint_steps": list(range(500, steps + 1, 500)), "train.log_every": 100,
        "measure.what": ["loss"], "measure.n_eval": first.MEASURE["measure.n_eval"]})
    start, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        done = run_trial(cfg, tmp)
        probe = probe_at(apply_overrides(cfg, first.MEASURE), Path(tmp) / "checkpoints" /
                         f"step-{steps}", "span")
    kl = {s: round(m["pretrain/kl"], 5) for s, m in sorted(done.items())}
    return {**{k: v for k, v in job.items() if k != "spec"}, "kl": kl,
            "final_kl": kl[steps], "passed": kl[steps] <= first.CRITERIA["kl_max"],
            "probe": probe, "cpu_s": round(time.process_time() - cpu, 1),
            "wall_s": round(time.perf_counter() - start, 1)}


def run_one(job: dict) -> dict:
    """One trial of an experiment as the replication runs it (``job``: id, experiment, trial,
    config dict, work directory), timed: the final checkpoint's KL, probes and reference rows,
    and, where ``job["inside"]``, the probes under the ``inside`` rule."""
    cfg = from_dict(TrialConfig, job["config"])
    out_dir = Path(job["work"]) / job["id"] / job["experiment"] / job["trial"]
    start, cpu = time.perf_counter(), time.process_time()
    done = run_trial(cfg, out_dir)
    cpu_s, wall_s = time.process_time() - cpu, time.perf_counter() - start
    last = max(done)
    row = {k: job[k] for k in ("id", "experiment", "trial")}
    row.update({"model": str(cfg.model), "algorithm": cfg.train.algorithm,
                "kl": {s: round(m["pretrain/kl"], 5) for s, m in sorted(done.items())},
                "final": final_metrics(done[last]), "cpu_s": round(cpu_s, 1),
                "wall_s": round(wall_s, 1), "config": job["config"]})
    if job.get("inside"):
        row["inside"] = probe_at(cfg, out_dir / "checkpoints" / f"step-{last}", "inside")
    return row


def final_metrics(metrics: dict) -> dict:
    """What a search keeps of a checkpoint's metrics: KL, entropy, Tr(F) and the probe,
    random-init and lookup rows' mean, standard error and majority share."""
    keep = ("pretrain/kl", "pretrain/entropy", "flat/trace_fisher")
    return {k: v for k, v in metrics.items()
            if k in keep or k.split("/")[0] in ("probe", "random_init", "lookup")
            and k.split("/")[-1] in ("acc_mean", "acc_se", "majority_acc")}


def probe_at(cfg, ckpt_dir: Path, rule: str) -> dict:
    """A checkpoint's probe and the random-init reference of its shape under label ``rule``,
    with ``cfg``'s measurement settings."""
    source = load(cfg.source)
    mc = apply_overrides(cfg.measure, {"label_rule": rule, "what": ["probe"]})
    model, _ = load_checkpoint(ckpt_dir)
    data = eval_data(source, mc, parse_model(cfg.model))
    m = measure_model(model, source, data, mc, "cpu")
    return {k: round(v, 4) for k, v in m.items() if k.endswith(("acc_mean", "majority_acc"))}


def expected_cost(job: dict) -> float:
    """A trial's relative cost, to start the longest first: steps x width (x2 for SAM)."""
    cfg = job["config"]
    width = {"d16": 1, "d32": 1.5, "d64": 3}.get(str(cfg["model"]).split("-")[0], 3)
    return cfg["train"]["steps"] * width * (2 if cfg["train"]["algorithm"] == "sam" else 1)


# ---------------------------------------------------------------- the scale of a candidate


def candidate_scale(spec: dict, grid: str, setting: dict, long_steps: int | None,
                    adversarial_lambda: float | None = None, name: str = "candidate",
                    long_lr: float | None = None) -> Scale:
    """The Scale a first-search (candidate, grid, setting) stands for: the setting's optimiser,
    steps and schedule (the steps and sgd runs: 1.5x as long, constant rate, a checkpoint every
    sixth), the sizes grid, the CPU adversary of the tiny scale (task B, pools of 32 / 32 / 256),
    ``first.MEASURE``."""
    steps = setting["train.steps"]
    long_steps = long_steps or steps * 3 // 2
    overrides = {k: v for k, v in setting.items() if k not in ("train.steps", "train.dropout")}
    adversarial = dict(CPU_ADVERSARY)
    if adversarial_lambda is not None:
        adversarial["train.adversarial.lambda"] = adversarial_lambda
    return Scale(
        name=name, source=json.dumps(spec), deep_source=json.dumps(spec),
        models=first.GRIDS[grid]["models"], model=first.GRIDS[grid]["model"], steps=steps,
        long_steps=long_steps, checkpoints=6, seeds=(0,), gpus=0.0, sgd_lr=0.3,
        adversarial=adversarial, run_checkpoints=3, long_from_zero=False,
        sizes_overrides={} if setting["train.dropout"] is None else
        {"train.dropout": setting["train.dropout"]},
        kl_threshold=first.CRITERIA["kl_max"],
        long_overrides={} if long_lr is None else {"train.lr": long_lr,
                                                   "train.schedule": "constant"},
        overrides={**overrides, "train.log_every": 50, **first.MEASURE})


def v2_scale(spec: dict, grid: str, steps: int | None = None) -> Scale:
    """The scale a v2 finalist stands for: the first testbed's (recipe, measurements, adversary's
    pools) with the candidate's language, the grid's models and the steps model."""
    source = json.dumps(spec)
    return replace(TESTBED, name="v2-candidate", source=source, deep_source=source,
                   models=second.GRIDS[grid], model=second.STEPS_MODEL,
                   steps=steps or TESTBED.steps, long_steps=steps or TESTBED.long_steps,
                   second_source=None, selection_what=(), selection_lrs=())


# The experiments of one long run (paper._long_run): a constant rate whatever a scale says.
LONG_RUNS = ("steps", "sgd")


def candidate_pins(setting: dict) -> dict:
    """What a first-search candidate's trials keep over the protocol (``experiment_trials``'s
    ``pins``): its setting's schedule (the long runs aside), ``first.MEASURE``, and the
    measurement settings of the time (the source's own label rule, Tr(F) from 8 labels per
    input). Stage 2 ran these (bench/results/testbed_search.json's configs), fixed before any
    claim was read; the paper protocol's constant rate, probe and B.1 labels came later and would
    otherwise replace them."""
    return {"train.schedule": setting["train.schedule"], **first.MEASURE,
            "measure.label_rule": None, "measure.flatness.labels_per_input": 8}


def experiment_trials(sc: Scale, experiments, seeds, protocol: str = "paper",
                      pins: dict | None = None) -> list[tuple[str, str, dict]]:
    """(experiment, trial name, config dict) of each trial of ``experiments`` at scale ``sc``,
    built by ``flatlm.experiments.paper.build`` (the scale registered under its name), ``pins``
    (``candidate_pins``) set last: over the protocol, the long runs' schedule aside."""
    # build() looks scales up by name; a candidate's settings change between calls of the search
    register_scale(sc, replace=True)
    out = []
    for name in experiments:
        kept = {k: v for k, v in (pins or {}).items()
                if not (name in LONG_RUNS and k == "train.schedule")}
        exp = build(name, scale=sc.name, protocol=protocol, seeds=tuple(seeds),
                    overrides=kept or None)
        out += [(name, trial, to_dict(cfg)) for trial, cfg in exp.trials()]
    return out


def loss_only(config: dict) -> dict:
    """A copy of a trial's config dict that measures the pre-training loss only."""
    config = json.loads(json.dumps(config))
    config["measure"]["what"] = ["loss"]
    return config


def algorithm_trial(sc: Scale, algorithm: str, seed: int, pins: dict | None = None) -> dict:
    """The config dict of the algorithms experiment's ``algorithm`` trial at ``sc``, ``seed``."""
    trials = experiment_trials(sc, ["algorithms"], [seed], pins=pins)
    return next(c for _, t, c in trials if t.startswith(algorithm + "_"))
