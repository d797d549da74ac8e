"""A trial whose training a finished trial already did (the sizes grid's base model and the
algorithms' AdamW run) is measured from that trial's checkpoints, and its numbers are those it
gets training itself; what is not the same training is not reused."""

import dataclasses
import json
import shutil

import pytest

from flatlm.core.config import apply_overrides
from flatlm.experiments.paper import build
from flatlm.experiments.runner import TRAINED_BY, find_twin, run_experiment, trial_dir
from flatlm.experiments.scales import scale
from flatlm.models.presets import parse_model
from flatlm.runs.trial import labelled_source, training_identity
from flatlm.sources import load
from flatlm.storage.metrics_log import read_metrics, read_train_log
from flatlm.train.config import resolve
from flatlm.train.loop import train
from flatlm.train.run import start_checkpoint
from flatlm.train.state import find_checkpoints
from tests.experiments.fastcfg import FAST

BASE_MODEL = scale("tiny").model  # the sizes grid's model that the algorithms train


# FAST with two checkpoints (measuring is most of the time): one measured as the newest, one older
CHECKPOINTS = {**FAST, "train.checkpoint_steps": [3, 6]}


def experiment(name):
    return build(name, scale="tiny", protocol="paper", seeds=(0,), models=(BASE_MODEL,),
                 algorithms=("adamw",), overrides=CHECKPOINTS)


SIZES, ALGORITHMS = experiment("sizes"), experiment("algorithms")
(SIZES_TRIAL, SIZES_CFG), = SIZES.trials()
(TWIN_TRIAL, TWIN_CFG), = ALGORITHMS.trials()


def measured(out):
    return {step: {k: v for k, v in row.items() if not k.startswith("time/")}
            for step, row in read_metrics(out).items()}


