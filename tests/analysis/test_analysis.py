"""analysis/: MLflow -> tidy table, saturation rules, correlations, figures and the report CLI.

A synthetic store (12 runs x 4 checkpoints) is built so that in the saturation regime (the two
late checkpoints, KL < 0.01) accuracy has Pearson correlation exactly -RHO with the Fisher trace
and exactly 0 with the loss, while the early checkpoints tie accuracy to the loss.
"""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("mlflow")
pytest.importorskip("scipy")

REPO = Path(__file__).resolve().parents[2]

from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import Metric, Param  # noqa: E402
from scipy import stats  # noqa: E402

from analysis.correlate import (  # noqa: E402
    TABLE_COLUMNS,
    Bootstrap,
    correlation_markdown,
    correlation_table,
    partial_corr,
    saturated,
)
from analysis.figures import (  # noqa: E402
    accuracy_scatter,
    metrics_over_size,
    metrics_over_steps,
)
from analysis.runs import load_runs, parse_metrics_jsonl  # noqa: E402
from analysis.tables import summary_markdown, summary_table  # noqa: E402
from flatlm.measure import ENTROPY, KL, LOSS, TRACE_FISHER, TRACE_HESSIAN  # noqa: E402
from flatlm.tracking.tracker import default_tracking_uri, ensure_experiment  # noqa: E402
from tests.inprocess import run_main  # noqa: E402

RHO = 0.7
ACC = "probe/A/acc_mean"
H_RAW = -RHO * 12 / math.sqrt(12**2 + 2**2)  # corr(acc, trace_hessian) before the partial
STEPS = (100, 200, 300, 400)
ALGORITHMS = ("adamw", "sam", "sgd")
MODELS = (("tiny", 10_000), ("small", 40_000))
LEGACY = 2  # runs 0-1 carry n_params as a tag (as flatlm logged it before), the rest a metric
EXPERIMENT = "synth"
WITH_ARTIFACT = 8  # runs 0-7 also carry metrics.jsonl; 8-11 only metric histories


def _orthonormal(n: int, k: int, seed: int) -> np.ndarray:
    """k columns of length n: mean 0, sample std 1, mutually uncorrelated (exactly)."""
    a = np.random.default_rng(seed).normal(size=(n, k))
    a = np.column_stack([np.ones(n), a])
    q, _ = np.linalg.qr(a)
    return q[:, 1:] * math.sqrt(n - 1)


