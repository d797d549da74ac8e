"""Where a sweep's closing summary sends the reader in the MLflow UI (pinned 3.17): the address
of the experiment's runs table in the model-training view, through the saved view the driver
writes on the experiment (``flatlm.tracking.ui``). A real sqlite store, no browser and no Ray
(the browser check: docs/screenshot.js, docs/results.md)."""

import json
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

pytest.importorskip("mlflow")

from mlflow import MlflowClient  # noqa: E402

from flatlm.core.config import apply_overrides  # noqa: E402
from flatlm.experiments.paper import base_of  # noqa: E402
from flatlm.tracking.tracker import default_tracking_uri, ensure_experiment  # noqa: E402
from flatlm.tracking.ui import MAX_VIEW_CHARS, runs_view_tag  # noqa: E402
from sweeps.spec import Sweep, experiment_tags, runs_view  # noqa: E402
from sweeps.summary import ui_lines  # noqa: E402

SIZES = ["d16-h1-l1-i64", "d32-h2-l1-i128"]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """(tracking URI, workdir, experiment id, sweep): the tiny scaling sweep's experiment as
    its driver creates it."""
    workdir = tmp_path_factory.mktemp("view")
    # two tasks, as the sweeps measured before the testbed's grammar (A, B, C) became theirs:
    # the view's structure is what is tested, not which tasks it lists
    sweep = Sweep(name="scaling", base=apply_overrides(base_of("sweep"),
                                                       {"measure.tasks": ["A", "B"]}),
                  space={"model": SIZES})
    uri = default_tracking_uri(workdir)
    return uri, workdir, ensure_experiment(uri, sweep.name, tags=experiment_tags(sweep)), sweep


def saved_view(uri: str, experiment_id: str) -> tuple[dict, dict]:
    """(envelope, state) of the experiment's saved view, checked as MLflow 3.17 reads one
    (``parseSavedViewEnvelope``: a string name, a number createdAt, a string state)."""
    tags = MlflowClient(uri).get_experiment(experiment_id).tags
    envelope = json.loads(tags["mlflow.sharedViewState.flatlm"])
    assert isinstance(envelope["name"], str) and isinstance(envelope["state"], str)
    assert isinstance(envelope["createdAt"], int) and envelope["updatedAt"] >= envelope["createdAt"]
    return envelope, json.loads(envelope["state"])


def test_the_experiment_says_what_it_is_where_the_experiments_list_shows_it(experiment):
    """Issue 53 item 3: whoever opens ``mlflow ui`` without the printed address reads, in the
    experiments list's Description column (``mlflow.note.content``), what the runs are, which
    metric is which, the saved view, and the switch out of MLflow's GenAI view."""
    uri, _, eid, sweep = experiment
    tags = MlflowClient(uri).get_experiment(eid).tags
    note = tags["mlflow.note.content"]
    assert note.startswith("flatlm sweep scaling (its own base): ")  # the fixture names no scale
    assert "varying model." in note
    for key in ("pretrain/loss", "pretrain/kl", "flat/trace_fisher", "probe/<task>/acc_mean",
                "se/<key>", "'flatlm'", "model training"):
        assert key in note, key
    assert "A, B" in note  # the tasks measured
    assert tags["mlflow.experimentKind"] == "custom_model_development"


def test_the_printed_address_opens_the_runs_table_in_the_model_training_view(experiment):
    uri, workdir, eid, _ = experiment
    short, serve, address = ui_lines(uri, Path(workdir), eid, "scaling").splitlines()
    assert short == f"MLflow UI:  flatlm ui --workdir {workdir} --experiment scaling"
    assert serve.strip() == f"or: cd {workdir} && mlflow ui --backend-store-uri {uri}"
    url = urlsplit(address.split("then open ", 1)[1])
    assert (url.scheme, url.netloc, url.path) == ("http", "127.0.0.1:5000", "/")
    route, _, query = url.fragment.partition("?")
    assert route == f"/experiments/{eid}/runs"  # the runs table of this very experiment
    # the view comes from the address in 3.17 (else from local storage: GenAI on a fresh
    # browser); the saved view the driver wrote brings the metric columns
    assert parse_qs(query) == {"workflowType": ["machine_learning"],
                               "viewStateShareKey": ["flatlm"]}
    tags = MlflowClient(uri).get_experiment(eid).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    assert saved_view(uri, eid)[0]["name"] == "flatlm"


def test_a_tracking_server_is_its_own_ui(experiment):
    assert ui_lines("http://10.0.0.5:5000/", Path("/w"), "7") == (
        "MLflow UI:  http://10.0.0.5:5000/#/experiments/7/runs?workflowType=machine_learning"
        "&viewStateShareKey=flatlm")


