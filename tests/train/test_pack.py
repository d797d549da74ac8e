"""A pack of K runs (flatlm.train.pack) equals the K runs trained alone, and a resumed pack the
pack that never stopped: bit for bit on the CPU (tolerance 0, ``torch.equal`` and ``==`` on every
logged float), for every packable algorithm, with members that differ in seed, learning rate,
weight decay, dropout and length."""

import dataclasses
import json
import shutil

import pytest
import torch

from flatlm.models import load_checkpoint
from flatlm.storage.metrics_log import TRAIN_LOG_FILE
from flatlm.train import AdversarialConfig, GrowConfig, TrainConfig, train
from flatlm.train.pack import train_pack
from flatlm.train.run import Diverged
from flatlm.train.state import load_state


def _assert_same_run(member, alone):
    """Same weights, same logged curve, same checkpoint steps: bit for bit."""
    for (name, a), b in zip(alone.model.state_dict().items(),
                            member.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert member.history == alone.history
    assert list(member.checkpoints) == list(alone.checkpoints)


def _alone(cfgs, src, model, root):
    return [train(c, src, model, root / f"alone{k}", progress=False)
            for k, c in enumerate(cfgs)]


PACK_CASES = {
    # dropout 0.1: each member's masks must be its twin's; log windows straddle a checkpoint
    "adamw": dict(algorithm="adamw", log_every=4),
    "sgd-rate": dict(algorithm="sgd", mask=0.3),  # members mask different numbers of words
    "noreg": dict(algorithm="noreg"),  # dropout 0: the fused attention kernel
    "label_noise": dict(algorithm="label_noise"),  # each member's own noise stream
    "sam-accumulated": dict(algorithm="sam", micro_batch_size=4),  # per-member perturbations
    "adversarial": dict(algorithm="adversarial",  # per-member heads on per-member pools
                        sections={"adversarial": AdversarialConfig(d1=16, d2=16, pool=128)}),
}
# members differ in what a sweep varies: seed, rate, weight decay
MEMBERS = (dict(seed=1), dict(seed=2, lr=3e-3, weight_decay=0.05), dict(seed=3, lr=1e-2))


@pytest.mark.parametrize("name", PACK_CASES)
def test_each_member_equals_its_run_alone(name, src, tiny_model, tmp_path):
    cfgs = [TrainConfig(steps=6, batch_size=16, warmup_steps=2, checkpoint_steps=(3, 6),
                        **PACK_CASES[name], **m) for m in MEMBERS]
    packed = train_pack(cfgs, src, tiny_model, [tmp_path / f"m{k}" for k in range(3)],
                        progress=False)
    for member, alone in zip(packed, _alone(cfgs, src, tiny_model, tmp_path), strict=True):
        _assert_same_run(member, alone)


def test_members_differ_in_dropout_length_and_checkpoints(src, tiny_model, tmp_path):
    """A pack mixing dropout 0 and > 0 (two attention kernels), and a member that stops early
    and leaves the pack while the others go on."""
    base = TrainConfig(algorithm="noreg", steps=6, batch_size=16, warmup_steps=2)
    cfgs = [dataclasses.replace(base, seed=4, checkpoint_steps=(6,)),
            dataclasses.replace(base, seed=5, dropout=0.1, checkpoint_steps=(2, 6)),
            dataclasses.replace(base, seed=6, dropout=0.2, steps=3, checkpoint_steps=(3,))]
    packed = train_pack(cfgs, src, tiny_model, [tmp_path / f"m{k}" for k in range(3)],
                        progress=False)
    for member, alone in zip(packed, _alone(cfgs, src, tiny_model, tmp_path), strict=True):
        _assert_same_run(member, alone)


def test_a_member_checkpoint_is_its_twins_checkpoint(src, tiny_model, tmp_path):
    """Same model, optimizer state, RNG state and data position; the same training log; and
    ``train(..., resume=True)`` continues a member unpacked to the run that never stopped."""
    cfgs = [TrainConfig(steps=6, batch_size=16, warmup_steps=2, checkpoint_steps=(3,),
                        seed=s, lr=lr) for s, lr in ((1, 1e-3), (2, 2e-3))]
    train_pack(cfgs, src, tiny_model, [tmp_path / "m0", tmp_path / "m1"], progress=False)
    train(cfgs[1], src, tiny_model, tmp_path / "twin", progress=False)
    member_ckpt, twin_ckpt = (d / "checkpoints" / "step-3" for d in (tmp_path / "m1",
                                                                      tmp_path / "twin"))
    for a, b in zip(load_checkpoint(member_ckpt)[0].state_dict().values(),
                    load_checkpoint(twin_ckpt)[0].state_dict().values(), strict=True):
        assert torch.equal(a, b)
    mine, theirs = load_state(member_ckpt), load_state(twin_ckpt)
    assert torch.equal(mine.rng["cpu"], theirs.rng["cpu"])
    assert (mine.step, mine.data, mine.history, mine.window) == \
        (theirs.step, theirs.data, theirs.history, theirs.window)
    for i, s in theirs.optimizer["state"].items():
        for key, value in s.items():
            assert torch.equal(mine.optimizer["state"][i][key], value), (i, key)
    assert mine.optimizer["param_groups"] == theirs.optimizer["param_groups"]
    assert (tmp_path / "m1" / TRAIN_LOG_FILE).read_text() == \
        (tmp_path / "twin" / TRAIN_LOG_FILE).read_text()
    longer = dataclasses.replace(cfgs[1], steps=9, checkpoint_steps=(3, 9))
    continued = train(longer, src, tiny_model, tmp_path / "m1", progress=False, resume=True)
    straight = train(longer, src, tiny_model, tmp_path / "straight", progress=False)
    _assert_same_run(continued, straight)


def test_a_diverging_member_stops_and_the_others_go_on(src, tiny_model, tmp_path):
    base = TrainConfig(algorithm="sgd", steps=8, batch_size=16, warmup_steps=0, log_every=2,
                       checkpoint_steps=(8,), divergence_factor=2.0)
    cfgs = [dataclasses.replace(base, seed=1, lr=0.1),
            dataclasses.replace(base, seed=2, lr=1e4),  # diverges within a few updates
            dataclasses.replace(base, seed=3, lr=0.05)]
    packed = train_pack(cfgs, src, tiny_model, [tmp_path / f"m{k}" for k in range(3)],
                        progress=False)
    with pytest.raises(Diverged) as alone_error:
        train(cfgs[1], src, tiny_model, tmp_path / "alone1", progress=False)
    assert isinstance(packed[1], Diverged)
    assert (packed[1].step, str(packed[1])) == (alone_error.value.step, str(alone_error.value))
    for k in (0, 2):
        _assert_same_run(packed[k], train(cfgs[k], src, tiny_model, tmp_path / f"alone{k}",
                                          progress=False))
    history = [json.loads(line) for line in (tmp_path / "m0" / TRAIN_LOG_FILE).open()]
    assert history[-1]["step"] == 8


@pytest.mark.parametrize("crash", ["after-a-round", "mid-round"])
def test_a_resumed_pack_equals_one_that_never_stopped(crash, src, tiny_model, tmp_path, stop_at):
    """The process dies after member 0's checkpoint 4 has been measured; "mid-round": member 1's
    checkpoint 4 never reached the disk, so member 0 goes back to its checkpoint 2."""
    cfgs = [TrainConfig(steps=8, batch_size=16, warmup_steps=3, checkpoint_steps=(2, 4, 8),
                        log_every=3, seed=s, lr=lr) for s, lr in ((1, 1e-3), (2, 4e-3))]
    straight = train_pack(cfgs, src, tiny_model, [tmp_path / "a0", tmp_path / "a1"],
                          progress=False)
    dirs = [tmp_path / "b0", tmp_path / "b1"]
    with pytest.raises(stop_at.Stopped):
        train_pack(cfgs, src, tiny_model, dirs, progress=False, on_checkpoint=[stop_at(4), None])
    if crash == "mid-round":
        shutil.rmtree(dirs[1] / "checkpoints" / "step-4")
    resumed = train_pack(cfgs, src, tiny_model, dirs, progress=False, resume=True)
    for member, never_stopped in zip(resumed, straight, strict=True):
        _assert_same_run(member, never_stopped)


@pytest.mark.parametrize("change, message", [
    (dict(algorithm="adversarial",
        sections={"adversarial": AdversarialConfig(d1=8, d2=8, pool=64)}),
     "differ in their update"),
    (dict(algorithm="grow", sections={"grow": GrowConfig(steps=(2,), to=("d64-h2-l1-i64",))}),
     "cannot be packed .*shape changes"),
    (dict(batch_size=8), r"differ in train\.batch_size"),
    (dict(algorithm="sgd"), "differ in their optimizer"),
    (dict(mask=0.15), "differ in their masking kind"),
])
def test_what_does_not_pack_is_refused_before_training(change, message, src, tiny_model,
                                                       tmp_path):
    cfgs = [TrainConfig(steps=4, batch_size=16),
            TrainConfig(**{"steps": 4, "batch_size": 16, **change})]
    with pytest.raises(ValueError, match=message):
        train_pack(cfgs, src, tiny_model, [tmp_path / "a", tmp_path / "b"], progress=False)
    assert not (tmp_path / "a").exists()


def test_only_the_post_ln_bert_packs(src, tmp_path):
    cfgs = [TrainConfig(steps=2, batch_size=8, seed=s) for s in (1, 2)]
    for model in ("lstm-h16-l1", "d32-h2-l1-i64-pre"):
        with pytest.raises(ValueError, match="only the post-LN BERT"):
            train_pack(cfgs, src, model, [tmp_path / "a", tmp_path / "b"], progress=False)