def synthetic_rows() -> list[dict]:
    """48 rows (12 runs x 4 steps) of params, tags and metrics; see the module docstring."""
    f0, e, k = _orthonormal(24, 3, seed=0).T  # saturated rows: 12 runs x steps 300, 400
    early_kl = np.random.default_rng(1).uniform(0.2, 0.8, size=24)
    early_f = np.random.default_rng(2).uniform(50, 150, size=24)
    rows, i = [], 0
    for model, n_params in MODELS:
        for algorithm in ALGORITHMS:
            for seed in (0, 1):
                run = {"trial": f"{algorithm}-{model}-s{seed}", "algorithm": algorithm,
                       "model": model, "preset": "tiny", "n_params": n_params, "sweep": "synth",
                       "params": {"model": model,
                                  "train.lr": "0.0003" if algorithm != "sgd" else "0.1",
                                  "seed": str(seed), "train.sam_rho":
                                  "0.05" if algorithm == "sam" else "None",
                                  "train.warmup": "True"}}
                for j, step in enumerate(STEPS):
                    late = j >= 2
                    r = 2 * (i % 12) + (j - 2 if late else j)
                    kl = 0.005 + 0.0015 * k[r] if late else early_kl[r]
                    acc = (0.8 + 0.05 * (-RHO * f0[r] + math.sqrt(1 - RHO**2) * e[r]) if late
                           else 0.5 - 0.3 * kl)
                    metrics = {ENTROPY: 2.0, KL: kl, LOSS: 2.0 + kl, ACC: acc,
                               "probe/A/acc_std": 0.01,
                               TRACE_FISHER: 100 + 10 * f0[r] if late else early_f[r],
                               TRACE_HESSIAN: (120 + 12 * f0[r] + 2 * k[r]) if late
                               else 1.2 * early_f[r]}
                    rows.append({**run, "step": step, "metrics": metrics})
                i += 1
    return rows


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """(tracking_uri, rows): the synthetic experiment in a sqlite store."""
    root = tmp_path_factory.mktemp("analysis_store")
    uri = default_tracking_uri(root)
    eid = ensure_experiment(uri, EXPERIMENT)
    client = MlflowClient(uri)
    rows = synthetic_rows()
    by_trial: dict[str, list[dict]] = {}
    for row in rows:
        by_trial.setdefault(row["trial"], []).append(row)
    for n, (trial, trial_rows) in enumerate(by_trial.items()):
        first = trial_rows[0]
        tags = {t: str(first[t]) for t in ("algorithm", "model", "preset", "sweep")}
        n_params = {"n_params": float(first["n_params"])}
        if n < LEGACY:
            tags["n_params"], n_params = str(first["n_params"]), {}
        run_id = client.create_run(eid, tags=tags, run_name=trial).info.run_id
        client.log_batch(run_id, params=[Param(k, v) for k, v in first["params"].items()])
        for row in trial_rows:
            row["metrics"] = {**n_params, **row["metrics"]}
            client.log_batch(run_id, metrics=[Metric(k, v, 0, row["step"])
                                              for k, v in row["metrics"].items()])
            client.log_batch(run_id, metrics=[Metric("train/loss", 3.0, 0, row["step"] - 50)])
        if n < WITH_ARTIFACT:
            path = root / f"m{n}" / "metrics.jsonl"
            path.parent.mkdir()
            path.write_text("".join(json.dumps({"step": r["step"], **r["metrics"]}) + "\n"
                                    for r in trial_rows))
            client.log_artifact(run_id, str(path))
        client.set_terminated(run_id, "FINISHED")
    return uri, rows


@pytest.fixture(scope="module")
def runs(store):
    return load_runs(store[0], EXPERIMENT)


# -- runs.py ----------------------------------------------------------------------------------

def test_load_runs_is_tidy_and_casts_params(runs):
    assert len(runs) == 48 and runs["run_id"].nunique() == 12
    # the README's names: the sweeps' preset tag ("tiny", as this store has it) read as the
    # scale and protocol it names
    assert list(runs.columns[:7]) == ["run_id", "trial", "status", "sweep", "scale", "protocol",
                                      "algorithm"]
    # the training curve (train/*, between checkpoints) adds no rows
    assert all(tuple(s) == STEPS for s in runs.groupby("run_id")["step"].apply(list))
    assert runs["n_params"].dtype == "float64" and set(runs["n_params"]) == {10_000, 40_000}
    assert runs["model"].notna().all() and "preset" not in runs
    assert runs["scale"].eq("sweep").all() and runs["protocol"].eq("paper").all()
    assert runs["train.lr"].dtype == "float64" and set(runs["train.lr"]) == {3e-4, 0.1}
    assert runs["seed"].dtype == "Int64"
    assert runs["train.warmup"].eq(True).all()
    sam = runs["algorithm"] == "sam"
    assert runs.loc[sam, "train.sam_rho"].eq(0.05).all()
    assert runs.loc[~sam, "train.sam_rho"].isna().all()  # "None" is missing, not a string
    assert set(runs.attrs["metrics"]) == {ENTROPY, KL, LOSS, ACC, "probe/A/acc_std",
                                          TRACE_FISHER, TRACE_HESSIAN, "n_params"}
    assert runs["status"].eq("FINISHED").all()


