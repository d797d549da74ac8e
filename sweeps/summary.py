"""The sweep's closing summary, printed by the driver: the per-run table (KL, each probed task's
accuracy, Tr(F), grown Tr(F), each +- its s.e., beside the random-init, lookup-table and
majority-class references) at the final checkpoints and at matched loss, the runs left out with
the reason, what the runs show against the paper and what would make it conclusive, and where to
look next. The correlation table and the model-selection verdict print with ``--verbose`` (the
report always has them). The only sweep module that imports ``analysis/``; it never runs in a
Ray worker."""

from __future__ import annotations

import shlex
import textwrap
import warnings
from pathlib import Path

from analysis.answer import answer_lines
from analysis.conclusion import conclusion
from analysis.correlate import (
    MIN_RUNS,
    N_BOOT,
    RUN,
    Bootstrap,
    correlation_markdown,
    correlation_table,
    saturated,
)
from analysis.effects import design
from analysis.reach import REACH_OPENINGS
from analysis.run_table import glance
from analysis.runs import load_runs
from analysis.selection import selection_markdown, selection_table, verdict
from flatlm.tracking.tracker import default_tracking_uri
from flatlm.tracking.ui import experiment_url, ui_address
from sweeps.spec import Sweep, accuracy_key, saturation, saturation_flag, sweep_task

REPO = Path(__file__).resolve().parents[1]  # the checkout: analysis/ is not an installed package


class TrackingUnreachable(Exception):  # noqa: N818 - the summary's store is down
    """The summary could not read the sweep's runs from MLflow."""


def summarise(sweep: Sweep, workdir: Path, tracking_uri: str | None, *,
              verbose: bool = False) -> None:
    """Prints the per-run tables, the conclusion and the commands to look further; with
    ``verbose`` also the correlation table and the model-selection verdict."""
    uri = tracking_uri or default_tracking_uri(workdir)
    runs = _load(uri, sweep.name)
    if nothing_finished(runs):  # tables over no run would state what no run measured
        print(f"\n{nothing_finished(runs)}")
        _print_commands(sweep, workdir, uri, verbose, runs.attrs.get("experiment_id"))
        return
    key, rule = accuracy_key(sweep), saturation(sweep)
    with warnings.catch_warnings():  # an empty or thin regime is said in the conclusion
        warnings.simplefilter("ignore", UserWarning)
        table = correlation_table(runs, key, boot=Bootstrap(_resamples(runs, rule)), **rule)
    reach, words = _reach_first(conclusion(runs, table, key, **rule))
    if reach:  # what the runs cannot carry comes before any number (issue 42)
        print(f"\n{_paragraphs(reach)}")
    print(f"\n{glance(runs, key, **rule)}")
    print(f"\nWhat this sweep shows ({key}):\n{_paragraphs(words)}")
    committed = answer_lines(design(runs)[0])
    if committed:  # the answer flatlm has, and what this run adds beside it (issue 53)
        print("\n" + "\n".join(committed))
        print(_paragraphs(ADDS))
    cost = measurement_cost(runs)
    if cost:
        print(f"\n{cost}")
    if verbose and len(table):
        print(f"\nCorrelations with downstream accuracy ({key}), saturated checkpoints:")
        print(correlation_markdown(table))
    if verbose or sweep.selection:
        _print_selection(sweep, runs, key)
    _print_commands(sweep, workdir, uri, verbose, runs.attrs.get("experiment_id"),
                    accuracy=key if key in runs and runs[key].notna().any() else None)


# What a no-argument sweep adds to the committed answer, and why it reads no verdict itself.
ADDS = ("What this run adds: a direction on the sweep's own grammar and models, one seed each, "
        "beside the committed verdicts; it cannot confirm or contradict one (the matched-loss "
        "rule needs 3 seeds of each arm read at the same KL, about 2 CPU-hours on testbed v2: "
        "the command above).")


def _resamples(runs, rule: dict) -> int:
    """The bootstrap's resamples: none below MIN_RUNS runs in the regime, where neither the
    conclusion nor the ``--verbose`` table shows an interval (``too_few_runs``); they took
    seconds at the end of every small sweep for nothing."""
    in_regime = runs.loc[saturated(runs, **rule), RUN].nunique() if RUN in runs else 0
    return N_BOOT if in_regime >= MIN_RUNS else 0


