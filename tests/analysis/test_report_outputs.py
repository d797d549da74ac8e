"""Issue 52, item 5: ``python analysis/report.py --out DIR`` with ``DIR/conclusion.md`` a
symbolic link refused it only after writing 12 other files, in a ``LinkRefusedError``
traceback. Every output of a report script is checked for a link before any file is written
(``analysis.output.report_dir``'s ``files``), and the refusal is one line."""

import pytest

pytest.importorskip("scipy")
pytest.importorskip("matplotlib")

from analysis import replication, report  # noqa: E402
from analysis.correlate import Bootstrap  # noqa: E402
from tests.analysis.glance_runs import readme_runs, steps_runs  # noqa: E402
from tests.inprocess import run_main  # noqa: E402

A = "probe/A/acc_mean"


@pytest.mark.parametrize("name", ["conclusion.md", "runs.csv", "selection.md.tmp"])
def test_report_refuses_a_link_among_its_outputs_before_writing_any(tmp_path, monkeypatch,
                                                                     name):
    out, target = tmp_path / "out", tmp_path / "precious.md"
    out.mkdir()
    target.write_text("mine\n")
    (out / name).symlink_to(target)
    monkeypatch.setattr(report, "load_table", lambda args: (readme_runs(), None))
    done = run_main(report.main, ["--trials", tmp_path, "--out", out, "--kl-threshold", "0.05",
                                  "--n-boot", "20", "--no-log"])
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"--out {out}: {name} there is a symbolic link (to {target})" in done.stderr
    assert "remove it, or give another --out" in done.stderr
    assert [p.name for p in out.iterdir()] == [name] and target.read_text() == "mine\n"


def test_replication_refuses_a_link_among_its_outputs_before_any_work(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "replication.md").symlink_to(tmp_path / "elsewhere.md")
    done = run_main(replication.main, ["--trials", tmp_path, "--out", out, "--no-log"])
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "replication.md there is a symbolic link" in done.stderr
    assert [p.name for p in out.iterdir()] == ["replication.md"]


@pytest.mark.parametrize("runs", [readme_runs, steps_runs])
def test_report_files_lists_every_file_the_report_writes(tmp_path, runs):
    """The list checked before any write is the list of what is written."""
    paths, _ = report.write_report(runs(), tmp_path, A, boot=Bootstrap(20), kl_threshold=0.05)
    assert {p.name for p in paths} <= set(report.REPORT_FILES)
    assert {p.name for p in tmp_path.iterdir()} <= set(report.REPORT_FILES)
