"""Checkpoints measured in a second process (``flatlm.runs.follow``) give the rows that the trial
measures in its own: metrics.jsonl equal but for the time/ keys."""

import json
import subprocess

from flatlm.runs.follow import follow_trial
from flatlm.runs.trial import read_metrics, run_trial
from flatlm.storage.dirlock import held_elsewhere, writer_lock
from tests.test_readme import FLATLM, ROOT, checkout_env
from tests.test_trial import TINY, tiny

STEPS = {"train.steps": 4, "train.checkpoint_steps": [0, 2, 4]}


def _numbers(rows: dict) -> dict:
    return {step: {k: v for k, v in row.items() if not k.startswith("time/")}
            for step, row in rows.items()}


def test_background_rows_equal_the_in_process_rows(tmp_path):
    cfg = tiny(**STEPS)
    in_process = run_trial(cfg, tmp_path / "here")
    trained = run_trial(cfg, tmp_path / "beside", measure_in="background")
    assert trained == {}  # training alone writes no metrics
    followed = follow_trial(tmp_path / "beside")
    assert sorted(followed) == [0, 2, 4]
    assert _numbers(followed) == _numbers(in_process)
    assert _numbers(read_metrics(tmp_path / "beside")) == _numbers(in_process)
    assert "flat/trace_hessian" in followed[4] and "probe/B/acc_mean" in followed[4]
    ckpt_row = json.loads((tmp_path / "beside/checkpoints/step-2/metrics.json").read_text())
    assert _numbers({2: ckpt_row}) == _numbers({2: in_process[2]})
    # a second follower finds nothing left to measure and stops
    assert sorted(follow_trial(tmp_path / "beside")) == [0, 2, 4]


def test_held_elsewhere_sees_another_process_holding_the_lock(tmp_path):
    assert not held_elsewhere(tmp_path)  # no lock file
    with writer_lock(tmp_path):
        assert not held_elsewhere(tmp_path)  # this process's own lock
        probe = ("from flatlm.storage.dirlock import held_elsewhere; import sys; "
                 f"sys.exit(0 if held_elsewhere({str(tmp_path)!r}) else 1)")
        assert subprocess.run(["python", "-c", probe], env=checkout_env(), cwd=ROOT).returncode \
            == 0
    assert not held_elsewhere(tmp_path)


def test_cli_trial_measures_in_background(tmp_path):
    """The --help example ``flatlm trial --out t/ --quick --measure-in background``, tiny."""
    sets = [w for k, v in {**TINY, **STEPS, "measure.what": "loss"}.items()
            for w in ("--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}")]
    argv = [*FLATLM, "trial", "--out", str(tmp_path / "t"), "--quick", "--measure-in",
            "background", "--no-progress", "--eval-cache", "none", *sets]
    done = subprocess.run(argv, cwd=ROOT, env=checkout_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_metrics(tmp_path / "t")
    assert sorted(rows) == [0, 2, 4] and all("pretrain/kl" in r for r in rows.values())
    assert "measured step 4" in done.stdout
