"""Issue 39, item 5: the sweeps take ``--scale`` and ``--protocol`` with the names and defaults of
``flatlm replicate``; the retired ``--preset`` (whose ``tiny`` was the ``sweep`` scale, not
``--scale tiny``) is an error naming what replaces it, before any trial starts."""

import subprocess
import sys
from pathlib import Path

import pytest

from flatlm.commands import DEFAULT_PROTOCOL, DEFAULT_SCALE
from sweeps import cli, scaling
from sweeps.experiment import experiment_of

ROOT = Path(__file__).resolve().parents[2]


def parsed(*argv):
    return cli.parser(scaling.__doc__).parse_args(list(argv))


def test_the_sweeps_default_scale_and_protocol_are_the_shared_ones():
    args = parsed()
    assert (args.scale, args.protocol) == (DEFAULT_SCALE, DEFAULT_PROTOCOL) == ("sweep", "paper")
    assert experiment_of("sizes", args).scale == "sweep"
    assert experiment_of("sizes", parsed("--scale", "tiny")).scale == "tiny"  # replicate's tiny


@pytest.mark.parametrize("preset, instead", [
    ("tiny", "--scale sweep"), ("paper", "--scale gpu"),
    ("paper-code", "--scale gpu --protocol paper-code"),
    ("huge", "--scale NAME --protocol NAME")])
def test_the_retired_preset_is_an_error_naming_its_replacement(preset, instead):
    with pytest.raises(ValueError, match=f"--preset {preset}: --preset was renamed; use "
                                         f"{instead} "):
        cli.check_scale_and_protocol(parsed("--preset", preset))


def test_an_unknown_scale_or_protocol_is_named_before_any_trial():
    with pytest.raises(ValueError, match="scale='big': use one of sweep, tiny, gpu, testbed"):
        cli.check_scale_and_protocol(parsed("--scale", "big"))
    with pytest.raises(ValueError, match="paperz"):
        cli.check_scale_and_protocol(parsed("--protocol", "paperz"))


def test_a_sweep_script_given_preset_exits_2_and_says_what_to_write():
    done = subprocess.run([sys.executable, "sweeps/scaling.py", "--preset", "paper"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "error: --preset paper: --preset was renamed; use --scale gpu" in done.stderr
    assert "--preset" not in subprocess.run(
        [sys.executable, "sweeps/scaling.py", "--help"], cwd=ROOT, capture_output=True,
        text=True, timeout=120).stdout


def test_a_trials_tags_name_its_scale_and_protocol_from_a_new_or_a_resumed_old_sweep():
    pytest.importorskip("ray")
    from flatlm.experiments.paper import base_of
    from sweeps.trainable import run_tags

    cfg = base_of("sweep")
    new = run_tags(cfg, {"name": "s", "scale": "sweep", "protocol": "paper"})
    old = run_tags(cfg, {"name": "s", "preset": "tiny"})  # started before the rename
    assert new == old and (new["scale"], new["protocol"]) == ("sweep", "paper")
