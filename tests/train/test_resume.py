"""Checkpoints: stopping and resuming gives the run that never stopped, bit for bit on the CPU;
a checkpoint is a transformers checkpoint."""

import dataclasses

import pytest
import torch
from transformers import BertForMaskedLM

from flatlm.models import encode, load_checkpoint
from flatlm.train import AdversarialConfig, TrainConfig, train


def _draw_rng(s, model, ckpt_dir):
    torch.rand(100)  # a measurement that consumes the global RNG must not change training


RESUME_CASES = {
    # dropout on (its RNG state must be restored); log windows straddle the checkpoint
    "adamw": dict(algorithm="adamw", log_every=4),
    "sam-accumulated": dict(algorithm="sam", micro_batch_size=8),
    "adversarial": dict(algorithm="adversarial",
                        sections={"adversarial": AdversarialConfig(d1=16, d2=16, pool=128)}),
    "sgd-rate": dict(algorithm="sgd", lr=0.1, mask=0.3),
    "lstm": dict(algorithm="adamw"),
    "muon": dict(algorithm="muon", log_every=4),  # Muon's momentum and AdamW's moments saved
    "truth-rate": dict(algorithm="adamw", targets="truth", mask=0.3),  # soft targets [n, T, V]
}


@pytest.mark.parametrize("name", RESUME_CASES)
def test_stop_and_resume_equals_never_stopping(name, src, tiny_model, tmp_path, stop_at):
    N = 6
    model = "lstm-h16-l2" if name == "lstm" else tiny_model
    cfg = TrainConfig(steps=2 * N, batch_size=32, warmup_steps=4, checkpoint_steps=(N, 2 * N),
                      seed=7, **RESUME_CASES[name])
    straight = train(cfg, src, model, tmp_path / "a", progress=False, on_checkpoint=_draw_rng)
    with pytest.raises(stop_at.Stopped):
        train(cfg, src, model, tmp_path / "b", progress=False, on_checkpoint=stop_at(N))
    resumed = train(cfg, src, model, tmp_path / "b", progress=False, resume=True)
    for (k, a), b in zip(straight.model.state_dict().items(),
                         resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), k  # bit for bit
    assert resumed.history == straight.history
    assert list(resumed.checkpoints) == [N, 2 * N]


def test_resume_extends_a_finished_run(src, tiny_model, tmp_path):
    """`--steps N` then `--steps 2N --resume` equals `--steps 2N` (fixed-length warmup)."""
    cfg = TrainConfig(steps=10, batch_size=32, warmup_steps=3, checkpoint_steps=(5, 10), seed=2)
    straight = train(cfg, src, tiny_model, tmp_path / "a", progress=False)
    short = dataclasses.replace(cfg, steps=5, checkpoint_steps=(5,))
    train(short, src, tiny_model, tmp_path / "b", progress=False)
    extended = train(cfg, src, tiny_model, tmp_path / "b", progress=False, resume=True)
    for a, b in zip(straight.model.parameters(), extended.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_corpus_run_resumes_exactly(src, tiny_model, tmp_path, stop_at):
    corpus = src.sample(40, seed=5)  # 40 sentences, batches of 16: epochs end mid-batch
    cfg = TrainConfig(steps=8, batch_size=16, warmup_steps=2, checkpoint_steps=(3, 8),
                      data="in-memory")
    straight = train(cfg, src, tiny_model, tmp_path / "a", progress=False, corpus=corpus)
    with pytest.raises(stop_at.Stopped):
        train(cfg, src, tiny_model, tmp_path / "b", progress=False, corpus=corpus,
              on_checkpoint=stop_at(3))
    resumed = train(cfg, src, tiny_model, tmp_path / "b", progress=False, corpus=corpus,
                    resume=True)
    for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_checkpoint_loads_with_from_pretrained(src, tiny_model, eval_sentences, tmp_path):
    cfg = TrainConfig(steps=3, batch_size=16, warmup_steps=1, checkpoint_steps=(3,))
    result = train(cfg, src, tiny_model, tmp_path, progress=False)
    ckpt = tmp_path / "checkpoints" / "step-3"
    assert result.checkpoints == {3: ckpt}
    loaded = BertForMaskedLM.from_pretrained(ckpt, local_files_only=True).eval()
    ids, mask = encode(*eval_sentences)
    with torch.no_grad():
        expected = result.model.eval()(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(loaded(input_ids=ids, attention_mask=mask).logits, expected,
                                   rtol=0, atol=0)
    _, info = load_checkpoint(ckpt)
    assert info["extra"]["step"] == 3 and info["extra"]["train"]["dropout"] == 0.1
    assert info["source"] == src.spec


def test_existing_checkpoints_need_resume(src, tiny_model, tmp_path):
    cfg = TrainConfig(steps=2, batch_size=8, warmup_steps=1, checkpoint_steps=(0,))
    train(cfg, src, tiny_model, tmp_path, progress=False)
    with pytest.raises(ValueError, match="already holds checkpoints"):
        train(cfg, src, tiny_model, tmp_path, progress=False)


def test_resume_refuses_a_changed_run(src, tiny_model, tmp_path):
    cfg = TrainConfig(steps=4, batch_size=8, warmup_steps=1, checkpoint_steps=(2,))
    train(cfg, src, tiny_model, tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"train\.lr=0\.001 -> 0\.002"):
        train(dataclasses.replace(cfg, lr=2e-3), src, tiny_model, tmp_path, progress=False,
              resume=True)
    with pytest.raises(ValueError, match="past train.steps=1"):
        train(dataclasses.replace(cfg, steps=1, checkpoint_steps=()), src, tiny_model, tmp_path,
              progress=False, resume=True)


def _truncate(path):
    path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 3)])


