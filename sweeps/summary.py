"""The sweep's closing summary, printed by the driver: correlations with downstream accuracy and
where to look next. The only sweep module that imports ``analysis/``; it never runs in a Ray
worker."""

from __future__ import annotations

import shlex
import textwrap
import warnings
from pathlib import Path

from analysis.conclusion import conclusion
from analysis.correlate import correlation_markdown, correlation_table
from analysis.runs import load_runs
from analysis.selection import selection_markdown, selection_table, verdict
from flatlm.tracking.tracker import default_tracking_uri
from sweeps.spec import Sweep, accuracy_key, saturation, saturation_flag, sweep_task

REPO = Path(__file__).resolve().parents[1]  # the checkout: analysis/ is not an installed package


class TrackingUnreachable(Exception):  # noqa: N818 - the summary's store is down
    """The summary could not read the sweep's runs from MLflow."""


def summarise(sweep: Sweep, workdir: Path, tracking_uri: str | None) -> None:
    """Prints the correlation table of every checkpoint and the commands to look further."""
    uri = tracking_uri or default_tracking_uri(workdir)
    try:
        runs = load_runs(uri, sweep.name)
    except Exception as e:  # noqa: BLE001 - whatever MLflow raises when it cannot be reached
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise TrackingUnreachable(f"MLflow at {uri} could not be read ({first})") from None
    key, task = accuracy_key(sweep), sweep_task(sweep)
    with warnings.catch_warnings():  # an empty or thin regime is said in the conclusion
        warnings.simplefilter("ignore", UserWarning)
        table = correlation_table(runs, key, **saturation(sweep))
    words = conclusion(runs, table, key, **saturation(sweep))
    print(f"\nWhat this sweep can conclude:\n{textwrap.fill(words, 100)}")
    cost = measurement_cost(runs)
    if cost:
        print(f"\n{cost}")
    if len(table):
        print(f"\nCorrelations with downstream accuracy ({key}), saturated checkpoints:")
        print(correlation_markdown(table))
        _print_selection(sweep, runs, key)
    report = ["--experiment", sweep.name, "--tracking-uri", uri, "--task", task,
              *saturation_flag(sweep).split(), "--out", str(workdir / "report" / sweep.name)]
    print(f"\nMLflow UI:  cd {shlex.quote(str(workdir))} && "
          f"{shlex.join(['mlflow', 'ui', '--backend-store-uri', uri])}")
    print(f"Report:     {shlex.join(['python', str(REPO / 'analysis' / 'report.py'), *report])}")
    if sweep.selection:
        print("Selection:  "
              f"{shlex.join(['python', str(REPO / 'analysis' / 'selection.py'), *report])}")


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
