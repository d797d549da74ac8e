"""Issue 54 item 3: the leaderboard marks each measure invariant or not by the committed
invariance test (bench/results/invariance.json), not by its docstring."""

import json

from analysis.leaderboard import RESCALINGS, WHY_SHAPE_FREE, invariance_markdown, invariance_of


def planted(tmp_path):
    rows = [{"measure": "m/kept", "case": c, "invariant": True} for c in RESCALINGS]
    rows += [{"measure": "m/lost", "case": c, "invariant": c == "query-key"} for c in RESCALINGS]
    rows += [{"measure": "m/lost", "case": "permutation", "invariant": True},  # the control
             {"measure": "m/grown", "case": "grow-width-paper", "invariant": False}]
    path = tmp_path / "invariance.json"
    path.write_text(json.dumps({"rows": rows}))
    return path


def test_each_measure_is_read_off_the_rescaling_rows_only(tmp_path):
    found = invariance_of(["m/kept", "m/lost", "m/grown", "m/absent"], planted(tmp_path))
    assert found == {"m/kept": list(RESCALINGS), "m/lost": ["query-key"],
                     "m/grown": None, "m/absent": None}


def test_the_committed_table_marks_the_traces_not_invariant_and_the_cka_invariant():
    text = invariance_markdown(["flat/trace_fisher", "cka/truth", "llc/mean"])
    assert "| `flat/trace_fisher` | no | query-key, value-output, layer-norm |" in text
    assert "| `cka/truth` | yes |  |" in text
    assert "| `llc/mean` | no |" in text  # the SGLD estimate moves 1.5-5.7x


def test_no_measure_the_test_finds_moving_is_called_invariant_in_the_text():
    moving = [m for m, kept in invariance_of(["llc/mean", "flat/critical_sharpness"]).items()
              if kept is not None and len(kept) < len(RESCALINGS)]
    assert moving == ["llc/mean", "flat/critical_sharpness"]
    assert "LLC (an effective parameter count, invariant" not in WHY_SHAPE_FREE