def _flip_last_byte(path):
    """One bit of the last tensor's data: the file still parses and loads."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, how", [
    ("model.safetensors", _truncate), ("training_state.pt", _truncate),
    ("config.json", _truncate), ("flatlm.json", _truncate),
    ("model.safetensors", _flip_last_byte),  # caught by the manifest's hash alone
])
def test_an_unreadable_newest_checkpoint_falls_back_to_the_one_before(damage, how, src, stop_at,
                                                                       tiny_model, tmp_path):
    cfg = TrainConfig(steps=9, batch_size=16, warmup_steps=2, checkpoint_steps=(3, 6, 9), seed=4)
    straight = train(cfg, src, tiny_model, tmp_path / "a", progress=False)
    with pytest.raises(stop_at.Stopped):
        train(cfg, src, tiny_model, tmp_path / "b", progress=False, on_checkpoint=stop_at(6))
    how(tmp_path / "b" / "checkpoints" / "step-6" / damage)  # a torn write, a full disk, a bit
    resumed = train(cfg, src, tiny_model, tmp_path / "b", progress=False, resume=True)
    for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)  # resumed from step 3, bit for bit
    assert list(resumed.checkpoints) == [3, 6, 9]
    assert (tmp_path / "b" / "checkpoints" / "step-6.corrupt" / damage).exists()  # kept aside


def test_a_flipped_bit_in_the_weights_is_an_error_naming_the_file(src, tiny_model, tmp_path):
    from flatlm.models.checkpoint import load_checkpoint

    cfg = TrainConfig(steps=2, batch_size=8, warmup_steps=1, checkpoint_steps=(2,))
    train(cfg, src, tiny_model, tmp_path, progress=False)
    ckpt = tmp_path / "checkpoints" / "step-2"
    load_checkpoint(ckpt)  # intact: loads
    _flip_last_byte(ckpt / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.safetensors: its SHA-256 differs"):
        load_checkpoint(ckpt)


def test_a_full_disk_at_a_checkpoint_keeps_the_earlier_ones_and_says_so(src, tiny_model,
                                                                       tmp_path, monkeypatch):
    """torch.save on a full disk raises RuntimeError("basic_ios::clear"): the half-written
    checkpoint is removed, the error names it and the free space, and a resume once there is
    room ends where an uninterrupted run ends, bit for bit."""
    import pickle

    import flatlm.train.run as loop  # the run (flatlm.train.run) writes the checkpoints
    from flatlm.train.loop import CheckpointWriteError

    cfg = TrainConfig(steps=6, batch_size=16, warmup_steps=2, checkpoint_steps=(3, 6), seed=2)
    straight = train(cfg, src, tiny_model, tmp_path / "a", progress=False)
    save_state = loop.save_state

    def full_disk(state, ckpt_dir):
        if state.step == 6:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos "
                               "basic_ios::clear: iostream error")
        save_state(state, ckpt_dir)

    monkeypatch.setattr(loop, "save_state", full_disk)
    with pytest.raises(CheckpointWriteError, match=r"could not write checkpoint .*step-6 "
                                                   r"\(.*basic_ios::clear.*GiB free.*intact"):
        train(cfg, src, tiny_model, tmp_path / "b", progress=False)
    ckpts = sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir())
    assert ckpts == ["step-3"]  # no step-6.tmp left behind
    monkeypatch.setattr(loop, "save_state", save_state)
    resumed = train(cfg, src, tiny_model, tmp_path / "b", progress=False, resume=True)
    for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)
    err = CheckpointWriteError("x")
    assert str(pickle.loads(pickle.dumps(err))) == "x"  # crosses to a Ray driver intact


def test_a_flipped_bit_is_caught_with_the_manifest_deleted_too(src, stop_at, tiny_model,
                                                               tmp_path):
    """Issue 43, item 12: with manifest.json deleted and a bit flipped in the weights, resume
    accepted the damaged checkpoint; flatlm.json now keeps the weights' SHA-256 beside them."""
    from flatlm.models.checkpoint import load_checkpoint

    cfg = TrainConfig(steps=9, batch_size=16, warmup_steps=2, checkpoint_steps=(3, 6, 9), seed=4)
    straight = train(cfg, src, tiny_model, tmp_path / "a", progress=False)
    with pytest.raises(stop_at.Stopped):
        train(cfg, src, tiny_model, tmp_path / "b", progress=False, on_checkpoint=stop_at(6))
    ckpt = tmp_path / "b" / "checkpoints" / "step-6"
    (ckpt / "manifest.json").unlink()
    load_checkpoint(ckpt)  # intact without its manifest: loads
    _flip_last_byte(ckpt / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.safetensors: its SHA-256 differs from the one"):
        load_checkpoint(ckpt)
    resumed = train(cfg, src, tiny_model, tmp_path / "b", progress=False, resume=True)
    for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)  # resumed from step 3, bit for bit
