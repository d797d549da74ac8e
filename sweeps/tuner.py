"""The Tune experiment of a sweep: a new Tuner or a restored one, its search algorithm and naming,
and the resources its trials ask for."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from flatlm.core.config import to_dict
from sweeps.console import OneLinePerResult, trial_label
from sweeps.pack_trainable import any_trial
from sweeps.progress_board import ProgressLines
from sweeps.rayenv import ray, tune
from sweeps.signals import RecordSignals
from sweeps.spec import Sweep, objectives, packs, ray_trials
from sweeps.trust import StateDigests, forget_digests, record_digest


def build_tuner(sweep: Sweep, storage: Path, sweep_info: dict, resume: bool, show: tuple[str, ...],
           callbacks: Sequence[tune.Callback]) -> tune.Tuner:
    trainable_ = tune.with_resources(any_trial, {"cpu": sweep.cpus_per_trial,
                                                 "gpu": sweep.gpus_per_trial})
    path = storage / sweep.name
    if resume and tune.Tuner.can_restore(str(path)):  # its state verified (check_state)
        tuner = tune.Tuner.restore(str(path), trainable=trainable_, resume_errored=True,
                                   resume_unfinished=True)
        record_digest(path)
        return tuner
    if path.exists() and not resume:
        raise ValueError(f"{path} holds an earlier sweep named {sweep.name!r}: pass "
                         "--resume to continue it, or --name to start another")
    forget_digests(path)  # a sweep deleted from here earlier: its record is not this one's
    tuner = tune.Tuner(
        trainable_,
        param_space={"base": to_dict(sweep.base), **trial_space(sweep), "sweep": sweep_info},
        tune_config=tune_config(sweep),
        run_config=tune.RunConfig(
            name=sweep.name, storage_path=str(storage), verbose=0,
            failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
            callbacks=[RecordSignals(), StateDigests(), OneLinePerResult(show),
                       ProgressLines(ray_trials(sweep)), *callbacks]))
    record_digest(path)  # Tune wrote tuner.pkl as it built the Tuner
    return tuner


def trial_space(sweep: Sweep) -> dict:
    """What each Ray trial is: ``overrides`` (a point of the search space), or with ``--pack``
    a ``pack`` (the points of one pack, ``sweeps.spec.packs``; ``sweeps.pack_trainable``)."""
    if sweep.pack == 1:
        return {"overrides": dict(sweep.space)}
    return {"pack": tune.grid_search(packs(sweep))}


def tune_config(sweep: Sweep) -> tune.TuneConfig:
    named = {"trial_name_creator": trial_label, "trial_dirname_creator": trial_label}
    if sweep.searcher is None:
        return tune.TuneConfig(num_samples=sweep.num_samples, reuse_actors=False, **named)
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    metrics = [m for m, _ in objectives(sweep)]
    modes = [m for _, m in objectives(sweep)]
    single = len(metrics) == 1
    algo = OptunaSearch(metric=metrics[0] if single else metrics,
                        mode=modes[0] if single else modes, seed=sweep.base.train.seed)
    if sweep.max_concurrent:
        algo = ConcurrencyLimiter(algo, max_concurrent=sweep.max_concurrent)
    return tune.TuneConfig(search_alg=algo, num_samples=sweep.num_samples, reuse_actors=False,
                           **named)


def check_resources(sweep: Sweep) -> None:
    """A trial asking for more than any node has would wait forever: fail now instead."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    cpus = max((n.get("CPU", 0) for n in nodes), default=0)
    gpus = max((n.get("GPU", 0) for n in nodes), default=0)
    if sweep.cpus_per_trial > cpus or sweep.gpus_per_trial > gpus:
        raise ValueError(
            f"each trial asks for {sweep.cpus_per_trial} CPU and {sweep.gpus_per_trial} GPU, but "
            f"the largest node has {cpus} CPU and {gpus} GPU; lower --cpus-per-trial / "
            "--gpus-per-trial, or add nodes that have them (cluster.yaml worker types)")
