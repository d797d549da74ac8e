"""How the MLflow UI (pinned: 3.17) shows a flatlm experiment: where its runs table is, the
view it opens in, and the metric names MLflow sees. No MLflow import: plain strings and JSON.

What MLflow 3.17's UI does, read in its JS bundle (``mlflow/server/js/build``) and checked in
headless Chromium on a fresh profile:

* An experiment opens in the GenAI view (overview of traces, tokens, cost) unless the address
  says ``workflowType=machine_learning``: the UI takes the view from that query parameter, else
  from the browser's local storage (``mlflow.workflowType``, default ``genai``). The experiment
  tag ``mlflow.experimentKind`` is not read for it (the feature flag that selects the
  workflowType path is on in 3.17). :func:`experiment_url` therefore carries the parameter.
* The runs table shows no metric column until one is chosen. A *saved view* is an experiment
  tag ``mlflow.sharedViewState.<id>`` holding ``{"name", "createdAt", "updatedAt", "state"}``
  with ``state`` the JSON of the page's search facets and UI state (``selectedColumns``,
  ``compareRunSections``, ``compareRunCharts``, ...); ``viewStateShareKey=<id>`` in the address
  opens it, and the page's "Views" menu lists it. flatlm writes one (:func:`runs_view_tag`) with
  the sweep's metric columns and its chart sections in reading order.
* The charts view groups a metric under the part of its name before the *last* ``/``
  (``probe/A/acc_mean`` in ``probe/A``) and sorts sections and charts alphabetically. Standard
  errors are therefore sent as ``se/<key>`` (:func:`mlflow_metric_name`): their sections sort
  after the estimates' and the saved view folds them.
* Run tags whose names start with ``mlflow.`` or ``_mlflow_`` are not shown
  (``isUserFacingTag``); flatlm's internal tags start with :data:`HIDDEN_TAG_PREFIX`.
* The runs table prints a metric with every digit it has (``1.88584677435...``, cut by the
  column's width) and has no setting for fewer (mlflow/mlflow#17150, open). It prints a tag as
  its text, so the tracker also keeps the latest value of each headline metric as a tag rounded
  to :data:`DISPLAY_DIGITS` significant digits (:func:`rounded`, :func:`display_tags`), and the
  saved view shows those columns first. The metrics stay exact: the charts, the exact columns
  after them and every reader use those. A tag sorts as text: sort by the exact column.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import urlencode

HIDDEN_TAG_PREFIX = "mlflow.flatlm."  # run tags the UI does not show (internal state)
SE_SUFFIX, SE_PREFIX = "_se", "se/"  # a standard error in metrics.jsonl / in MLflow
DEFAULT_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default
RUNS_VIEW_ID = "flatlm"  # the saved view flatlm writes (its tag and its share key)
VIEW_TAG_PREFIX = "mlflow.sharedViewState."  # MLflow's experiment tags holding saved views
WORKFLOW = {"workflowType": "machine_learning"}  # the model-training view, not GenAI
MODEL_METRICS = "Model metrics"  # the charts view's section of a metric name without "/"
RUN_NAME_COLUMN = "attributes.`Run Name`"  # the runs table's column ids: "<kind>.`<name>`"
RUN_NAME_WIDTH, COLUMN_WIDTH = 260, 120  # pixels: a trial's whole name; a number and its name
DISPLAY_WIDTH = 90  # pixels: a rounded value ("0.03134") and its short name ("acc A")
DISPLAY_DIGITS = 4  # significant digits of the rounded columns: a KL of 0.03134 vs 0.03139
#   still differs, and 4 digits fit DISPLAY_WIDTH
EXPERIMENT_NOTE = "mlflow.note.content"  # the experiment's description: the experiments list's
#   "Description" column and the experiment page's header show it (MLflow 3.17's UI)
MAX_NOTE_CHARS = 5000  # the experiment tag value every MLflow store keeps (its docs' guarantee)
MAX_VIEW_CHARS = 20_000  # the longest experiment tag value MLflow stores (and a view it saves)


def mlflow_metric_name(key: str) -> str:
    """The name a ``metrics.jsonl`` key has in MLflow: a standard error ``<key>_se`` becomes
    ``se/<key>``, so that the UI charts it apart from the estimate; other keys are unchanged.

    >>> mlflow_metric_name("pretrain/kl_se"), mlflow_metric_name("probe/A/acc_se")
    ('se/pretrain/kl', 'se/probe/A/acc')
    >>> mlflow_metric_name("flat/trace_fisher")
    'flat/trace_fisher'
    """
    if key.endswith(SE_SUFFIX) and len(key) > len(SE_SUFFIX):
        return SE_PREFIX + key[:-len(SE_SUFFIX)]
    return key


def metrics_key(name: str) -> str:
    """The ``metrics.jsonl`` key of an MLflow metric name (the inverse of
    :func:`mlflow_metric_name`; names logged before the ``se/`` prefix come back unchanged).

    >>> metrics_key("se/pretrain/kl"), metrics_key("pretrain/kl_se"), metrics_key("n_params")
    ('pretrain/kl_se', 'pretrain/kl_se', 'n_params')
    """
    if name.startswith(SE_PREFIX) and len(name) > len(SE_PREFIX):
        return name[len(SE_PREFIX):] + SE_SUFFIX
    return name


def rounded(value: float, digits: int = DISPLAY_DIGITS) -> str:
    """``value`` to ``digits`` significant digits as a runs table column shows it: positional
    from 1e-4 to below 1e6 with its trailing zeros (a column's values line up), else with an
    exponent.

    >>> rounded(1.88584677435), rounded(0.0313406901), rounded(27.0306777), rounded(0.5)
    ('1.886', '0.03134', '27.03', '0.5000')
    >>> rounded(9.99996), rounded(106128.0), rounded(3.2e-7), rounded(float("nan"))
    ('10.00', '106100', '3.200e-07', 'nan')
    """
    value = float(value)
    scientific = f"{value:.{digits - 1}e}"  # rounded once, here: "1.886e+00"
    if not math.isfinite(value) or value == 0:
        return f"{value:.{digits - 1}f}" if value == 0 else str(value)
    exponent = int(scientific.split("e")[1])  # of the rounded value: 9.99996 -> 1.000e+01
    if not -4 <= exponent < 6:
        return scientific
    return f"{float(scientific):.{max(digits - 1 - exponent, 0)}f}"


def display_tags(rows: Mapping[int, Mapping[str, float]],
                 columns: Mapping[str, str]) -> dict[str, str]:
    """The runs table's rounded columns as run tags: ``columns`` maps a metric key to its
    column's name, and each column holds the metric's value at the latest step that has one
    (the value MLflow's exact column shows), :func:`rounded`. ``rows``: step -> metrics.

    >>> display_tags({0: {"pretrain/kl": 0.6931}, 200: {"pretrain/kl": 0.0313406, "x": 1}},
    ...              {"pretrain/kl": "KL", "flat/trace_fisher": "Tr F"})
    {'KL': '0.03134'}
    """
    tags = {}
    for key, name in columns.items():
        steps = [s for s, row in rows.items() if isinstance(row.get(key), int | float)]
        if steps:
            tags[name] = rounded(rows[max(steps)][key])
    return tags


def ui_address(tracking_uri: str) -> str:
    """Where the UI of ``tracking_uri`` is: the server itself, or `mlflow ui`'s default address
    for a local store.

    >>> ui_address("http://10.0.0.1:5000/"), ui_address("sqlite:////w/mlflow.db")
    ('http://10.0.0.1:5000', 'http://127.0.0.1:5000')
    """
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return DEFAULT_UI


def experiment_url(ui: str, experiment_id: str, view: str | None = RUNS_VIEW_ID) -> str:
    """The address of the experiment's runs table in the model-training view, through the saved
    view ``view`` (None: MLflow's default columns).

    >>> experiment_url("http://127.0.0.1:5000", "3")
    'http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning&viewStateShareKey=flatlm'
    """
    query = {**WORKFLOW, **({"viewStateShareKey": view} if view else {})}
    return f"{ui.rstrip('/')}/#/experiments/{experiment_id}/runs?{urlencode(query)}"


def description_tag(text: str) -> dict[str, str]:
    """The experiment tag holding ``text`` as its description, cut to what every store keeps.

    >>> description_tag("a sweep")
    {'mlflow.note.content': 'a sweep'}
    """
    cut = text if len(text) <= MAX_NOTE_CHARS else text[:MAX_NOTE_CHARS - 1] + "…"
    return {EXPERIMENT_NOTE: cut}


def chart_section(name: str) -> str:
    """The charts view's section of an MLflow metric name: what precedes its last ``/``
    (MLflow 3.17's ``extractChartSectionName``), ``Model metrics`` for a name without one.

    >>> chart_section("probe/A/acc_mean"), chart_section("se/pretrain/kl"), chart_section("n")
    ('probe/A', 'se/pretrain', 'Model metrics')
    """
    return name.rsplit("/", 1)[0] if "/" in name else MODEL_METRICS


def runs_view_tag(*, columns: Sequence[str], params: Iterable[str] = (),
                  display: Iterable[str] = (),
                  charts: Sequence[str] = (), log_scale: Iterable[str] = (),
                  metrics: Iterable[str] = (), name: str = RUNS_VIEW_ID,
                  now_ms: int | None = None) -> tuple[str, str]:
    """``(tag key, tag value)`` of a saved view of the runs page (set it on the experiment).

    Args:
        columns: the runs table's exact metric columns, in order (``metrics.jsonl`` keys).
        params: its param columns, before the exact metrics.
        display: the rounded columns' names (run tags: :func:`display_tags`), first.
        charts: the metrics charted first (line charts over steps), in order: their sections
            lead the charts view, these charts first in them.
        log_scale: those of ``charts`` drawn on a logarithmic y axis (a quantity that falls by
            orders of magnitude from the initial model, such as the KL: the runs' differences at
            the end stay visible).
        metrics: the other metrics the runs will have, as far as known: their sections follow,
            sorted, then the standard errors' sections (``se/...``) in the same order, folded.
            MLflow adds the charts of every metric not charted here after these within a
            section, and the sections of metrics not known here at the end. When the view
            would not fit in a tag (``MAX_VIEW_CHARS``), only the charts' sections are listed.
        now_ms: the view's creation time (default: now).
    """
    now = int(time.time() * 1000) if now_ms is None else int(now_ms)
    rounded_columns = [f"tags.`{name}`" for name in display]
    selected = (rounded_columns + [f"params.`{p}`" for p in params]
                + [f"metrics.`{mlflow_metric_name(m)}`" for m in columns])
    metrics, logs = list(metrics), set(log_scale)
    for known in (metrics, ()):
        state = {
            "selectedColumns": selected,
            "columnOrder": [RUN_NAME_COLUMN, *selected],
            "columnWidths": {RUN_NAME_COLUMN: RUN_NAME_WIDTH,
                             **dict.fromkeys(selected, COLUMN_WIDTH),
                             **dict.fromkeys(rounded_columns, DISPLAY_WIDTH)},
            # the sections in this order (isAccordionReordered); MLflow appends the charts of
            # the metrics not listed after a section's own (isReordered), not sorted in
            "compareRunSections": [{"uuid": _section_id(s), "name": s, "display": not
                                    s.startswith(SE_PREFIX), "isReordered": True,
                                    "deleted": False, "isGenerated": True}
                                   for s in chart_sections(charts, [*columns, *known])],
            "compareRunCharts": [_line_chart(m, m in logs) for m in charts],
            "isAccordionReordered": True,
        }
        envelope = _compact({"name": name, "createdAt": now, "updatedAt": now,
                             "state": _compact(state)})
        if len(envelope) <= MAX_VIEW_CHARS:
            break
    return VIEW_TAG_PREFIX + name, envelope


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def chart_sections(charts: Iterable[str], metrics: Iterable[str]) -> list[str]:
    """The charts view's sections in reading order: those of ``charts`` as they come, those of
    the other ``metrics`` sorted, then the standard errors' in the same order (``metrics.jsonl``
    keys in, MLflow's section names out).

    >>> chart_sections(["pretrain/kl", "flat/trace_fisher"],
    ...                ["probe/A/acc_mean", "probe/A/acc_se", "pretrain/kl_se", "n_params"])
    ['pretrain', 'flat', 'probe/A', 'Model metrics', 'se/pretrain', 'se/probe/A']
    """
    names = [mlflow_metric_name(m) for m in charts]
    known = {mlflow_metric_name(m) for m in metrics} | set(names)
    lead = list(dict.fromkeys(chart_section(m) for m in names))
    sections = {chart_section(m) for m in known}
    rest = sorted((s for s in sections if s not in lead and not s.startswith(SE_PREFIX)),
                  key=lambda s: (s == MODEL_METRICS, s))  # MLflow's own place for it: last
    order = lead + rest
    errors = [SE_PREFIX + s for s in order if SE_PREFIX + s in sections]
    errors += sorted(s for s in sections if s.startswith(SE_PREFIX) and s not in errors)
    return order + errors


def _section_id(section: str) -> str:
    return "flatlm-section-" + section.replace("/", "-").replace(" ", "-")


def _line_chart(metric: str, log: bool = False) -> dict:
    """A line chart of ``metric`` over training steps: MLflow 3.17's LINE card with its
    defaults (``RunsChartsLineCardConfig``), the y axis logarithmic with ``log``."""
    name = mlflow_metric_name(metric)
    return {"uuid": "flatlm-chart-" + name.replace("/", "-"), "type": "LINE",
            "runsCountToCompare": 10, "metricSectionId": _section_id(chart_section(name)),
            "deleted": False, "isGenerated": True, "displayName": name, "metricKey": name,
            "lineSmoothness": 0, "xAxisScaleType": "linear",
            "scaleType": "log" if log else "linear",
            "range": {}, "xAxisKey": "step", "selectedXAxisMetricKey": "", "yAxisKey": "metric",
            "yAxisExpressions": [], "ignoreOutliers": False, "useGlobalXaxisKey": True,
            "useGlobalLineSmoothing": True}
