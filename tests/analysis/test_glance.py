"""Results at a glance (issue 26): the table a sweep ends with, its reference rows and the runs it
leaves out, the conclusion in numbers against the paper, no p-value the runs cannot support, and
figures drawn as the paper draws them without warnings. Hand-built tables: no Ray, no MLflow."""

import math
import warnings
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("scipy")
pytest.importorskip("matplotlib")

from analysis.checkpoints import final_checkpoints  # noqa: E402
from analysis.conclusion import conclusion  # noqa: E402
from analysis.correlate import Bootstrap, correlation_markdown, correlation_table  # noqa: E402
from analysis.figure_marks import bulk_range  # noqa: E402
from analysis.report import write_report  # noqa: E402
from analysis.run_table import glance, left_out, render, run_table  # noqa: E402
from flatlm.experiments.paper import base_of  # noqa: E402
from sweeps import summary  # noqa: E402
from sweeps.spec import Sweep  # noqa: E402
from tests.analysis.glance_runs import (  # noqa: E402
    ACC_SE,
    SIZES,
    algorithm_runs,
    fragmented,
    scaling_runs,
    steps_runs,
)

A, B = "probe/A/acc_mean", "probe/B/acc_mean"
RULE = {"kl_threshold": 0.05}


def _correlations(df, key, **kw):
    with warnings.catch_warnings():  # few runs: the warning is the conclusion's to say
        warnings.simplefilter("ignore", UserWarning)
        return correlation_table(df, key, boot=Bootstrap(100), **RULE, **kw)


def _words(df, key):
    return conclusion(df, _correlations(df, key), key, **RULE)


# -- the per-run table ------------------------------------------------------------------------

def test_the_table_has_every_run_then_the_reference_rows():
    table = run_table(final_checkpoints(scaling_runs()), A)
    names = list(table["run"])
    assert names == [*(f"model={m}" for m, *_ in SIZES),
                     *(f"random-init model={m}" for m, *_ in SIZES),
                     "lookup table", "majority class"]
    rows = table.set_index("run")
    for model, _, kls, accs, random_a, grown in SIZES:
        assert rows.loc[f"model={model}", ["KL", "A", "grown Tr(F)"]].tolist() == [
            kls[-1], accs[-1], grown]
        assert rows.loc[f"model={model}", "A se"] == ACC_SE
        assert rows.loc[f"random-init model={model}", "A"] == random_a
    assert rows.loc["lookup table", ["KL", "A", "B"]].tolist() == [0.0, 0.97, 0.80]
    assert rows.loc["majority class", ["A", "B"]].tolist() == [0.5, 0.34]
    text = render(table)
    assert "| model=d16-h1-l1-i64 " in text and "0.9310 ± 0.0060" in text
    assert "| random-init model=d16-h1-l1-i64 " in text and "0.8930 ± 0.0070" in text
    assert "| lookup table " in text and "| majority class " in text


def test_one_random_init_row_when_every_run_shares_the_random_model():
    table = run_table(final_checkpoints(algorithm_runs()), B)
    assert list(table["run"])[-3:] == ["random-init", "lookup table", "majority class"]


def test_the_matched_table_reads_each_run_at_the_common_kl():
    text = glance(scaling_runs(), A, **RULE)
    matched = text.split("At matched loss")[1]
    assert "nearest 0.032 nats" in matched
    lines = {line.split("|")[1].strip(): line for line in matched.splitlines()
             if line.startswith("| model=")}
    # d32 at step 200 (KL 0.04, the nearest to 0.032), d64 at step 200 (KL 0.03)
    assert "| 200 " in lines["model=d32-h2-l1-i128"] and "0.0400 ± 0.0010" in lines[
        "model=d32-h2-l1-i128"]
    assert "| 200 " in lines["model=d64-h4-l2-i256"] and "0.9550 ± 0.0060" in lines[
        "model=d64-h4-l2-i256"]
    assert "| 300 " in lines["model=d16-h1-l1-i64"] and "Left out: none" in text


def test_a_sweep_with_an_excluded_run_names_it_and_the_reason():
    df = algorithm_runs()
    out = left_out(df, B, **RULE)
    assert out[["run", "run_id"]].values.tolist() == [["algorithm=adversarial", "adversarial"]]
    reason = ("no checkpoint in the saturation regime (pretrain/kl < 0.05): its smallest KL "
              "0.33 nats")
    assert out["reason"].iloc[0] == reason
    text = glance(df, B, **RULE)
    assert f"- algorithm=adversarial: {reason}" in text
    assert "their final checkpoints (the table above, less the runs left out)" in text
    words = _words(df, B)
    assert f"Left out of the regime's reading: algorithm=adversarial ({reason})" in words
    assert "algorithm=adversarial never reached the regime" in words