def test_artifact_and_history_sources_agree(store, runs):
    uri, rows = store
    from_history = load_runs(uri, EXPERIMENT, source="history")
    pd.testing.assert_frame_equal(runs, from_history, check_like=True)
    assert load_runs(uri, EXPERIMENT, source="artifact")["run_id"].nunique() == WITH_ARTIFACT
    expected = sorted((r["trial"], r["step"], r["metrics"][ACC]) for r in rows)
    assert sorted(zip(runs["trial"], runs["step"], runs[ACC], strict=True)) == expected


def test_parse_metrics_jsonl_last_row_of_a_step_wins():
    """The trial's own rule (flatlm.storage.metrics_log): a step measured again keeps its last
    row."""
    text = ('{"step": 1, "a": 1.0, "name": "x"}\n{"step": 2, "a": 2.0, "c": 1}\n'
            '{"step": 2, "a": 9.0, "b": 3}\n{"step": 3, "a"')
    assert parse_metrics_jsonl(text) == {1: {"a": 1.0}, 2: {"a": 9.0, "b": 3.0}}


# -- correlate.py -----------------------------------------------------------------------------

def test_saturation_rules_select_the_late_checkpoints(runs):
    by_kl = saturated(runs, kl_threshold=0.01)
    by_loss = saturated(runs, loss_tolerance=0.01)
    assert by_kl.sum() == 24 and runs.loc[by_kl, "step"].isin([300, 400]).all()
    assert by_kl.equals(by_loss)
    assert saturated(runs).all()
    with pytest.raises(ValueError):
        saturated(runs, kl_threshold=0.01, loss_tolerance=0.01)


def _row(table, x, method):
    (row,) = table[(table["x"] == x) & (table["method"] == method)].itertuples()
    return row


def test_recovers_the_known_correlations(runs):
    table = correlation_table(runs, ACC, kl_threshold=0.01, boot=Bootstrap(400, seed=0))
    assert set(table["n"]) == {24} and set(table["runs"]) == {12}
    assert len(table) == 3 * 3 + 2 * 2  # 3 methods per x; partials for the two flatness keys
    fisher = _row(table, TRACE_FISHER, "pearson")
    assert fisher.r == pytest.approx(-RHO, abs=1e-9)
    assert fisher.ci_low < -RHO < fisher.ci_high < 0 and fisher.p < 0.01  # >= 2/401 by design
    for method in ("spearman", "kendall"):
        row = _row(table, TRACE_FISHER, method)
        assert row.r < 0 and row.ci_low < row.r < row.ci_high < 0
    loss = _row(table, LOSS, "pearson")
    assert loss.r == pytest.approx(0, abs=1e-9) and loss.ci_low < 0 < loss.ci_high
    hessian = _row(table, TRACE_HESSIAN, "pearson")
    assert hessian.r == pytest.approx(H_RAW, abs=1e-9)
    # Controlling for the loss removes the loss-driven part of trace_hessian: back to -RHO.
    assert _row(table, TRACE_HESSIAN, "partial_pearson").r == pytest.approx(-RHO, abs=1e-9)
    assert _row(table, TRACE_FISHER, "partial_pearson").r == pytest.approx(-RHO, abs=1e-9)
    part = _row(table, TRACE_FISHER, "partial_spearman")
    assert part.ci_low < part.r < part.ci_high < 0
    md = correlation_markdown(table)
    assert "pretrain/kl < 0.01" in md and "| y | x | method |" in md


def test_outside_the_regime_the_loss_dominates(runs):
    """A rule admitting every checkpoint lets the early ones (accuracy tied to the loss) swamp
    the result, which is why a rule is required."""
    with pytest.raises(ValueError, match="needs a saturation rule"):
        correlation_table(runs, ACC, boot=Bootstrap(100))
    table = correlation_table(runs, ACC, kl_threshold=math.inf, boot=Bootstrap(100))
    assert _row(table, LOSS, "pearson").r < -0.9