def nothing_finished(runs) -> str | None:
    """What to say instead of the tables when no run of the sweep finished (every trial
    diverged or failed), else None."""
    status = runs.get("status")
    if status is not None and (status == "FINISHED").any():
        return None
    if status is None and len(runs):
        return None
    n = runs["run_id"].nunique() if "run_id" in runs else 0
    return (f"No run of this sweep finished ({n} run(s), each diverged or failed: see the "
            "lines above), so there is nothing to compare: no table, no verdict. A diverged "
            "trial names its step and loss; lower train.lr, or see its MLflow run.")


def _load(uri: str, name: str):
    try:
        return load_runs(uri, name)
    except Exception as e:  # noqa: BLE001 - whatever MLflow raises when it cannot be reached
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise TrackingUnreachable(f"MLflow at {uri} could not be read ({first})") from None


def _reach_first(words: str) -> tuple[str, str]:
    """(the conclusion's opening paragraph on what the sweep can conclude, the rest)."""
    first, _, rest = words.partition("\n\n")
    if first.startswith(REACH_OPENINGS):
        return first, rest
    return "", words


def _paragraphs(words: str) -> str:
    return "\n\n".join(textwrap.fill(p, 100) for p in words.split("\n\n"))


def _print_commands(sweep: Sweep, workdir: Path, uri: str, verbose: bool,
                    experiment_id: str | None, accuracy: str | None = "") -> None:
    """Where to look next; ``accuracy``: the accuracy key the runs measured (None: none did,
    so there is no report to make: its command would fail; "": not checked)."""
    report = ["--experiment", sweep.name, "--tracking-uri", uri, "--task", sweep_task(sweep),
              *saturation_flag(sweep).split(), "--out", str(workdir / "report" / sweep.name)]
    print()
    print(ui_lines(uri, workdir, experiment_id, sweep.name))
    if accuracy is None:  # a --quick sweep: the report reads a probe's accuracy
        print(f"Report:     none: no run measured {accuracy_key(sweep)} (--quick measures the "
              "loss and KL only); run the sweep without --quick for the report")
        return
    print(f"Report:     {shlex.join(['python', str(REPO / 'analysis' / 'report.py'), *report])}")
    if not verbose:
        print("            (figures, correlations and model selection; --verbose prints the "
              "correlations here)")
    if sweep.selection:
        print("Selection:  "
              f"{shlex.join(['python', str(REPO / 'analysis' / 'selection.py'), *report])}")


def ui_lines(uri: str, workdir: Path, experiment_id: str | None,
             experiment: str | None = None) -> str:
    """Where to look at the sweep in the MLflow UI: ``flatlm ui`` (starts it on the local store
    and opens the experiment's runs table), then the same by hand: the command that serves the
    store and the address of the runs table (``flatlm.tracking.ui.experiment_url``: the
    model-training view, the sweep's saved view); a server's address alone.

    >>> print(ui_lines("sqlite:////w/mlflow.db", Path("/w"), "1", "scaling"))
    MLflow UI:  flatlm ui --workdir /w --experiment scaling
                or: cd /w && mlflow ui --backend-store-uri sqlite:////w/mlflow.db
                then open http://127.0.0.1:5000/#/experiments/1/runs?workflowType=machine_learning&viewStateShareKey=flatlm
    """
    url = experiment_url(ui_address(uri), experiment_id) if experiment_id else ui_address(uri)
    if uri.startswith(("http://", "https://")):
        return f"MLflow UI:  {url}"
    short = ["flatlm", "ui", "--workdir", str(workdir)]
    short += ["--experiment", experiment] if experiment else []
    serve = shlex.join(["mlflow", "ui", "--backend-store-uri", uri])
    return (f"MLflow UI:  {shlex.join(short)}\n"
            f"            or: cd {shlex.quote(str(workdir))} && {serve}\n"
            f"            then open {url}")


def measurement_cost(runs) -> str | None:
    """What measuring cost against the training it interrupted (``time/measure_share`` of each
    checkpoint with training before it), in one line; None when no checkpoint recorded it."""
    column = "time/measure_share"
    share = runs[column].dropna() if column in runs else []
    if len(share) == 0:
        return None
    return (f"Measuring took {share.median():.1%} of the training time between checkpoints "
            f"(median of {len(share)} checkpoints; largest {share.max():.1%}, the first "
            "checkpoint of a trial also draws its evaluation data and reference probes).")


def _print_selection(sweep: Sweep, runs, key: str) -> None:
    """Would the flattest checkpoint have been a better pick than the lowest-loss one? The
    verdict in words; the whole table for a selection sweep."""
    table = selection_table(runs, key, **saturation(sweep))
    if sweep.selection:
        print(f"\n{selection_markdown(table)}")
    else:
        print(f"\nModel selection: {textwrap.fill(verdict(table), 100)}")