def test_a_sweep_with_no_run_in_the_regime_says_so_and_not_that_kl_is_missing():
    df = scaling_runs()
    text = glance(df, A, kl_threshold=1e-6)  # every run's KL is above it
    assert "At matched loss: no run reached the regime (left out below), no table." in text
    assert "no KL was measured" not in text


# -- no p-value the runs cannot support -------------------------------------------------------

def test_no_p_value_for_fewer_than_five_runs():
    few = _correlations(steps_runs(3), A)
    assert set(few["runs"]) == {3} and few["p"].isna().all()
    text = correlation_markdown(few)  # below MIN_RUNS: no table at all, one line saying why
    assert text.startswith("Correlations left out: 3 run(s)") and "\n" not in text
    assert "10 distinct resamples" in text and "| y | x |" not in text
    from analysis.selection import selection_table

    picks = selection_table(steps_runs(3), A, kl_threshold=0.05, n_boot=50)
    assert picks.attrs["runs"] == 3 and picks["p"].isna().all()
    enough = _correlations(steps_runs(6), A)
    assert set(enough["runs"]) == {6} and enough["p"].notna().all()
    assert "| p |" in correlation_markdown(enough)


# -- the conclusion in numbers ----------------------------------------------------------------

def test_the_conclusion_states_the_numbers_of_the_table():
    df = scaling_runs()
    words = _words(df, A)
    final = final_checkpoints(df).set_index("model")
    kl = final["pretrain/kl"]
    assert f"({kl.max() / kl.min():.1f}x apart" in words and "not equal loss" in words
    # matched: each run's checkpoint nearest the largest final KL (the smallest model's)
    target = kl.max()
    nearest = df.loc[(df["pretrain/kl"] - target).abs().groupby(df["run_id"]).idxmin()]
    acc = nearest.set_index("model")[A]
    small, large = SIZES[0][0], SIZES[-1][0]
    gain = acc[large] - acc[small]
    se = math.hypot(ACC_SE, ACC_SE)
    assert f"{large} minus {small} {100 * gain:+.1f} points ({gain / se:.1f} s.e.)" in words
    shown = " / ".join(f"{a:.3f}" for a in acc.loc[[m for m, *_ in SIZES]])
    assert f"A {shown} (random-init 0.893 / 0.939 / 0.940" in words
    grown = final["flat/trace_fisher_grown"]
    assert (f"Fig. 5 (a larger model is flatter, grown to one shape): here grown Tr(F) "
            f"{grown[large] - grown[small]:+.1f}") in words and "opposite to the paper" in words
    assert "Fig. 3a (a larger model probes better at the same loss): here A +2.4" in words
    assert "at the ceiling: no direction read" in words  # 6.9 points of room: < 2 x 6.9
    assert "3 run(s) in the regime, fewer than 5" in words and "Each model ran once" in words
    assert "intervals below" not in words


def test_the_conclusion_of_an_algorithms_sweep_reads_each_against_adamw():
    words = _words(algorithm_runs(), B)
    assert "algorithm adamw / noreg / sam: B" in words
    assert "sam minus adamw +1.0 points" in words and "noreg minus adamw -1.0 points" in words
    assert ("Table 1 (adversarial pre-training probes worse than AdamW): here B -33.2 points "
            "(29.3 s.e.) at the final checkpoints, where adversarial is not at the same loss "
            "(KL 0.330 vs 0.0120 nats)") in words
    assert "Table 2 (SAM is flatter than noreg): here Tr(F) -4.00" in words


def test_the_conclusion_of_a_steps_sweep_reads_the_plateau():
    words = _words(steps_runs(3), A)
    # plateau: step 300 (first KL < 0.05) to 500; A +2 points, Tr(F) -2, in every seed
    assert "step 300 to 500; mean over 3 runs" in words
    assert "A 0.901 -> 0.921 (+2.0 points" in words and "Tr(F) 20.1 -> 18.1 (-2.00" in words
    assert "Fig. 2a (after the loss converges, accuracy keeps rising): here A +2.0" in words
    # Fig. 4's claim is the paper's, made under SGD (one table: analysis.paper_claims)
    assert "Fig. 4 left (under SGD, Tr(H) falls after the loss converges): here Tr(F) " \
           "-2.00" in words