def test_empty_regime_gives_an_empty_table_and_the_reason(runs):
    with pytest.warns(UserWarning, match=r"no checkpoint satisfies .*pretrain/kl < 1e-06 "
                                         r"\(smallest pretrain/kl seen: 0.00[0-9]+"):
        table = correlation_table(runs, ACC, kl_threshold=1e-6, boot=Bootstrap(10))
    assert table.empty and list(table.columns) == list(TABLE_COLUMNS)
    smallest = f"{runs[KL].min():.3g}"
    assert smallest in table.attrs["note"] and smallest in correlation_markdown(table)


def test_few_runs_warn(runs):
    few = runs[runs["run_id"].isin(runs["run_id"].unique()[:3])]
    with pytest.warns(UserWarning, match=r"only 3 run\(s\) in the regime"):
        table = correlation_table(few, ACC, kl_threshold=0.01, boot=Bootstrap(50))
    assert set(table["runs"]) == {3} and set(table["n"]) == {6}
    with pytest.raises(ValueError, match="no 'run_id' column"):
        correlation_table(runs.drop(columns="run_id"), ACC, kl_threshold=0.01)


def test_bootstrap_resamples_runs_not_checkpoints(runs):
    """Repeating every checkpoint of a run 5 times adds no information: with runs resampled,
    Pearson's r, p and interval are exactly those of the table without the copies. (A row
    bootstrap would shrink the interval by about sqrt(5).)"""
    regime = runs[saturated(runs, kl_threshold=0.01)]
    copies = pd.concat([regime] * 5, ignore_index=True)
    one, five = (correlation_table(d, ACC, kl_threshold=0.01, boot=Bootstrap(300, seed=1),
                                   x_keys=(TRACE_FISHER,)) for d in (regime, copies))
    a, b = _row(one, TRACE_FISHER, "pearson"), _row(five, TRACE_FISHER, "pearson")
    assert b.n == 5 * a.n and a.runs == b.runs == 12
    assert (a.r, a.p, a.ci_low, a.ci_high) == pytest.approx((b.r, b.p, b.ci_low, b.ci_high),
                                                            abs=1e-12)


def test_bootstrap_is_seeded(runs):
    a = correlation_table(runs, ACC, kl_threshold=0.01, boot=Bootstrap(200, seed=3))
    b = correlation_table(runs, ACC, kl_threshold=0.01, boot=Bootstrap(200, seed=3))
    c = correlation_table(runs, ACC, kl_threshold=0.01, boot=Bootstrap(200, seed=4))
    pd.testing.assert_frame_equal(a, b)
    assert not np.allclose(a["ci_low"], c["ci_low"])


@pytest.mark.parametrize("method", ["pearson", "spearman"])
def test_partial_corr_matches_the_textbook_formula(method):
    rng = np.random.default_rng(7)
    z = rng.normal(size=40)
    x = z + rng.normal(size=40)
    y = -0.5 * z + 0.3 * x + rng.normal(size=40)
    corr = stats.pearsonr if method == "pearson" else stats.spearmanr
    rxy, rxz, ryz = (corr(a, b).statistic for a, b in ((x, y), (x, z), (y, z)))
    expected = (rxy - rxz * ryz) / math.sqrt((1 - rxz**2) * (1 - ryz**2))
    assert partial_corr(x, y, z, method=method)[0] == pytest.approx(expected, abs=1e-12)


def test_partial_corr_removes_a_confounder():
    z, u, v = _orthonormal(30, 3, seed=5).T
    x, y = z + 0.1 * u, -z + 0.1 * v  # both driven by z only
    assert stats.pearsonr(x, y).statistic < -0.95
    r, p = partial_corr(x, y, z)
    assert r == pytest.approx(0, abs=1e-9) and p > 0.9


# -- figures.py -------------------------------------------------------------------------------

def _assert_png(path: Path):
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def _drawn(monkeypatch) -> list:
    """The figures the figure functions save, kept for inspection."""
    import analysis.figures as figures

    drawn, save = [], figures.save_figure
    monkeypatch.setattr(figures, "save_figure",
                        lambda fig, *a, **k: drawn.append(fig) or save(fig, *a, **k))
    return drawn


