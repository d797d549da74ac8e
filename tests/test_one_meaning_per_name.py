"""Issue 39, item 5: one meaning per name, one definition per shared constant. A name that once
meant two or three things (``ALGORITHMS``: the registry, the algorithms experiment's grid, the
selection sweep's default; ``PRESETS``: model presets and the sweeps' (scale, protocol) pairs;
``PAPER``: the paper's protocol and the sweeps' claims) is defined in one module, and the
saturation threshold (once written as 0.02 in four places) is ``flatlm.measure.SATURATED_KL``.

Issue 51, item 3: likewise a module's file name. ``progress.py`` once named three modules with
three jobs (a trial's progress line, a measurement's bar and timer, the sweep driver's board of
running trials); they are ``flatlm/runs/trial_progress.py``, ``flatlm/measure/timing.py`` and
``sweeps/progress_board.py``, and no two modules share such a name again. "landscape" once named
a package (``flatlm.measure.landscape``: barriers, critical and preconditioned sharpness, the
LLC, noise) and the run of eigen, density, blocks and sharpness in another package
(``curvature.beyond_trace``); that run is ``run_beyond_trace`` / ``measure_beyond_trace`` now
(the timing key ``time/landscape_s`` stays: the committed records hold it)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flatlm", "sweeps", "analysis", "apps", "bench")
# name -> the one module that defines it
ONE_HOME = {"ALGORITHMS": "flatlm/train/registry.py", "PRESETS": "flatlm/models/presets.py",
            "PAPER": "flatlm/experiments/protocols.py", "CLAIMS": "analysis/paper_claims.py",
            "Claim": "analysis/paper_claims.py", "SATURATED_KL": "flatlm/measure/__init__.py"}
# module file names that once meant several things in these packages: at most one module each
MODULE_PACKAGES = ("flatlm", "sweeps", "analysis", "apps")
ONE_MODULE = ("progress.py",)


def sources():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path.read_text()


def defining(name: str) -> list[str]:
    """Modules that define ``name`` at their top level (an assignment or a class)."""
    pattern = re.compile(rf"^(?:class {name}\b|{name}\s*(?::[^=\n]+)?=)", re.M)
    return [path for path, text in sources() if pattern.search(text)]


@pytest.mark.parametrize("name", sorted(ONE_HOME))
def test_a_name_has_one_home(name):
    assert defining(name) == [ONE_HOME[name]]


def test_the_saturation_threshold_is_written_once():
    literal = re.compile(r"(kl_threshold|kl_max|KL_THRESHOLD|SATURATION)\W{1,4}0\.02\b")
    assert [p for p, text in sources() if literal.search(text)] == []
    from analysis.claims import DEFAULT_RULE
    from analysis.leaderboard import KL_THRESHOLD
    from flatlm.experiments.scales import TESTBED
    from flatlm.measure import SATURATED_KL

    assert SATURATED_KL == 0.02  # the verdicts' rule, as every committed report states it
    assert DEFAULT_RULE.saturation == KL_THRESHOLD == TESTBED.kl_threshold == SATURATED_KL


@pytest.mark.parametrize("file_name", ONE_MODULE)
def test_a_module_name_has_one_meaning(file_name):
    modules = [path.relative_to(ROOT).as_posix() for package in MODULE_PACKAGES
               for path in sorted((ROOT / package).rglob(file_name))]
    assert len(modules) <= 1, f"{file_name} names several modules: {modules}"


def test_landscape_names_the_package_and_no_function():
    pattern = re.compile(r"^def \w*landscape\w*\(", re.M)
    assert [path for path, text in sources() if pattern.search(text)] == []