@pytest.mark.parametrize("kind", ["sizes", "algorithms", "steps"])
def test_a_sweeps_conclusion_reads_the_replications_claims_table(kind):
    """Issue 39, item 3: the claims are defined once (analysis.paper_claims.CLAIMS); a sweep's
    conclusion names each claim of its kind by that table's figure and statement, and no other."""
    from analysis.paper_claims import CLAIMS, sweep_claims

    runs = {"sizes": (scaling_runs, A), "algorithms": (algorithm_runs, B),
            "steps": (lambda: steps_runs(3), A)}[kind]
    words = _words(runs[0](), runs[1])
    read = sweep_claims(kind)
    assert read and all(c in CLAIMS for c in read)
    against = words.split("Against the paper: ")[1].split("\n\n")[0]
    named = [f"{c.where} ({c.statement}): here" for c in read]
    assert all(n in against for n in named if "lookup" not in n), (named, against)
    assert against.count("): here") <= len(read)


def test_a_steps_claim_on_a_plateau_whose_loss_still_falls_says_so():
    """The claims are about what follows convergence: the plateau's KL falls 0.040 -> 0.034 in
    every seed (the default steps sweep's case, KL 0.047 -> 0.034 from step 1500 to 3000), so
    each reading says that the loss has not converged; with the KL flat there it does not."""
    moving = _words(steps_runs(3), A)
    caveat = "but the KL itself moved -0.00600 over the same checkpoints: the loss has not"
    assert moving.count(caveat) == 2  # Fig. 2a and Fig. 4 left
    df = steps_runs(3)
    df.loc[df["step"] >= 300, "pretrain/kl"] = 0.035
    flat = _words(df, A)
    assert "here A +2.0" in flat and "the loss has not converged" not in flat


# -- the sweep's closing summary --------------------------------------------------------------

def _summary(capsys, monkeypatch, df, *, verbose=False, **fields) -> str:
    monkeypatch.setattr(summary, "load_runs", lambda uri, name: df)
    sweep = Sweep(name="s", base=base_of("sweep"), kl_threshold=0.05, **fields)
    summary.summarise(sweep, Path("/tmp/w"), "sqlite:////tmp/w/mlflow.db", verbose=verbose)
    return capsys.readouterr().out


def test_the_summary_prints_the_tables_and_the_conclusion_not_the_correlations(capsys,
                                                                              monkeypatch):
    out = _summary(capsys, monkeypatch, scaling_runs())
    assert "Per run, final checkpoint" in out and "| random-init model=d16-h1-l1-i64 " in out
    assert "| lookup table " in out and "| majority class " in out
    assert "At matched loss" in out and "Left out: none" in out
    assert "What this sweep shows (probe/A/acc_mean):" in out and "3.6x apart" in out
    # what the runs cannot conclude comes first, once, before any table (issue 42)
    assert out.count("What this sweep cannot conclude:") == 1
    assert out.index("What this sweep cannot conclude:") < out.index("Per run, final checkpoint")
    assert "Correlations with downstream" not in out and "| y | x |" not in out
    assert "p = " not in out and "\x1b" not in out
    verbose = _summary(capsys, monkeypatch, scaling_runs(), verbose=True)
    # three runs: no table of correlations, one line saying why (issue 42)
    assert "Correlations left out: 3 run(s)" in verbose and "| y | x | method |" not in verbose


def test_the_summary_of_an_algorithms_sweep_names_the_adversary_and_reads_its_task(
        capsys, monkeypatch):
    out = _summary(capsys, monkeypatch, algorithm_runs(), analysis_task="B")
    assert "What this sweep shows (probe/B/acc_mean):" in out
    assert "| algorithm=sam " in out and "| algorithm=adversarial " in out
    assert "- algorithm=adversarial: no checkpoint in the saturation regime" in out


def test_an_algorithms_sweep_is_judged_on_the_task_its_adversary_attacks():
    from argparse import Namespace

    from sweeps import algorithms
    from sweeps.spec import sweep_task

    assert sweep_task(algorithms.build(Namespace(algorithms="adamw,sam"))) == "B"


# -- figures ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("runs", "key", "figures"), [
    (scaling_runs, A, {"fig1_accuracy_scatter.png", "fig2_over_steps.png", "fig3_over_size.png"}),
    (algorithm_runs, B, {"fig1_accuracy_scatter.png", "fig2_over_steps.png"}),
    (steps_runs, A, {"fig1_accuracy_scatter.png", "fig2_over_steps.png"})],
    ids=["scaling", "algorithms", "steps"])
def test_the_report_writes_its_figures_without_warnings(tmp_path, runs, key, figures):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paths, _ = write_report(fragmented(runs()), tmp_path, key, boot=Bootstrap(50), **RULE)
    assert [str(w.message)[:80] for w in caught] == []
    assert {p.name for p in paths if p.name.startswith("fig")} == figures
    text = (tmp_path / "conclusion.md").read_text()
    assert "| majority class " in text and "Against the paper" in text