def test_over_steps_names_every_run_in_its_legend_with_error_bars(runs, tmp_path, monkeypatch):
    drawn = _drawn(monkeypatch)
    with_se = runs.assign(**{"probe/A/acc_se": 0.02})
    metrics_over_steps(with_se, tmp_path / "f2.png", keys=(LOSS, ACC), title="Fig. 2: x")
    (fig,) = drawn
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(texts) == len(set(texts)) == runs["run_id"].nunique() == 12
    # named by what varies between the runs: model, learning rate, seed
    assert all("model=" in t and "seed=" in t for t in texts)
    acc_panel = fig.axes[1]
    bars = [c for c in acc_panel.containers if c.has_yerr]
    assert len(bars) == 12  # every run's accuracy carries its standard error
    assert fig._suptitle.get_text().startswith("Fig. 2")


def test_figures_are_valid_pngs(runs, tmp_path):
    regime = saturated(runs, kl_threshold=0.01)
    paths = [
        accuracy_scatter(runs, ACC, tmp_path / "f1.png", regime=regime),
        metrics_over_steps(runs, tmp_path / "f2.png", keys=(LOSS, KL, TRACE_FISHER, ACC)),
        metrics_over_size(runs, tmp_path / "f3.png", keys=(ACC, LOSS), color_by="algorithm"),
        accuracy_scatter(runs.iloc[:0], ACC, tmp_path / "empty.png"),  # "no data", no crash
    ]
    for path in paths:
        _assert_png(path)


def test_summary_tables(runs):
    table = summary_table(runs, ACC, by=("algorithm",))
    assert list(table["algorithm"]) == list(ALGORITHMS) and table["runs"].eq(4).all()
    final = runs[runs["step"] == 400]
    sam = final[final["algorithm"] == "sam"][ACC]
    row = table[table["algorithm"] == "sam"].iloc[0]
    assert row[f"{ACC} mean"] == pytest.approx(sam.mean())
    assert row[f"{ACC} std"] == pytest.approx(sam.std())
    md = summary_markdown(summary_table(runs, ACC, by=("model", "algorithm")))
    assert md.count("\n") == 1 + 6 and " ± " in md and "| model | algorithm | runs |" in md


# -- report.py --------------------------------------------------------------------------------

def report(*args, cwd=REPO):
    """``python analysis/report.py ARGS`` from ``cwd``, its ``main`` in this process."""
    from analysis.report import main

    return run_main(main, list(args), cwd=cwd)


def test_report_cli_writes_outputs_and_logs_one_report_run(store, tmp_path):
    uri, _ = store
    out = tmp_path / "report"
    args = ["--experiment", EXPERIMENT, "--out", out, "--tracking-uri", uri, "--task", "A",
            "--kl-threshold", "0.01", "--n-boot", "200"]
    assert report(*args).returncode == 0  # a first report, replaced by the second
    res = report(*args)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "| y | x | method |" in res.stdout and "Warning" not in res.stderr
    assert ("24 checkpoints of 12 runs in the saturation regime" in res.stdout
            and "flatter checkpoints probe better at equal loss" in res.stdout), res.stdout
    expected = {"fig1_accuracy_scatter.png", "fig2_over_steps.png", "fig3_over_size.png",
                "correlations.md", "correlations.csv", "table1_by_algorithm.md",
                "table1_by_algorithm.csv", "table2_by_model.md", "table2_by_model.csv",
                "conclusion.md", "runs.csv", "selection.md", "selection.csv", "selection.png"}
    assert {p.name for p in out.iterdir()} == expected
    for name in expected:
        if name.endswith(".png"):
            _assert_png(out / name)
    csv = pd.read_csv(out / "correlations.csv")
    fisher = csv[(csv["x"] == TRACE_FISHER) & (csv["method"] == "pearson")].iloc[0]
    assert fisher["r"] == pytest.approx(-RHO, abs=1e-9)

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)  # the sweep's charts list its trials only
    assert client.search_runs([exp.experiment_id], "tags.`flatlm.report` = '1'") == []
    beside = client.get_experiment_by_name(f"{EXPERIMENT}.report")
    reports = [r for r in client.search_runs([beside.experiment_id])
               if r.info.run_name == "report"]  # the second report replaced the first
    assert len(reports) == 1
    assert reports[0].info.status == "FINISHED"
    logged = {f.path for f in client.list_artifacts(reports[0].info.run_id)}
    assert logged == expected
    assert load_runs(uri, EXPERIMENT)["run_id"].nunique() == 12  # the report run is skipped


