"""`flatlm train`: runs, resumes up to --steps, and reports bad input as a clean error."""

import json

import pytest
from safetensors.torch import load_file

from flatlm.cli import main

SOURCE = json.dumps({"kind": "pcfg", "random": {"vocab": 12, "depth": 2,
                                                "nonterminals_per_level": 3, "roots": 2},
                     "seed": 0})


def _train(out, *extra):
    return main(["train", "--source", SOURCE, "--model", "d32-h2-l1-i64", "--batch-size", "16",
                 "--warmup-steps", "2", "--seed", "3", "--out", str(out), "--no-progress",
                 "--device", "cpu", *extra])


def test_train_then_resume_to_more_steps(tmp_path, capsys):
    assert _train(tmp_path / "a", "--steps", "8", "--checkpoint-steps", "0,4,8") == 0
    assert _train(tmp_path / "b", "--steps", "4", "--checkpoint-steps", "0,4") == 0
    assert _train(tmp_path / "b", "--steps", "8", "--checkpoint-steps", "0,4,8",
                  "--resume") == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["step"] == 8 and len(last["checkpoints"]) == 3
    a = load_file(tmp_path / "a/checkpoints/step-8/model.safetensors")
    b = load_file(tmp_path / "b/checkpoints/step-8/model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


@pytest.mark.parametrize(("args", "message"), [
    (["--algorithm", "adam"], "train.algorithm='adam'"),
    (["--lr", "-1"], "train.lr=-1.0"),
    (["--steps", "10", "--checkpoint-steps", "0,20"], "train.checkpoint_steps"),
    (["--model", "bert-3m"], "model 'bert-3m' is neither a preset"),
])
def test_bad_configuration_is_a_clean_error(tmp_path, capsys, args, message):
    assert _train(tmp_path, *args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "checkpoints").exists()