def snapshot(directory):
    """Every file under ``directory``: (bytes, mtime_ns)."""
    return {p.relative_to(directory): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != ".flatlm.lock"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(root where the algorithms ran first, then the sizes; the twin's files before the sizes
    ran; what the sizes trial was told; root where the sizes ran alone)."""
    shared, alone = tmp_path_factory.mktemp("shared"), tmp_path_factory.mktemp("alone")
    assert run_experiment(ALGORITHMS, shared)
    twin = trial_dir(shared, ALGORITHMS, TWIN_TRIAL)
    before = snapshot(twin)
    states = []
    assert run_experiment(SIZES, shared, on_trial=lambda name, state: states.append(state))
    assert run_experiment(SIZES, alone)
    return shared, before, states, alone


def test_the_base_model_of_the_sizes_grid_trains_as_the_algorithms_adamw_run():
    assert training_identity(SIZES_CFG) == training_identity(TWIN_CFG)
    assert SIZES_CFG.measure != TWIN_CFG.measure  # yet it is measured otherwise


def test_a_trial_measured_from_its_twin_equals_the_trial_trained_alone(runs):
    shared, _, states, alone = runs
    out = trial_dir(shared, SIZES, SIZES_TRIAL)
    assert states == [f"start (its training is paper/algorithms/{TWIN_TRIAL}'s: measuring "
                      "those checkpoints)", "done"]
    assert json.loads((out / TRAINED_BY).read_text()) == {
        "trial": f"paper/algorithms/{TWIN_TRIAL}", "steps": [3, 6]}
    reused, straight = measured(out), measured(trial_dir(alone, SIZES, SIZES_TRIAL))
    assert set(reused) == {3, 6} and reused == straight  # bit for bit on the CPU
    assert read_train_log(out) == read_train_log(trial_dir(alone, SIZES, SIZES_TRIAL))
    assert not (trial_dir(alone, SIZES, SIZES_TRIAL) / TRAINED_BY).exists()
    # the training is the twin's: a sum of time/train_s over trials counts it once
    rows = read_metrics(out)
    assert all(r["time/train_s"] == 0.0 and "time/measure_share" not in r for r in rows.values())
    assert all(r["time/train_s"] > 0 for r in read_metrics(trial_dir(alone, SIZES,
                                                                     SIZES_TRIAL)).values())


def test_the_twins_checkpoints_are_linked_not_retrained_and_left_unchanged(runs):
    shared, before, _, _ = runs
    twin = trial_dir(shared, ALGORITHMS, TWIN_TRIAL)
    assert snapshot(twin) == before  # its measurements, weights, states: bytes and times
    mine, theirs = find_checkpoints(trial_dir(shared, SIZES, SIZES_TRIAL)), find_checkpoints(twin)
    assert list(mine) == [3, 6]
    for step in mine:
        for name in ("model.safetensors", "training_state.pt", "manifest.json"):
            assert (mine[step] / name).samefile(theirs[step] / name)  # not re-saved
        ours, its = mine[step] / "metrics.json", theirs[step] / "metrics.json"
        assert not ours.samefile(its)  # measured here, by this trial's settings
        assert json.loads(ours.read_text()).keys() != json.loads(its.read_text()).keys()


def test_what_trains_otherwise_is_no_twin_and_another_algorithms_section_is(runs):
    shared, _, _, _ = runs
    out = shared / "paper" / "new" / "trial"
    twin = trial_dir(shared, ALGORITHMS, TWIN_TRIAL)
    for change in ({"train.seed": 1}, {"train.lr": 2e-3}, {"model": "d32-h2-l1-i128"},
                   {"train.checkpoint_steps": [3, 5, 6]}):  # no checkpoint at 5
        assert find_twin(shared, "paper", out, apply_overrides(SIZES_CFG, change)) is None
    for change in ({"train.sam.rho": 0.5}, {"train.adversarial.pool": 32},
                   {"train.checkpoint_steps": [6]}, {"train.log_every": 2},
                   {"measure.n_eval": 32}):
        found = find_twin(shared, "paper", out, apply_overrides(SIZES_CFG, change))
        assert found is not None and found.path == twin, change


def _adamw_cfg(protocol):
    (_, cfg), = build("algorithms", scale="tiny", protocol=protocol, seeds=(0,),
                      models=(BASE_MODEL,), algorithms=("adamw",),
                      overrides=CHECKPOINTS).trials()
    return cfg


def test_a_protocol_that_only_measures_otherwise_reuses_another_protocols_training(runs, tmp_path):
    shared, _, _, _ = runs
    twin = trial_dir(shared, ALGORITHMS, TWIN_TRIAL)
    probe_only = _adamw_cfg("paper+released-probe")  # the released probe: measuring only
    assert probe_only.measure != TWIN_CFG.measure
    out = shared / "paper+released-probe" / "algorithms" / "new"
    assert find_twin(shared, "paper+released-probe", out, probe_only).path == twin
    for trains_otherwise in ("paper-code", "paper+released-masking", "paper+pre-ln",
                             "paper+inside-labels"):  # the adversary's labels are training's
        cfg = _adamw_cfg(trains_otherwise)
        assert find_twin(shared, trains_otherwise, out, cfg) is None, trains_otherwise
    # the trial's own protocol first, though another's sorts before it
    own = tmp_path / "paper+released-probe" / "algorithms" / TWIN_TRIAL
    shutil.copytree(twin, own)
    shutil.copytree(twin, tmp_path / "paper" / "algorithms" / TWIN_TRIAL)
    assert find_twin(tmp_path, "paper+released-probe", out, probe_only).path == own


def test_an_unfinished_trial_is_no_twin(runs, tmp_path):
    shared, _, _, _ = runs
    twin = trial_dir(shared, ALGORITHMS, TWIN_TRIAL)
    copy = trial_dir(tmp_path, ALGORITHMS, TWIN_TRIAL)
    shutil.copytree(twin, copy)
    out = tmp_path / "paper" / "new" / "trial"
    assert find_twin(tmp_path, "paper", out, SIZES_CFG).path == copy
    rows = (copy / "metrics.jsonl").read_text().splitlines()
    (copy / "metrics.jsonl").write_text("\n".join(rows[:-1]) + "\n")  # step 6 not measured
    (copy / "checkpoints" / "step-6" / "metrics.json").unlink()  # (read_metrics reads it too)
    assert find_twin(tmp_path, "paper", out, SIZES_CFG) is None
    (copy / "config.json").write_text("{not json")
    assert find_twin(tmp_path, "paper", out, SIZES_CFG) is None


def _train_args(cfg):
    train_cfg = resolve(cfg.train)
    return train_cfg, dataclasses.replace(parse_model(cfg.model), dropout=train_cfg.dropout)


def test_a_resume_ignores_other_algorithms_sections_but_not_a_changed_rate(runs, tmp_path):
    shared, _, _, _ = runs
    out = tmp_path / "run"
    shutil.copytree(trial_dir(shared, ALGORITHMS, TWIN_TRIAL), out)
    train_cfg, model_cfg = _train_args(TWIN_CFG)
    other = apply_overrides(train_cfg, {"sam.rho": 0.5, "adversarial.pool": 32})
    (ckpt, state), _ = start_checkpoint(other, model_cfg, out, resume=True)
    assert ckpt.name == "step-6" and state.step == 6
    with pytest.raises(ValueError, match=r"train\.lr=\S+ -> 0\.002"):
        start_checkpoint(dataclasses.replace(other, lr=2e-3), model_cfg, out, resume=True)

    before, called = snapshot(out), []
    result = train(other, load(labelled_source(TWIN_CFG)), model_cfg, out, progress=False,
                   resume=True, on_checkpoint=lambda *args: called.append(args))
    assert result.step == 6 and called == []  # nothing trained, saved or measured again
    assert snapshot(out) == before


def test_a_twin_whose_checkpoint_was_damaged_is_passed_over_and_the_trial_trains_itself(
        tmp_path, caplog):
    """Issue 43, item 4: a twin whose checkpoint was damaged after it was written was
    hard-linked without checking its manifest; every rerun then stopped at that trial."""
    assert run_experiment(ALGORITHMS, tmp_path)
    twin = trial_dir(tmp_path, ALGORITHMS, TWIN_TRIAL)
    weights = find_checkpoints(twin)[3] / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one flipped bit: the file still parses
    weights.write_bytes(bytes(data))
    out = trial_dir(tmp_path, SIZES, SIZES_TRIAL)
    assert find_twin(tmp_path, "paper", out, SIZES_CFG) is None
    assert "model.safetensors: its SHA-256 differs" in caplog.text
    assert run_experiment(SIZES, tmp_path)  # trained itself, to the end
    assert not (out / TRAINED_BY).exists() and set(read_metrics(out)) == {3, 6}