def test_report_with_no_checkpoint_in_the_regime_says_so_without_warnings(store, tmp_path):
    res = report("--experiment", EXPERIMENT, "--out", tmp_path, "--tracking-uri", store[0],
                 "--kl-threshold", "1e-4", "--n-boot", "50", "--no-log")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Warning" not in res.stderr and "| y | x |" not in res.stdout  # no empty table
    assert "0 checkpoints of 0 runs in the saturation regime" in res.stdout
    assert "No checkpoint reached it (smallest KL seen 0.00224 nats" in res.stdout


def test_report_names_a_misspelled_experiment_and_creates_no_store(store, tmp_path):
    res = report("--experiment", "snyth", "--out", tmp_path / "r", "--tracking-uri", store[0],
                 "--kl-threshold", "0.01")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "no experiment 'snyth'" in res.stderr and "did you mean synth?" in res.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    res = report("--experiment", EXPERIMENT, "--out", tmp_path / "r", "--kl-threshold", "0.01",
                 cwd=empty)
    assert res.returncode == 1 and "no MLflow store at sqlite:///" in res.stderr
    assert list(empty.iterdir()) == []  # no mlflow.db left behind


def test_conclusion_counts_runs_not_checkpoints(runs):
    from analysis.conclusion import conclusion

    few = runs[runs["run_id"].isin(runs["run_id"].unique()[:3])]
    with pytest.warns(UserWarning):
        table = correlation_table(few, ACC, kl_threshold=0.01, boot=Bootstrap(50))
    words = conclusion(few, table, ACC, kl_threshold=0.01)
    assert "6 checkpoints of 3 runs" in words and "fewer than 5" in words
    assert "flatter" not in words  # nothing read off three runs


def test_report_cli_requires_a_rule():
    res = report("--help")
    assert res.returncode == 0 and "--kl-threshold" in res.stdout
    res = report("--experiment", "x", "--out", "y")
    assert res.returncode == 2 and "--kl-threshold" in res.stderr


def test_select_cli_through_mlflow_equals_the_table_and_logs_beside_the_report(store, runs,
                                                                            tmp_path):
    from analysis.selection import main, selection_table

    uri, _ = store
    args = ["--experiment", EXPERIMENT, "--out", str(tmp_path), "--tracking-uri", uri,
            "--task", "A", "--kl-threshold", "0.01", "--n-boot", "100", "--seed", "4"]
    assert main(args) == 0 and main(args) == 0  # the second replaces the first's run
    csv = pd.read_csv(tmp_path / "selection.csv")
    direct = selection_table(runs, ACC, kl_threshold=0.01, n_boot=100, seed=4)
    pd.testing.assert_frame_equal(csv, direct.reset_index(drop=True), check_dtype=False,
                                  rtol=1e-12)
    assert set(csv.selector) == {TRACE_FISHER, TRACE_HESSIAN, LOSS, "random choice"}
    client = MlflowClient(uri)
    beside = client.get_experiment_by_name(f"{EXPERIMENT}.report")
    picked = [r for r in client.search_runs([beside.experiment_id])
              if r.info.run_name == "selection"]
    assert len(picked) == 1
    logged = {f.path for f in client.list_artifacts(picked[0].info.run_id)}
    assert logged == {"selection.md", "selection.csv", "selection.png"}
