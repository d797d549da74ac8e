"""Every interval the README's "What flatlm finds" quotes is a cell of a committed report, as the
report prints it (issue 55: a quote that matched neither row it stood for)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORTS = [*(ROOT / "bench" / "results" / name / "room" / "replication.md"
             for name in ("replication_testbed", "replication_testbed_v2")),
           *(ROOT / "bench" / "results" / "selection_v2" / name
             for name in ("leaderboard.md", "invariant_verdicts.md"))]
# a number (with its unit) and its bracketed interval: "+5.01 pts [-1.33 pts, +11.35 pts]"
INTERVAL = re.compile(r"[+-]?\d+(?:\.\d+)?(?: pts|%)? \[[+-]?\d[^\]]*\]")


def findings() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### What flatlm finds"):text.index("## To a cluster")]
    return " ".join(section.split())  # a quote wrapped over lines reads as one


def test_every_quoted_interval_is_a_committed_reports_cell():
    quoted = INTERVAL.findall(findings())
    assert len(quoted) >= 10
    reports = " ".join(" ".join(p.read_text().split()) for p in REPORTS)
    missing = [q for q in quoted if q not in reports]
    assert not missing, f"quoted in the README, in no committed report: {missing}"
