"""The sweep's driver: starts (or resumes) the Tune experiment, prints one line per result, and
after ``fit`` ends the MLflow runs whose trials could not deliver their end."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from flatlm.core.config import flatten_dict, to_dict
from flatlm.experiments.grids import trial_name
from flatlm.runs.dirlock import DirectoryBusyError, writer_lock
from flatlm.tracking.ledger import STATE_FILE, read_state
from flatlm.tracking.tracker import (
    MlflowTracker,
    default_artifact_location,
    default_tracking_uri,
    ensure_experiment,
    store_lock,
)
from sweeps.rayenv import ray, tune
from sweeps.spec import Sweep, check_sweep, check_tracking_uri, objectives
from sweeps.trainable import DIVERGED_FILE, trainable
from sweeps.trust import (
    StateDigests,
    check_digest,
    check_trusted,
    record_digest,
)


def run_sweep(sweep: Sweep, *, workdir: Path, tracking_uri: str | None, address: str | None,
              resume: bool, show: tuple[str, ...],
              callbacks: Sequence[tune.Callback] = (), trust_state: bool = False) -> Path:
    """Runs (or resumes) the sweep; returns the Ray experiment directory.

    ``show``: the metrics printed per result (``spec.shown_metrics``). ``callbacks``: extra Tune
    callbacks for a new sweep (tests inject faults with one); a resumed sweep keeps the callbacks
    it was started with. ``trust_state``: resume a sweep whose state has no digest recorded
    here (``sweeps.trust``; copied or moved here), on the owner and permission checks alone.
    """
    check_sweep(sweep)
    check_tracking_uri(tracking_uri)
    workdir = workdir.absolute()
    uri = tracking_uri or default_tracking_uri(workdir)
    _reach_tracking(uri, sweep.name)
    trials_dir = workdir / "trials" / sweep.name
    with one_driver(trials_dir, sweep.name):  # before Ray starts: a refusal costs nothing
        if resume:  # Ray unpickles the sweep's state on restore: code in it would run here
            check_state(workdir / "ray_results" / sweep.name, trust_state)
        return _run(sweep, workdir, uri, trials_dir, address, resume, show, callbacks)


def check_state(path: Path, trust_state: bool) -> None:
    """The trust checks of ``sweeps.trust`` on the state a resume would restore (if there is
    one)."""
    if not (path / "tuner.pkl").exists() and not (path / "tuner.pkl").is_symlink():
        return
    check_trusted(path)
    if trust_state:
        print(f"warning: --trust-state: resuming {path} without verifying its state against "
              "recorded digests", file=sys.stderr, flush=True)
    else:
        check_digest(path, refuse_unrecorded=True)


def _run(sweep: Sweep, workdir: Path, uri: str, trials_dir: Path, address: str | None,
         resume: bool, show: tuple[str, ...], callbacks) -> Path:

    if address:
        ray.init(address=address, logging_level="ERROR")
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")
    try:
        check_resources(sweep)  # before the experiment: a refused sweep leaves no experiment
        experiment_id = ensure_experiment(uri, sweep.name, default_artifact_location(workdir))
        sweep_info = {"name": sweep.name, "preset": sweep.preset, "tracking_uri": uri,
                      "experiment_id": experiment_id, "trials_dir": str(trials_dir)}
        check_resume_settings(sweep, workdir / "ray_results" / sweep.name, resume)
        tuner = _tuner(sweep, workdir / "ray_results", sweep_info, resume, show, callbacks)
        record_settings(sweep, workdir / "ray_results" / sweep.name)
        with _sigterm_as_sigint() as received:
            results = tuner.fit()
        record_digest(workdir / "ray_results" / sweep.name)  # the state this run left
        unfinished = len(results) - results.num_terminated - results.num_errors
        if received or unfinished:  # Tune stops gracefully on SIGINT and returns normally
            finish_undelivered(trials_dir, uri, experiment_id)
            killed = mark_killed(trials_dir, uri)
            raise Interrupted(received[0] if received else signal.SIGINT,
                              count_unfinished(results), killed)
        undelivered = finish_undelivered(trials_dir, uri, experiment_id)
        report_diverged(trials_dir)
        errors = [r.error for r in results if r.error]
        if errors:
            raise RuntimeError(f"{len(errors)} trial(s) failed after retries: {errors[0]}")
        if undelivered:
            raise TrackingIncomplete(uri, undelivered)
        return workdir / "ray_results" / sweep.name
    finally:
        ray.shutdown()


@contextlib.contextmanager
def one_driver(trials_dir: Path, name: str):
    """Holds the sweep's lock (``flatlm.runs.dirlock`` on its trials directory): a second driver of
    the same sweep, say a second ``--resume``, would run the same trials again beside the first.
    The kernel drops the lock when a driver dies, so none goes stale."""
    with contextlib.ExitStack() as held:
        try:  # only taking the lock is this error; the sweep's own errors pass through
            held.enter_context(writer_lock(trials_dir))
        except DirectoryBusyError as e:
            raise ValueError(f"sweep {name!r} is being run by another driver (pid {e.holder}) "
                             f"in {trials_dir.parent.parent}: wait for it to end, or stop it "
                             f"(kill -INT {e.holder}) and then --resume") from None
        yield


SETTINGS_FILE = "flatlm_sweep.json"  # in the Ray experiment directory: what the trials run


def sweep_settings(sweep: Sweep) -> dict:
    """The settings a resumed sweep must share with the one it continues (flat keys)."""
    def plain(o):
        return {k: v for k, v in vars(o).items() if not k.startswith("_")} \
            if hasattr(o, "__dict__") else str(o)

    space = json.loads(json.dumps(sweep.space, default=plain, sort_keys=True))
    return {**flatten_dict(to_dict(sweep.base), "base."), **flatten_dict(space, "space.")}


def check_resume_settings(sweep: Sweep, path: Path, resume: bool) -> None:
    """``--resume`` with settings other than those ``record_settings`` kept is an error naming
    them (Tune would silently keep the old ones). A setting the record lacks (a config field
    added to flatlm since the sweep started) counts as its default: an upgrade alone changes
    nothing."""
    from flatlm.runs.trial import TrialConfig

    file = path / SETTINGS_FILE
    now = sweep_settings(sweep)
    if resume and file.exists():
        before = json.loads(file.read_text())
        defaults = flatten_dict(to_dict(TrialConfig()), "base.")
        changed = sorted(k for k in {*before, *now}
                         if before.get(k, defaults.get(k)) != now.get(k))
        if changed:
            diffs = "; ".join(f"{k}: {before.get(k, defaults.get(k))!r} -> {now.get(k)!r}"
                              for k in changed[:5])
            raise ValueError(f"--resume continues the sweep as it was started, but these "
                             f"settings changed: {diffs}{' ...' if len(changed) > 5 else ''}. "
                             "Resume with the original --set values, or start a new sweep "
                             "with --name")


def record_settings(sweep: Sweep, path: Path) -> None:
    """Writes the settings of a sweep being started (kept when one is resumed)."""
    file = path / SETTINGS_FILE
    if not file.exists():
        path.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(sweep_settings(sweep), indent=1, sort_keys=True) + "\n")


class TrackingIncomplete(Exception):  # noqa: N818 - the sweep ran; its tracking lags
    """Every trial ran, but MLflow could not be reached to end some runs: their rows and status
    wait in the trial directories (``flatlm.tracking.tracker``'s outbox) until a ``--resume``."""

    def __init__(self, uri: str, trials: list[str]):
        super().__init__(f"MLflow at {uri} unreachable at the end of the sweep: {len(trials)} "
                         f"run(s) not ended ({', '.join(trials)}); their metrics are safe in "
                         "their trial directories")
        self.uri, self.trials = uri, trials


class Interrupted(Exception):  # noqa: N818 - a stop the user asked for, not a failure
    """The sweep was stopped by SIGINT / SIGTERM; its state is saved for ``--resume``."""

    def __init__(self, signum: int, unfinished: int, killed: list[str]):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum, self.unfinished, self.killed = signum, unfinished, killed

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


_RECEIVED: list[int] = []  # signals that stopped this driver's fit (module-level: the
#   callback below is unpickled from tuner.pkl on --resume, and must still reach it)


class RecordSignals(tune.Callback):
    """Wraps the SIGINT handler Tune installs for ``fit`` so that the driver learns of the
    stop: Tune handles SIGINT gracefully and ``fit`` returns as if the sweep had ended."""

    def setup(self, **info):
        tune_handler = signal.getsignal(signal.SIGINT)
        if not callable(tune_handler):
            return

        def on_int(signum, frame):
            _RECEIVED.append(signum)
            tune_handler(signum, frame)

        signal.signal(signal.SIGINT, on_int)


@contextlib.contextmanager
def _sigterm_as_sigint():
    """SIGTERM (a scheduler's stop, ``kill``) takes Tune's graceful SIGINT path: the experiment
    state is saved and ``fit`` returns. Yields the list of the signals received."""
    _RECEIVED.clear()

    def on_term(signum, frame):
        _RECEIVED.append(signum)
        signal.raise_signal(signal.SIGINT)

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield _RECEIVED
    finally:
        signal.signal(signal.SIGTERM, old)


def mark_killed(trials_dir: Path, uri: str) -> list[str]:
    """Ends as KILLED the MLflow runs of trials that had not finished (their runs would stay
    RUNNING, or FAILED when Ctrl-C reached the workers too); a resumed trial reopens its run.
    Returns the trials' names."""
    from mlflow import MlflowClient

    client, killed = MlflowClient(uri), []
    for out_dir in sorted(p for p in trials_dir.glob("*") if p.is_dir()):
        run_id = (read_state(out_dir) or {}).get("run_id")
        if (run_id is None or (out_dir / DIVERGED_FILE).exists()
                or client.get_run(run_id).info.status == "FINISHED"):
            continue
        if MlflowTracker(uri, out_dir, run_id=run_id).finish("KILLED"):
            killed.append(out_dir.name)
    return killed


def count_unfinished(results) -> int:
    """Trials an interrupted ``fit`` left to do: Tune marks them TERMINATED like the finished
    ones, but only a trial that returned has its last result ``done``; errored ones excluded."""
    return sum(1 for r in results
               if not (r.metrics or {}).get("done") and r.error is None)


def _tuner(sweep: Sweep, storage: Path, sweep_info: dict, resume: bool, show: tuple[str, ...],
           callbacks: Sequence[tune.Callback]) -> tune.Tuner:
    trainable_ = tune.with_resources(trainable, {"cpu": sweep.cpus_per_trial,
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
    tuner = tune.Tuner(
        trainable_,
        param_space={"base": to_dict(sweep.base), "overrides": dict(sweep.space),
                     "sweep": sweep_info},
        tune_config=_tune_config(sweep),
        run_config=tune.RunConfig(
            name=sweep.name, storage_path=str(storage), verbose=0,
            failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
            callbacks=[RecordSignals(), StateDigests(), OneLinePerResult(show), *callbacks]))
    record_digest(path)  # Tune wrote tuner.pkl as it built the Tuner
    return tuner


def _reach_tracking(uri: str, name: str) -> None:
    """An unreachable store is an error naming the fix before Ray starts (with a few quick
    retries, not MLflow's minutes of back-off). Creates nothing in the store but its schema."""
    from mlflow import MlflowClient

    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
             "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    saved = {k: os.environ.get(k) for k in quick}
    os.environ.update(quick)
    try:
        with store_lock(uri):  # the store's first contact creates its tables
            MlflowClient(uri).get_experiment_by_name(name)
    except Exception as e:  # noqa: BLE001 - any failure to reach the store
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise ValueError(f"MLflow tracking store {uri} is unreachable ({first}); start it "
                         "(mlflow server --host 127.0.0.1 --port 5000, or `ray attach` the "
                         "cluster with -p 5000) or pass another --tracking-uri") from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
        print(f"[{trial}] step {result.get('step')}: {shown}", flush=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        print(f"[{trial}] failed; it will retry from its last checkpoint if it can",
              flush=True)


def trial_label(trial) -> str:
    """A trial's name: what it varies (``flatlm.experiments.grids.trial_name``, the rule the
    local runner names its trials by), then Ray's id (unique, stable across retries and
    resumes): ``d32-h2-l1-i128_seed0_1a0e7_00000``. It names the MLflow run, the console lines
    and the trial directory."""
    varied = trial_name(trial.config.get("overrides", {}))
    return f"{varied}_{trial.trial_id}" if varied else trial.trial_id


def _tune_config(sweep: Sweep) -> tune.TuneConfig:
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


def report_diverged(trials_dir: Path) -> list[str]:
    """Prints the trials that diverged (they end normally for Tune, FAILED in MLflow); returns
    their names."""
    names = []
    for marker in sorted(trials_dir.glob(f"*/{DIVERGED_FILE}")):
        try:
            message = json.loads(marker.read_text())["message"]
        except (OSError, json.JSONDecodeError, KeyError):
            message = "diverged"
        names.append(marker.parent.name)
        print(f"trial {marker.parent.name} diverged, not measured after it: {message}",
              flush=True)
    if names:
        print(f"{len(names)} trial(s) diverged: {', '.join(names)}", flush=True)
    return names


def finish_undelivered(trials_dir: Path, uri: str, experiment_id: str) -> list[str]:
    """Ends the runs whose trials could not deliver their end (or last rows) to MLflow; returns
    the trials whose runs are still not ended (MLflow unreachable)."""
    pending = []
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
                pending.append(out_dir.name)
    return pending
