"""The committed testbed report (``bench/results/replication_testbed/room/``) is what the code
makes of the committed trials, byte for byte: a refactor of the claims, the rule or the report
that changes a number, a word or a figure fails here (issue 39: "behaviour unchanged")."""

from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from analysis.replication import main as replication_report  # noqa: E402

ROOT = Path(__file__).parents[2]
REPORT = ROOT / "bench" / "results" / "replication_testbed" / "room"
TRIALS = ROOT / "bench" / "results" / "replication_testbed" / "trials"
# as in the committed report's header (its "Made by" and "Hardware" lines)
COMMAND = ("python analysis/replication.py --trials bench/results/replication_testbed/trials "
           "--out bench/results/replication_testbed/room (the trials' own commands are in "
           "../replication.md's header)")
HARDWARE = "Linux-6.18.44-fc-v669-x86_64-with-glibc2.36"


@pytest.mark.slow
def test_the_committed_testbed_report_regenerates_byte_for_byte(tmp_path):
    assert replication_report(["--trials", str(TRIALS), "--out", str(tmp_path), "--no-log",
                               "--command", COMMAND, "--hardware", HARDWARE]) == 0
    committed = sorted(p.name for p in REPORT.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == committed
    differ = [n for n in committed if (tmp_path / n).read_bytes() != (REPORT / n).read_bytes()]
    assert differ == []
