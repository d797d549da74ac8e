"""The Ray Tune glue shared by every sweep script: the only module that imports Ray.

A sweep is a ``Sweep``: a name, a base ``TrialConfig``, a search space over dotted config keys
(the same keys as ``--set``), resources per trial and an optional searcher. ``main(build)`` gives
every script the same command line::

    python sweeps/scaling.py                       # tiny CPU sweep on a local Ray instance
    python sweeps/scaling.py --preset paper --address auto --gpus-per-trial 0.5
    python sweeps/scaling.py --set train.steps=400 --set measure.n_eval=500
    python sweeps/scaling.py --resume              # continue an interrupted sweep

Each trial runs ``flatlm.trial.run_trial`` in a Tune function trainable. At each checkpoint it
logs the metrics to the trial's MLflow run (``flatlm.track``; the run id travels in the
checkpoint, so retries and resumes keep one run per trial), then reports them to Tune with the
checkpoint directory, which Tune persists under the sweep's storage path. A retried trial
(``FailureConfig``) restores that checkpoint and continues from it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

# Ray reads these at import: keep it on loopback, no token auth prompt, quiet, no chdir.
for _key, _value in {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled", "RAY_AIR_NEW_OUTPUT": "0", "RAY_CHDIR_TO_TRIAL_DIR": "0",
    "RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS": "0", "RAY_DEDUP_LOGS": "0",
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1", "HF_HUB_OFFLINE": "1",
}.items():
    os.environ.setdefault(_key, _value)

import ray  # noqa: E402
from ray import tune  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python sweeps/x.py` from a checkout: analysis/ importable
    sys.path.insert(0, str(REPO))

from flatlm.config import apply_overrides, from_dict, to_dict  # noqa: E402
from flatlm.trial import TrialConfig, validate_trial  # noqa: E402


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """One experiment: trials = base config x search space."""

    name: str  # MLflow experiment and Ray experiment name
    base: TrialConfig  # what every trial shares
    space: dict = field(default_factory=dict)  # dotted key -> tune.grid_search([...]) or a
    #   distribution (tune.loguniform, ...); the same keys as --set
    cpus_per_trial: float = 1.0  # Ray CPUs per trial (Ray sets OMP threads to match)
    gpus_per_trial: float = 0.0  # fractional: 0.25 packs four small trials on one GPU
    num_samples: int = 1  # repeats of the grid, or trials drawn by a searcher
    max_concurrent: int = 0  # with a searcher: trials in flight (0 = Ray's default)
    objectives: tuple[tuple[str, str], ...] = ()  # (metric, "min"|"max") for a searcher
    searcher: str | None = None  # None (grid / random) or "optuna"
    max_failures: int = 3  # retries of a failed trial from its last checkpoint
    analysis_task: str | None = None  # downstream task for the closing correlation table


# ---------------------------------------------------------------------------- the trainable


OUTBOX = ("pending.jsonl", "sent.jsonl", "tracker.json")  # the tracker's files (flatlm.track)
TRAVELLING = (*OUTBOX, "metrics.jsonl")  # trial files a checkpoint carries to a new node
# Artifacts of a trial's MLflow run: its config, every checkpoint's measurements, its curves.
TRIAL_ARTIFACTS = ("metrics.jsonl", "metrics.json", "trial_config.json", "*.png")
FINISH_WAIT_S = 300.0  # how long a trial ending in a tracking outage waits for MLflow
#   (env FLATLM_FINISH_WAIT_S overrides it)


def _restore_checkpoint(out_dir: Path) -> str | None:
    """Copies Tune's latest checkpoint (if any) into ``out_dir``; returns its MLflow run id.

    On a fresh node (a retry after a node was lost) the tracker's outbox comes back from the
    checkpoint too, so rows that had not reached MLflow yet are still sent.
    """
    ckpt = tune.get_checkpoint()
    if ckpt is None:
        return None
    with ckpt.as_directory() as d:
        info = json.loads((Path(d) / "tracking.json").read_text())
        target = out_dir / "checkpoints" / f"step-{info['step']}"
        if not target.exists():
            shutil.copytree(d, target, ignore=shutil.ignore_patterns("outbox"))
        if not (out_dir / "tracker.json").exists():
            for name in TRAVELLING:
                if (Path(d) / "outbox" / name).exists():
                    shutil.copy2(Path(d) / "outbox" / name, out_dir / name)
        return info.get("run_id")


def _save_tracking(ckpt_dir: Path, out_dir: Path, run_id: str | None, step: int) -> None:
    """The run id, the outbox and metrics.jsonl travel in the checkpoint Tune persists (a new
    node then re-sends what MLflow missed and keeps the trial's full metrics.jsonl artifact)."""
    (ckpt_dir / "tracking.json").write_text(json.dumps({"run_id": run_id, "step": step}))
    (ckpt_dir / "outbox").mkdir(exist_ok=True)
    for name in TRAVELLING:
        if (out_dir / name).exists():
            shutil.copy2(out_dir / name, ckpt_dir / "outbox" / name)


def _tags(cfg: TrialConfig, sweep: dict) -> dict:
    from flatlm.models.presets import parameter_count, parse_model
    from flatlm.sources import load

    source = load(cfg.source)
    n_params = parameter_count(parse_model(cfg.model), source.V, source.max_length)
    return {"sweep": sweep["name"], "preset": cfg.model, "n_params": n_params,
            "algorithm": cfg.train.algorithm, "source": cfg.source}


def trainable(config: dict) -> None:
    """Tune function trainable: one ``run_trial`` with MLflow logging and Tune checkpoints."""
    import torch

    from flatlm.track import MlflowTracker, find_run
    from flatlm.trial import run_trial

    sweep = config["sweep"]
    cfg = apply_overrides(from_dict(TrialConfig, config["base"]), config["overrides"])
    name = tune.get_context().get_trial_name()
    out_dir = Path(sweep["trials_dir"]) / name
    out_dir.mkdir(parents=True, exist_ok=True)
    run_id = _restore_checkpoint(out_dir)
    if run_id is None and not (out_dir / "tracker.json").exists():
        run_id = find_run(sweep["tracking_uri"], sweep["experiment_id"], name)
    tracker = MlflowTracker(sweep["tracking_uri"], out_dir, experiment_id=sweep["experiment_id"],
                            run_id=run_id, run_name=name, params=cfg, tags=_tags(cfg, sweep))

    def report(step: int, metrics: dict, ckpt_dir: Path) -> None:
        tracker.report(step, metrics)  # before Tune's report: a kill after it loses nothing
        tracker.sync_artifacts(out_dir, patterns=TRIAL_ARTIFACTS)
        _save_tracking(ckpt_dir, out_dir, tracker.run_id, step)
        tune.report({**metrics, "step": step},
                    checkpoint=tune.Checkpoint.from_directory(str(ckpt_dir)))

    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        run_trial(cfg, out_dir, report, device=device)
    except BaseException:
        tracker.finish("FAILED")
        raise
    try:
        _plot_trial(out_dir, name, cfg)
    except Exception as e:  # noqa: BLE001 - a figure is not worth failing a finished trial
        print(f"trial {name}: could not plot its curves: {e}", file=sys.stderr, flush=True)
    tracker.sync_artifacts(out_dir, patterns=TRIAL_ARTIFACTS)
    _finish(tracker, "FINISHED", float(os.environ.get("FLATLM_FINISH_WAIT_S", FINISH_WAIT_S)))


def _plot_trial(out_dir: Path, name: str, cfg: TrialConfig) -> None:
    """``curves.png``: the trial's measurements over training steps (a figure to look at in the
    MLflow UI), and ``trial_config.json`` (a copy of config.json under an unambiguous name)."""
    import pandas as pd

    from analysis.figures import metrics_over_steps
    from flatlm.trial import read_metrics

    rows = pd.DataFrame(list(read_metrics(out_dir).values()))
    if rows.empty:
        return
    rows["run_id"], rows["algorithm"] = name, cfg.train.algorithm
    keys = [k for k in ("pretrain/loss", "pretrain/kl", "flat/trace_fisher", "flat/trace_hessian")
            if k in rows] + sorted(k for k in rows if k.startswith("probe/")
                                   and k.endswith("acc_mean"))
    metrics_over_steps(rows, out_dir / "curves.png", keys=keys, title=name)
    shutil.copy2(out_dir / "config.json", out_dir / "trial_config.json")


def _finish(tracker, status: str, wait_s: float) -> bool:
    """Ends the trial's MLflow run, waiting up to ``wait_s`` through a tracking outage.

    ``finish`` never raises: while the server is down it returns False, and a trial that simply
    returned then would leave its run RUNNING with its last rows unsent in the outbox. The driver
    re-sends what is still undelivered after ``fit`` (``_finish_undelivered``, for the outboxes it
    can see); on a cluster, ``MlflowTracker(uri, out_dir).finish()`` on the trial's node does.
    """
    deadline = time.monotonic() + wait_s
    while not tracker.finish(status):
        if time.monotonic() >= deadline:
            print(f"MLflow unreachable for {wait_s:.0f} s: run {tracker.run_id} not ended; its "
                  f"unsent rows stay in {tracker.outbox_dir}", file=sys.stderr, flush=True)
            return False
        time.sleep(min(5.0, max(deadline - time.monotonic(), 0.0)))
    return True


def _finish_undelivered(trials_dir: Path, uri: str, experiment_id: str) -> None:
    """Ends the runs whose trials could not deliver their end (or last rows) to MLflow."""
    from flatlm.track import STATE_FILE, MlflowTracker

    for state_file in sorted(trials_dir.glob(f"*/{STATE_FILE}")):
        try:
            state = json.loads(state_file.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if state.get("pending_status"):
            out_dir = state_file.parent
            tracker = MlflowTracker(uri, out_dir, experiment_id=experiment_id,
                                    run_name=out_dir.name)
            if not tracker.finish():
                print(f"MLflow still unreachable: run of trial {out_dir.name} not ended; "
                      f"re-send with MlflowTracker({uri!r}, {str(out_dir)!r}).finish()",
                      file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------- the driver


def check_sweep(sweep: Sweep) -> None:
    """Builds every grid point's config and validates it: bad sweeps fail before any trial."""
    grid = {k: v["grid_search"] for k, v in sweep.space.items()
            if isinstance(v, dict) and "grid_search" in v}
    points = [{}]
    for key, values in grid.items():
        points = [{**p, key: v} for p in points for v in values]
    for point in points:
        cfg = apply_overrides(sweep.base, point)
        validate_trial(cfg)
    if sweep.cpus_per_trial <= 0 or sweep.gpus_per_trial < 0:
        raise ValueError("--cpus-per-trial must be > 0 and --gpus-per-trial >= 0")


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


class OneLinePerResult(tune.Callback):
    """Prints one readable line per reported checkpoint (the default tables are noisy)."""

    def __init__(self, keys: tuple[str, ...]):
        self.keys = keys

    def on_trial_result(self, iteration, trials, trial, result, **info):
        shown = "  ".join(f"{k.split('/', 1)[-1]}={result[k]:.4g}" for k in self.keys
                          if isinstance(result.get(k), int | float))
        print(f"[{trial.trial_id}] step {result.get('step')}: {shown}", flush=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        print(f"[{trial.trial_id}] failed; it will retry from its last checkpoint if it can",
              flush=True)


def _tune_config(sweep: Sweep):
    if sweep.searcher is None:
        return tune.TuneConfig(num_samples=sweep.num_samples, reuse_actors=False)
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    metrics = [m for m, _ in sweep.objectives]
    modes = [m for _, m in sweep.objectives]
    single = len(metrics) == 1
    algo = OptunaSearch(metric=metrics[0] if single else metrics,
                        mode=modes[0] if single else modes, seed=sweep.base.train.seed)
    if sweep.max_concurrent:
        algo = ConcurrencyLimiter(algo, max_concurrent=sweep.max_concurrent)
    return tune.TuneConfig(search_alg=algo, num_samples=sweep.num_samples, reuse_actors=False)


def run_sweep(sweep: Sweep, *, workdir: Path, tracking_uri: str | None, address: str | None,
              resume: bool, show: tuple[str, ...],
              callbacks: Sequence[tune.Callback] = ()) -> Path:
    """Runs (or resumes) the sweep; returns the Ray experiment directory.

    ``callbacks``: extra Tune callbacks for a new sweep (tests inject faults with one); a resumed
    sweep keeps the callbacks it was started with.
    """
    from flatlm.track import default_artifact_location, default_tracking_uri, ensure_experiment

    check_sweep(sweep)
    workdir = workdir.absolute()
    storage = workdir / "ray_results"
    uri = tracking_uri or default_tracking_uri(workdir)
    experiment_id = ensure_experiment(uri, sweep.name, default_artifact_location(workdir))
    if address:
        ray.init(address=address, logging_level="ERROR")
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")
    try:
        check_resources(sweep)
        trainable_ = tune.with_resources(trainable, {"cpu": sweep.cpus_per_trial,
                                                     "gpu": sweep.gpus_per_trial})
        path = storage / sweep.name
        trials_dir = workdir / "trials" / sweep.name
        if resume and tune.Tuner.can_restore(str(path)):
            tuner = tune.Tuner.restore(str(path), trainable=trainable_, resume_errored=True,
                                       resume_unfinished=True)
        else:
            if path.exists() and not resume:
                raise ValueError(f"{path} holds an earlier sweep named {sweep.name!r}: pass "
                                 "--resume to continue it, or --name to start another")
            sweep_info = {"name": sweep.name, "tracking_uri": uri, "experiment_id": experiment_id,
                          "trials_dir": str(trials_dir)}
            tuner = tune.Tuner(
                trainable_,
                param_space={"base": to_dict(sweep.base), "overrides": dict(sweep.space),
                             "sweep": sweep_info},
                tune_config=_tune_config(sweep),
                run_config=tune.RunConfig(
                    name=sweep.name, storage_path=str(storage), verbose=0,
                    failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
                    callbacks=[OneLinePerResult(show), *callbacks]))
        results = tuner.fit()
        _finish_undelivered(trials_dir, uri, experiment_id)
        errors = [r.error for r in results if r.error]
        if errors:
            raise RuntimeError(f"{len(errors)} trial(s) failed after retries: {errors[0]}")
        return path
    finally:
        ray.shutdown()


# ------------------------------------------------------------------------- command line


def parse_overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--set {pair!r}: write KEY=VALUE, e.g. train.lr=3e-4")
        out[key.strip()] = value.strip()
    return out


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--preset", default="tiny", choices=("tiny", "paper"),
                   help="tiny: a few small CPU trials (default); paper: the paper's settings")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a trial config key for every trial (repeatable), e.g. "
                        "train.steps=400")
    p.add_argument("--name", help="experiment name (default: the script's)")
    p.add_argument("--workdir", default=".", help="where mlflow.db, mlruns/, ray_results/ and "
                   "trials/ go (default: the current directory)")
    p.add_argument("--tracking-uri", help="MLflow tracking server (default: sqlite in workdir)")
    p.add_argument("--address", help="attach to a Ray cluster ('auto' on a cluster node)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep")
    p.add_argument("--cpus-per-trial", type=float)
    p.add_argument("--gpus-per-trial", type=float)
    p.add_argument("--max-failures", type=int)
    return p


def main(build: Callable[[argparse.Namespace], Sweep], description: str,
         add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> int:
    p = parser(description)
    if add_arguments:
        add_arguments(p)
    args = p.parse_args()
    try:
        sweep = build(args)
        overrides = parse_overrides(args.overrides)
        swept = sorted(set(overrides) & set(sweep.space))
        sweep = replace(sweep, base=apply_overrides(sweep.base, overrides),
                        **{k: v for k, v in (("name", args.name),
                                             ("cpus_per_trial", args.cpus_per_trial),
                                             ("gpus_per_trial", args.gpus_per_trial),
                                             ("max_failures", args.max_failures)) if v is not None})
        if swept:  # the search space would silently replace the value
            validate_trial(sweep.base)  # a bad value is named as such first
            raise ValueError(f"--set {', '.join(swept)}: this sweep varies {', '.join(swept)} "
                             "itself (its search space), so the value would be ignored; drop "
                             "the --set, or use a sweep script that does not vary it")
        workdir = Path(args.workdir)
        run_sweep(sweep, workdir=workdir, tracking_uri=args.tracking_uri, address=args.address,
                  resume=args.resume, show=_shown_metrics(sweep))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    _summarise(sweep, workdir.absolute(), args.tracking_uri)
    return 0


def _shown_metrics(sweep: Sweep) -> tuple[str, ...]:
    task = sweep.analysis_task or "B"
    return ("pretrain/loss", "pretrain/kl", "flat/trace_fisher", f"probe/{task}/acc_mean")


def _summarise(sweep: Sweep, workdir: Path, tracking_uri: str | None) -> None:
    """Prints the correlation table and where to look."""
    from analysis.correlate import correlation_markdown, correlation_table
    from analysis.runs import load_runs
    from flatlm.track import default_tracking_uri

    uri = tracking_uri or default_tracking_uri(workdir)
    table = load_runs(uri, sweep.name)
    task = sweep.analysis_task or "B"
    print(f"\nCorrelations with downstream accuracy (probe/{task}/acc_mean), all checkpoints:")
    print(correlation_markdown(correlation_table(table, f"probe/{task}/acc_mean")))
    print(f"\nMLflow UI:  cd {workdir} && mlflow ui --backend-store-uri {uri}")
    print(f"Report:     python {REPO / 'analysis' / 'report.py'} --experiment {sweep.name} "
          f"--tracking-uri {uri} --task {task} --out {workdir / 'report' / sweep.name}")
