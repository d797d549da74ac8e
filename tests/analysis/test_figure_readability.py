"""Figures ready for a slide (issue 42, item 7), checked on the drawn figures of the README's main
job (``readme_runs``: 3 models, steps 0 / 1000 / 2000): tick labels that do not print over each
other, plain names with units on the axes, fig. 1's axes on the saturated window, legends whose
colours are the plotted ones, and a palette whose neighbouring colours differ in hue."""

import colorsys

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("matplotlib")

from matplotlib.colors import to_rgb  # noqa: E402

import analysis.figures as figures  # noqa: E402
from analysis.correlate import saturated  # noqa: E402
from analysis.labels import overlapping  # noqa: E402
from analysis.replication_figures import over_sizes  # noqa: E402
from flatlm.measure import KL, TRACE_FISHER, TRACE_FISHER_GROWN  # noqa: E402
from tests.analysis.glance_runs import README_SIZES, readme_runs  # noqa: E402

A = "probe/A/acc_mean"
SIZE_KEYS = (A, KL, TRACE_FISHER, TRACE_FISHER_GROWN)


@pytest.fixture
def drawn(monkeypatch) -> list:
    """The figures ``analysis.figures.save_figure`` saves, kept for inspection."""
    kept, save = [], figures.save_figure
    monkeypatch.setattr(figures, "save_figure",
                        lambda fig, *a, **k: kept.append(fig) or save(fig, *a, **k))
    return kept


def _shown_ticks(ax) -> list[str]:
    return [t.get_text() for t in ax.get_xticklabels(which="both")
            if t.get_visible() and t.get_text()]


def _no_tick_overlaps(fig) -> None:
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        assert not overlapping(ax.get_xticklabels(which="both"), renderer), _shown_ticks(ax)


def _tangled_in_matplotlibs_default(fig) -> bool:
    """The check can fail: the same axis with matplotlib's own log ticks overlaps."""
    ax = fig.axes[1]
    ax.set_xscale("log")  # a fresh locator and formatters
    ax.set_xlim(ax.get_xlim())
    fig.draw_without_rendering()
    return overlapping(ax.get_xticklabels(which="both"), fig.canvas.get_renderer())


def test_parameter_counts_are_ticked_as_114k_and_do_not_overlap(tmp_path, drawn):
    figures.metrics_over_size(readme_runs(), tmp_path / "f3.png", keys=SIZE_KEYS)
    (fig,) = drawn
    _no_tick_overlaps(fig)
    for ax in fig.axes:  # each size's count, and under it what sets its model apart
        assert _shown_ticks(ax) == ["114k\nl2", "164k\nl3", "214k\nl4"]
        assert ax.get_xlabel() == "parameters (models d64-h4-*-i256)"
    assert _tangled_in_matplotlibs_default(fig)


def test_the_room_sizes_figure_ticks_twin_sizes_once(tmp_path, monkeypatch):
    """The replication's sizes figure: a pre-LN twin (213480 beside 213352) shares a tick."""
    import analysis.replication_figures as rf

    kept, save = [], rf.save_figure
    monkeypatch.setattr(rf, "save_figure", lambda fig, *a, **k: kept.append(fig) or save(
        fig, *a, **k))
    rows = [{"run_id": f"{protocol}/{model}/{seed}", "experiment": "sizes",
             "protocol": protocol, "model": model, "step": 100, KL: 0.01 + seed / 1000,
             A: 0.9 + seed / 100}
            for protocol, models in (("paper", ("d64-h4-l2-i256", "d64-h4-l3-i256",
                                                "d64-h4-l4-i256")),
                                     ("paper-code", ("d64-h4-l2-i256-pre", "d64-h4-l4-i256-pre")))
            for model in models for seed in range(2)]
    over_sizes(pd.DataFrame(rows), tmp_path / "sizes.png")
    (fig,) = kept
    _no_tick_overlaps(fig)
    assert _shown_ticks(fig.axes[0]) == ["113k", "163k", "213k"]


def test_axes_name_what_they_show_with_units(tmp_path, drawn):
    df = readme_runs()
    figures.accuracy_scatter(df, A, tmp_path / "f1.png", regime=saturated(df, kl_threshold=0.05))
    figures.metrics_over_steps(df, tmp_path / "f2.png", keys=(KL, TRACE_FISHER, A), acc_key=A)
    figures.metrics_over_size(df, tmp_path / "f3.png", keys=SIZE_KEYS)
    labels = [label for fig in drawn for ax in fig.axes
              for label in (ax.get_xlabel(), ax.get_ylabel()) if label]
    assert "KL to the truth (nats/token)" in labels
    assert "task A probe accuracy (%)" in labels
    assert {"parameters (models d64-h4-*-i256)", "training step",
            "Tr(F), Fisher trace"} <= set(labels)
    assert not [label for label in labels if label in df.columns or label == "step"]
    percent = [ax for fig in drawn for ax in fig.axes if ax.get_ylabel().endswith("(%)")]
    fig = percent[0].figure
    fig.draw_without_rendering()
    ticks = [t.get_text() for t in percent[0].get_yticklabels() if t.get_text()]
    assert all(float(t) > 1 for t in ticks), ticks  # 98.5, not 0.985


