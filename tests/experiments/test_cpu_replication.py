"""A CPU-scale replication end to end: ``flatlm replicate`` (both protocols, every experiment,
two seeds, tiny runs) writes trial directories; ``analysis/replication.py`` reads them and
writes replication.md with a row and a verdict for every claim of each protocol, the reference
points and the figures; ``analysis/report.py --trials`` reads the same directories."""

from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]

from analysis import replication, report  # noqa: E402
from analysis.claims import CLAIMS  # noqa: E402
from flatlm.cli import main as flatlm  # noqa: E402
from tests.experiments.fastcfg import FAST_MODELS, fast_set_flags  # noqa: E402

VERDICTS = {"reproduces", "contradicts", "inconclusive (not saturated)",
            "inconclusive (losses differ)", "inconclusive (n < 3)", "inconclusive (runs < 5)",
            "inconclusive (no effect as large as the paper's)", "inconclusive (underpowered)",
            "inconclusive (paper states no size)", "inconclusive (no interval)"}


@pytest.fixture(scope="module")
def trials(tmp_path_factory):
    root = tmp_path_factory.mktemp("repl")
    rc = flatlm(["replicate", "--out", str(root), "--scale", "tiny", "--protocol",
                 "paper,paper-code", "--seeds", "2", "--models", ",".join(FAST_MODELS),
                 *fast_set_flags()])
    assert rc == 0
    rc = flatlm(["replicate", "--out", str(root), "--scale", "tiny", "--seeds", "2",
                 "--experiment", "steps",
                 "--protocol", "paper+mask-only", *fast_set_flags()])  # a diagnosis row
    assert rc == 0
    return root


@pytest.mark.slow
def test_every_claim_gets_a_row_and_a_verdict_under_both_protocols(trials, tmp_path):
    out = tmp_path / "report"
    # 6-step runs are far from the truth: loose tolerances let the rows past saturation, and
    # two seeds still reach no verdict
    assert replication.main(["--trials", str(trials), "--out", str(out), "--saturation", "10",
                             "--tol", "5", "--command", "pytest", "--n-boot", "50"]) == 0
    claims = pd.read_csv(out / "claims.csv")
    assert set(claims["protocol"]) == {"paper", "paper-code", "paper+mask-only"}
    for protocol, rows in claims[claims["protocol"] != "paper+mask-only"].groupby("protocol"):
        claims = rows[rows["experiment"] != "all"]
        assert len(claims) == len(CLAIMS), protocol
        assert (rows["figure"] == "Fig. 1 (1, 4)").sum() >= 1  # one per parameterisation
        assert set(rows["verdict"]) <= VERDICTS
        assert (claims["verdict"] == "inconclusive (n < 3)").all()
        assert claims["n"].min() >= 1
    md = (out / "replication.md").read_text()
    for needle in ("## Protocol `paper`", "## Protocol `paper-code`", "Reference points",
                   "random_init", "lookup", "majority", "Made by: `pytest`",
                   "## Diagnosis", "| paper+mask-only |"):
        assert needle in md
    for fig in ("steps.png", "sizes.png", "algorithms.png", "fig1_scatter.png"):
        assert (out / fig).stat().st_size > 10_000


@pytest.mark.slow
def test_unsaturated_runs_reach_no_verdict_at_the_default_tolerance(trials, tmp_path):
    # 6-step runs are nowhere near the truth: at KL <= 0.02 every row must say so
    assert replication.main(["--trials", str(trials), "--out", str(tmp_path),
                             "--n-boot", "20"]) == 0
    claims = pd.read_csv(tmp_path / "claims.csv")
    assert (claims["verdict"] == "inconclusive (not saturated)").all()


@pytest.mark.slow
def test_the_sweep_report_reads_trial_directories(trials, tmp_path, capsys):
    assert report.main(["--trials", str(trials), "--out", str(tmp_path),
                        "--kl-threshold", "10", "--n-boot", "50"]) == 0
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert runs["run_id"].nunique() == 2 * (2 + 2 * 2 + 4 * 2 + 2) + 2  # 2 x 16 + diagnosis
    assert "wrote" in capsys.readouterr().out
