"""The sweep's driver: reaches MLflow, takes the sweep's lock, checks a resumed sweep's state, then
starts (or resumes) the Tune experiment and, after ``fit``, ends the MLflow runs whose trials
could not deliver their end. Each job lives in its module: ``resume``, ``trust``, ``signals``,
``delivery``, ``tuner``, ``console``, ``progress_board``."""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from flatlm.core.registry import loaded_plugins
from flatlm.measure.eval_cache import remove_stale_temporaries
from flatlm.tracking.tracker import (
    default_artifact_location,
    default_tracking_uri,
    ensure_experiment,
)
from sweeps.delivery import (
    TrackingIncomplete,
    finish_undelivered,
    mark_killed,
    reach_tracking,
    report_diverged,
)
from sweeps.progress_board import start_board
from sweeps.rayenv import ray, tune
from sweeps.resume import check_resume_settings, one_driver, record_settings
from sweeps.signals import Interrupted, count_unfinished, sigterm_as_sigint
from sweeps.spec import (
    Sweep,
    check_sweep,
    check_tracking_uri,
    experiment_tags,
    planned_trials,
)
from sweeps.trust import check_digest, check_trusted, record_digest
from sweeps.tuner import build_tuner, check_resources


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
    reach_tracking(uri, sweep.name)
    trials_dir = workdir / "trials" / sweep.name
    with one_driver(trials_dir, sweep.name):  # before Ray starts: a refusal costs nothing
        if resume:  # Ray unpickles the sweep's state on restore: code in it would run here
            check_state(workdir / "ray_results" / sweep.name, trust_state)
        return _run(sweep, workdir, uri, trials_dir, address, resume, show, callbacks)


class TrialsFailed(RuntimeError):  # noqa: N818 - an outcome the command line reports
    """Trials that failed after their retries: how many of how many, the first one's error in
    one line (Ray's colour codes removed), and where their logs are."""

    def __init__(self, errors: list, total: int, trials_dir: Path):
        first = _ANSI.sub("", str(errors[0])).strip().splitlines() or ["(no message)"]
        last = next((line for line in reversed(first) if line.strip()), first[0])
        super().__init__(f"{len(errors)} of {total} trial(s) failed after their retries; the "
                         f"first: {last.strip()[:300]} (each trial's error.txt and logs are in "
                         f"Ray's trial directories; the trials' own records in {trials_dir})")


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def check_state(path: Path, trust_state: bool) -> None:
    """The trust checks of ``sweeps.trust`` on the state a resume would restore. A sweep whose
    state is gone (no ``tuner.pkl``: deleted, or another machine's storage) is refused: Tune
    would start it again from scratch beside its earlier trials and MLflow runs."""
    if not (path / "tuner.pkl").exists() and not (path / "tuner.pkl").is_symlink():
        raise ValueError(f"--resume: {path / 'tuner.pkl'} is missing, so Ray cannot restore the "
                         "sweep; resuming would start it again beside its earlier runs. Start it "
                         f"anew with another --name, or delete {path} and its trials directory "
                         "to run it again under this name")
    check_trusted(path)
    # --trust-state accepts a sweep with no record here (copied, an older flatlm), never one
    # whose record shows another file: that refusal (StateTampered) stands whatever the flags
    if trust_state:
        print(f"warning: --trust-state: resuming {path}: a state with no digest recorded here "
              "is taken on the owner and permission checks alone; a recorded one is still "
              "verified", file=sys.stderr, flush=True)
    check_digest(path, refuse_unrecorded=not trust_state)


def _run(sweep: Sweep, workdir: Path, uri: str, trials_dir: Path, address: str | None,
         resume: bool, show: tuple[str, ...], callbacks) -> Path:
    print(f"sweep {sweep.name}: {planned_trials(sweep)} trial(s); starting Ray. Each running "
          "trial says where it is every few seconds, and its measurements at each checkpoint",
          flush=True)
    if address:
        ray.init(address=address, logging_level="ERROR")
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")
    try:
        check_resources(sweep)  # before the experiment: a refused sweep leaves no experiment
        experiment_id = ensure_experiment(uri, sweep.name, default_artifact_location(workdir),
                                          tags=experiment_tags(sweep))
        sweep_info = {"name": sweep.name, "scale": sweep.scale, "protocol": sweep.protocol,
                      "tracking_uri": uri,
                      "experiment_id": experiment_id, "trials_dir": str(trials_dir),
                      # every worker imports them before it builds its trial (a node's own
                      # environment does not know the driver's --plugin)
                      "plugins": list(loaded_plugins())}
        check_resume_settings(sweep, workdir / "ray_results" / sweep.name, resume)
        tuner = build_tuner(sweep, workdir / "ray_results", sweep_info, resume, show, callbacks)
        record_settings(sweep, workdir / "ray_results" / sweep.name)
        board = start_board()  # held until fit returns: the trials post their progress to it
        with sigterm_as_sigint() as received:
            results = tuner.fit()
        del board
        record_digest(workdir / "ray_results" / sweep.name)  # the state this run left
        unfinished = len(results) - results.num_terminated - results.num_errors
        if received or unfinished:  # Tune stops gracefully on SIGINT and returns normally
            finish_undelivered(trials_dir, uri, experiment_id)
            killed = mark_killed(trials_dir, uri)
            raise Interrupted(received[0] if received else signal.SIGINT,
                              count_unfinished(results), killed)
        undelivered = finish_undelivered(trials_dir, uri, experiment_id)
        report_diverged(trials_dir)
        remove_stale_temporaries(workdir / "eval_cache")  # no trial writes any more
        errors = [r.error for r in results if r.error]
        if errors:
            raise TrialsFailed(errors, len(results), trials_dir)
        if undelivered:
            raise TrackingIncomplete(uri, undelivered)
        return workdir / "ray_results" / sweep.name
    finally:
        ray.shutdown()