def test_fig1_frames_the_saturated_window_and_step_0_does_not_set_the_range(tmp_path, drawn):
    df = readme_runs()
    regime = saturated(df, kl_threshold=0.05)
    figures.accuracy_scatter(df, A, tmp_path / "f1.png", regime=regime)
    (fig,) = drawn
    main = fig.axes[0]
    low, high = main.get_ylim()
    step0 = df.loc[df["step"] == 0, A]
    assert step0.max() < low  # the step-0 points (0.66-0.70) are below the window
    assert high - low < 0.05  # the window: 0.985-0.995 with its error bars and the lookup
    assert main.get_xlim()[1] < df.loc[df["step"] == 1000, KL].min()
    # the row below shows every checkpoint, and frames the window
    overview = fig.axes[len(fig.axes) // 2]
    assert overview.get_ylim()[0] < step0.min()
    (frame,) = overview.patches
    assert frame.get_height() == pytest.approx(high - low)


def test_legend_entries_have_the_colours_of_what_they_name(tmp_path, drawn):
    df = readme_runs()
    figures.accuracy_scatter(df, A, tmp_path / "f1.png")
    (fig,) = drawn
    ax = fig.axes[0]
    legend = ax.get_legend()
    entries = dict(zip([t.get_text() for t in legend.get_texts()], legend.legend_handles,
                       strict=True))
    point_colours = {c.get_label(): to_rgb(c.lines[0].get_color()) for c in ax.containers
                     if not c.get_label().startswith("_")}
    for model, *_ in README_SIZES:
        colour = point_colours[model]
        assert to_rgb(entries[model].get_color()) == colour
        # each model's random-init level has an entry of its own, in the model's colour
        assert to_rgb(entries[f"random-init {model}"].get_color()) == colour
    levels = {to_rgb(line.get_color()) for line in ax.get_lines()
              if line.get_label().startswith("random-init")}
    named = {to_rgb(entries[t].get_color()) for t in entries if t.startswith("random-init")}
    assert levels == named and len(named) == len(README_SIZES)


@pytest.mark.parametrize("draw", ["fig1", "fig3"])
def test_a_level_beyond_the_axis_is_noted_under_the_plot_not_on_a_point(tmp_path, drawn, draw):
    """The majority class (0.30) and the random-init models (fig. 1) lie below the accuracy
    axis: their notes sit under the x axis's label, outside the axes, stacked without
    overlapping (inside the axes one sat on fig. 3's random-init point)."""
    df = readme_runs()
    if draw == "fig1":
        figures.accuracy_scatter(df, A, tmp_path / "f.png", regime=saturated(df,
                                                                             kl_threshold=0.05))
    else:
        figures.metrics_over_size(df, tmp_path / "f.png", keys=SIZE_KEYS)
    (fig,) = drawn
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    noted = [ax for ax in fig.axes if any("(below the axis)" in t.get_text() for t in ax.texts)]
    assert noted  # the check can fail: the levels are below these axes
    for ax in noted:
        notes = [t for t in ax.texts if "(below the axis)" in t.get_text()]
        label = ax.xaxis.label.get_window_extent(renderer)
        boxes = [t.get_window_extent(renderer) for t in notes]
        assert all(b.y1 <= label.y0 for b in boxes), [t.get_text() for t in notes]
        assert not overlapping(notes, renderer)
    assert "majority class 0.300 (below the axis)" in [t.get_text() for t in noted[0].texts]


def test_a_sweep_of_twelve_runs_gets_ten_distinct_hues_first():
    colours = figures.palette(pd.Series([f"run{i:02d}" for i in range(12)]))
    hues = [colorsys.rgb_to_hsv(*to_rgb(c))[0] for c in list(colours.values())[:10]]
    saturated_ = [colorsys.rgb_to_hsv(*to_rgb(c))[1] > 0.2 for c in list(colours.values())[:10]]
    # tab10's grey has no hue: compare the coloured ones; no two within 0.02 of a turn
    chromatic = np.sort([h for h, s in zip(hues, saturated_, strict=True) if s])
    gaps = np.diff(np.concatenate([chromatic, chromatic[:1] + 1]))
    assert len(set(colours.values())) == 12 and gaps.min() > 0.02


def test_the_measure_boards_name_each_measure_in_words(monkeypatch, tmp_path):
    """The leaderboard's and the selection figure's rows: plain names (``top eigenvalue of H``),
    no metric key (``flat/top_eig_hessian``)."""
    from matplotlib.figure import Figure

    from analysis.leaderboard import leaderboard, leaderboard_figure
    from analysis.selection import selection_figure, selection_table
    from tests.analysis.leaderboard_data import ACC as BOARD_ACC
    from tests.analysis.leaderboard_data import planted as board_runs
    from tests.analysis.test_selection import ACC as SELECTION_ACC
    from tests.analysis.test_selection import planted as selection_runs

    saved, savefig = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: saved.append(fig) or savefig(
        fig, *a, **k))
    leaderboard_figure(leaderboard(board_runs(), tasks=("A",), n_boot=5), tmp_path / "l.png")
    selection_figure(selection_table(selection_runs(), SELECTION_ACC, kl_threshold=0.05,
                                     n_boot=10), tmp_path / "s.png")
    assert BOARD_ACC and len(saved) == 2
    rows = [t.get_text() for fig in saved for ax in fig.axes for t in ax.get_yticklabels()]
    assert rows and not [r for r in rows if "/" in r], rows