def test_a_one_size_sweep_writes_no_over_size_figure(tmp_path):
    paths, _ = write_report(algorithm_runs(), tmp_path, B, boot=Bootstrap(50), **RULE)
    assert "fig3_over_size.png" not in {p.name for p in paths}
    assert not (tmp_path / "fig3_over_size.png").exists()


def _drawn(monkeypatch) -> list:
    import analysis.figures as figures

    drawn, save = [], figures.save_figure
    monkeypatch.setattr(figures, "save_figure",
                        lambda fig, *a, **k: drawn.append(fig) or save(fig, *a, **k))
    return drawn


def test_fig1_names_the_models_puts_kl_on_the_loss_axis_and_draws_the_references(
        tmp_path, monkeypatch):
    from analysis.figures import accuracy_scatter

    drawn = _drawn(monkeypatch)
    accuracy_scatter(scaling_runs(), A, tmp_path / "f1.png")
    (fig,) = drawn
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert [m for m, *_ in SIZES] == [t for t in legend if t.startswith("d")]
    # one random-init entry per colour, each named by its model
    assert {"lookup table", *(f"random-init {m}" for m, *_ in SIZES)} <= set(legend)
    assert fig.axes[0].get_xlabel() == "KL to the truth (nats/token)"
    notes = [t.get_text() for t in fig.axes[0].texts]
    assert "majority class 0.500 (below the axis)" in notes  # far below: a note, no squash


def test_an_outlier_is_marked_at_the_edge_not_stretching_the_axis(tmp_path, monkeypatch):
    from analysis.figures import accuracy_scatter

    drawn = _drawn(monkeypatch)
    df = algorithm_runs()
    accuracy_scatter(df, B, tmp_path / "f1.png")
    ax = drawn[0].axes[0]
    low, high = ax.get_ylim()
    adversarial = df[df["algorithm"] == "adversarial"][B]
    assert adversarial.max() < low < df[df["algorithm"] != "adversarial"][B].min()
    assert high - low < 0.1  # the others' spread, not 0.4
    marks = [t.get_text() for t in ax.texts if t.get_text().startswith("adversarial")]
    assert marks == [f"adversarial {adversarial.min():.3g}-{adversarial.max():.3g}"]


def test_bulk_range_keeps_clusters_and_drops_a_lone_point():
    assert bulk_range([0.93, 0.94, 0.95, 0.63]) == (0.93, 0.95)
    assert bulk_range([0.5, 0.51, 0.9, 0.91]) == (0.5, 0.91)  # two clusters: both kept
    assert bulk_range([1.0, 10.0, 100.0], log=True) == pytest.approx((1.0, 100.0))
    assert bulk_range([1.0, 2.0, 1000.0], log=True) == pytest.approx((1.0, 2.0))
    assert bulk_range([]) is None
    assert bulk_range(pd.Series([0.3, None, 0.4])) == (0.3, 0.4)


def test_runs_that_differ_by_seed_only_are_also_shown_as_their_mean():
    one = algorithm_runs()
    two = one.assign(run_id=one["run_id"] + "-1", **{"train.seed": 1,
                                                    B: one[B] + 0.01})
    text = glance(pd.concat([one, two], ignore_index=True), B, **RULE)
    over = text.split("Over seeds, at matched loss")[1]
    line = next(ln for ln in over.splitlines() if ln.startswith("| algorithm=adamw (2 runs)"))
    b = [0.93 - 0.2 - 0.012 / 10, 0.93 - 0.2 - 0.012 / 10 + 0.01]
    mean, se = sum(b) / 2, abs(b[1] - b[0]) / 2  # std / sqrt(2) of two values
    assert f"{mean:.4f} ± {se:.4f}" in line
    assert "algorithm=adversarial (2 runs)" not in over  # left out: never in the regime


def test_the_summary_draws_no_bootstrap_it_would_not_show(capsys, monkeypatch):
    """Below five runs in the regime neither the conclusion nor --verbose shows an interval: the
    summary asks for no resample; with six it asks for the report's 1000."""
    asked = []
    real = summary.correlation_table
    monkeypatch.setattr(summary, "correlation_table",
                        lambda *a, boot, **kw: asked.append(boot.n) or real(*a, boot=boot, **kw))
    few = _summary(capsys, monkeypatch, scaling_runs(), verbose=True)
    assert asked == [0] and "Correlations left out: 3 run(s)" in few
    six = pd.concat([scaling_runs().assign(run_id=lambda d, i=i: d["run_id"] + f"-{i}",
                                           trial=lambda d, i=i: d["trial"] + f"-{i}")
                     for i in range(2)], ignore_index=True)
    _summary(capsys, monkeypatch, six)
    assert asked == [0, 1000]
