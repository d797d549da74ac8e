"""Bad --device values and a checkpoint measured on another language are messages (exit 2)
naming the fix, before any work; not CUDA or tensor-shape tracebacks."""

import pytest
import torch

from flatlm.cli import main as flatlm

TRAIN = ["train", "--source", "dyck:4", "--model", "d16-h1-l1-i32", "--steps", "2",
         "--batch-size", "4", "--no-progress"]


@pytest.mark.parametrize("device, needle", [("tpu", "use auto, cpu, cuda"),
                                            ("cuda:x", "use auto, cpu, cuda")])
def test_an_unknown_device_is_refused(device, needle, tmp_path, capsys):
    assert flatlm([*TRAIN, "--out", str(tmp_path / "r"), "--device", device]) == 2
    assert needle in capsys.readouterr().err and not (tmp_path / "r").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_a_machine_without_it_is_refused(tmp_path, capsys):
    assert flatlm([*TRAIN, "--out", str(tmp_path / "r"), "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_measuring_on_a_language_of_another_vocabulary_is_refused(tmp_path, capsys):
    assert flatlm([*TRAIN, "--out", str(tmp_path / "r")]) == 0
    rc = flatlm(["measure", str(tmp_path / "r" / "checkpoints" / "step-2"), "--source",
                 "pcfg:paper", "--what", "loss"])
    assert rc == 2 and "trained on a language of 2 words" in capsys.readouterr().err


def test_measure_replaces_a_measure_json_link_instead_of_writing_through_it(tmp_path):
    assert flatlm([*TRAIN, "--out", str(tmp_path / "r")]) == 0
    ckpt = tmp_path / "r" / "checkpoints" / "step-2"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (ckpt / "measure.json").symlink_to(victim)
    assert flatlm(["measure", str(ckpt), "--what", "loss"]) == 0
    assert victim.read_text() == "keep me"
    assert not (ckpt / "measure.json").is_symlink()