def test_the_saved_view_shows_the_sweeps_metrics_and_folds_the_standard_errors(experiment):
    uri, _, eid, _ = experiment
    _, state = saved_view(uri, eid)
    # first the headline metrics rounded (the run tags the tracker sets: MLflow shows a metric
    # with all its digits), then what tells the runs apart, then the exact metrics
    assert state["selectedColumns"] == [
        "tags.`loss`", "tags.`KL`", "tags.`acc A`", "tags.`acc B`", "tags.`Tr F`", "tags.`Tr H`",
        "params.`model`", "params.`train.seed`",
        "metrics.`pretrain/loss`", "metrics.`pretrain/kl`",
        "metrics.`probe/A/acc_mean`", "metrics.`probe/B/acc_mean`",
        "metrics.`flat/trace_fisher`", "metrics.`n_params`"]
    # sections as MLflow names them (the metric name before its last "/"), in reading order,
    # each kept where it is: the headline ones, the other measurements' (the probes' references
    # among them), the parameter count's; the standard errors' last and folded
    sections = [s["name"] for s in state["compareRunSections"]]
    lead = ["pretrain", "probe/A", "probe/B", "flat"]
    rest = ["lookup", "lookup/A", "lookup/B", "lookup_ridge/A", "lookup_ridge/B", "probe",
            "probe_ridge/A", "probe_ridge/B", "random_init/A", "random_init/B",
            "random_init_ridge/A", "random_init_ridge/B", "Model metrics"]
    errors = ["se/" + s for s in lead + rest if s not in ("lookup", "probe", "Model metrics")]
    assert sections == lead + rest + errors
    assert [s["display"] for s in state["compareRunSections"]] == [
        not name.startswith("se/") for name in sections]
    assert state["isAccordionReordered"] is True
    # the columns in that order, the run name wide enough for a trial's name
    assert state["columnOrder"] == ["attributes.`Run Name`", *state["selectedColumns"]]
    assert state["columnWidths"]["attributes.`Run Name`"] >= 250
    assert all(s["isReordered"] for s in state["compareRunSections"])
    ids = {s["uuid"]: s["name"] for s in state["compareRunSections"]}
    charts = [(c["metricKey"], ids[c["metricSectionId"]], c["type"], c["scaleType"])
              for c in state["compareRunCharts"]]
    # the KL on a logarithmic axis: from the initial model's ~0.6 nats the runs fall to a few
    # hundredths, where a linear axis would draw them on top of each other
    assert charts == [("pretrain/loss", "pretrain", "LINE", "linear"),
                      ("pretrain/kl", "pretrain", "LINE", "log"),
                      ("probe/A/acc_mean", "probe/A", "LINE", "linear"),
                      ("probe/B/acc_mean", "probe/B", "LINE", "linear"),
                      ("flat/trace_fisher", "flat", "LINE", "linear"),
                      ("flat/trace_hessian", "flat", "LINE", "linear")]


def test_the_view_follows_the_sweep():
    """What varies and which tasks are measured come from the sweep; a grid of one value
    does not vary."""
    sweep = Sweep(name="algorithms",
                  space={"train.algorithm": {"grid_search": ["adamw", "sam"]},
                         "train.seed": [0, 1], "train.lr": {"grid_search": [1e-3]}},
                  base=apply_overrides(base_of("sweep"), {"measure.tasks": ["B"]}))
    ((key, value),) = runs_view(sweep).items()
    state = json.loads(json.loads(value)["state"])
    assert key == "mlflow.sharedViewState.flatlm"
    params = [c for c in state["selectedColumns"] if c.startswith("params.")]
    assert params == ["params.`model`", "params.`train.seed`", "params.`train.algorithm`"]
    assert "tags.`acc B`" in state["selectedColumns"]
    assert [s["name"] for s in state["compareRunSections"]][:3] == ["pretrain", "probe/B", "flat"]


def test_a_view_too_long_for_a_tag_lists_only_the_charts_sections():
    """MLflow stores experiment tag values up to 20000 characters: with many tasks the view
    keeps its columns and charts, and lists the charts' sections alone."""
    many = [f"probe/t{i}/acc_mean" for i in range(200)] + [f"probe/t{i}/acc_se" for i in range(200)]
    key, value = runs_view_tag(columns=["pretrain/kl"], charts=["pretrain/kl", "flat/trace_fisher"],
                               metrics=many, now_ms=0)
    assert len(value) <= MAX_VIEW_CHARS
    state = json.loads(json.loads(value)["state"])
    assert [s["name"] for s in state["compareRunSections"]] == ["pretrain", "flat"]
    assert [c["metricKey"] for c in state["compareRunCharts"]] == ["pretrain/kl",
                                                                  "flat/trace_fisher"]


def test_the_screenshots_sweep_command_in_the_docs_builds_its_trials():
    """docs/results.md's sweep behind the MLflow screenshots, run up to its trials' configs
    (``--print-config``: no Ray, no MLflow; the sweep itself takes ~10 minutes): the page's
    command parses, and its trials run 1000 steps with checkpoints at 0, 500 and 1000."""
    import re
    import shlex
    import subprocess
    import sys

    from tests.test_readme import ROOT, checkout_env, shell_lines

    page = (ROOT / "docs" / "results.md").read_text()
    (line,) = [x for x in shell_lines(page) if "sweeps/scaling.py" in x and "1000" in x]
    words = shlex.split(line, comments=True)
    assert words[:2] == ["python", "sweeps/scaling.py"]
    done = subprocess.run([sys.executable, *words[1:], "--print-config"], cwd=ROOT,
                          env=checkout_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = re.findall(r"^train\.steps\s+= (\S+)", done.stdout, re.M)
    checkpoints = re.findall(r"^train\.checkpoint_steps\s+= (\[[^\]]*\])", done.stdout, re.M)
    assert steps == ["1000"] * 3  # each of the three models' trials
    assert checkpoints == ["[0, 500, 1000]"] * 3
