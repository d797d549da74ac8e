"""Data-parallel training (``train.world_size``, two gloo processes on the CPU) is the
one-process run of the same global batch, and resumes as exactly as a one-process run."""

import dataclasses

import pytest
import torch

from flatlm.train import GrowConfig, LabelNoiseConfig, SamConfig, TrainConfig, train
from flatlm.train.distributed import rank_device

# Two ranks sum the gradient in another order than one process: float32 rounding, compounded
# over the steps by Adam's normalisation, stays below this (measured: 2e-8 noreg, 1.2e-7 sam).
ATOL = 1e-6



def _assert_close(a, b, atol):
    for (k, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values(),
                         strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=atol, msg=k)


CASES = {
    # at a rate the two slices hold different numbers of masked words: a mean of the ranks'
    # means would be off; micro-batches accumulate within a rank
    "noreg-rate": dict(algorithm="noreg", mask=0.3, micro_batch_size=4),
    "sam": dict(algorithm="sam", sections={"sam": SamConfig(rho=0.05)}),
    # the fast path's length-sorted, trimmed micro-batches are sliced across the ranks
    "adamw-unpad": dict(algorithm="adamw", dropout=0.0, unpad=True, micro_batch_size=4),
    # targets noised on the whole batch, then sliced; every rank grows alike mid-run
    "label_noise": dict(algorithm="label_noise", dropout=0.0,
        sections={"label_noise": LabelNoiseConfig(p=0.3)}),
    "grow": dict(algorithm="grow", dropout=0.0,
                 sections={"grow": GrowConfig(steps=(3,), to=("d32-h2-l2-i64",))}),
    # soft targets computed on the whole batch, then sliced with its rows; sam's halves too
    "noreg-truth-rate": dict(algorithm="noreg", targets="truth", mask=0.3, micro_batch_size=4),
    "sam-truth": dict(algorithm="sam", targets="truth"),
}


@pytest.mark.parametrize("name", CASES)
def test_two_ranks_equal_one_process_on_the_same_global_batch(name, src, tiny_model, tmp_path):
    cfg = TrainConfig(steps=6, batch_size=16, warmup_steps=2, checkpoint_steps=(6,), seed=3,
                      **CASES[name])
    one = train(cfg, src, tiny_model, tmp_path / "one", progress=False)
    two = train(dataclasses.replace(cfg, world_size=2), src, tiny_model, tmp_path / "two",
                progress=False)
    _assert_close(one, two, ATOL)
    for a, b in zip(one.history, two.history, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-5), k
    assert list(two.checkpoints) == [6]


def test_spawned_ranks_train_as_forked_ones(src, tiny_model, tmp_path, monkeypatch):
    """CUDA's start method (a fresh interpreter per rank), run here on the CPU."""
    import flatlm.train.distributed as distributed

    cfg = TrainConfig(steps=2, batch_size=8, warmup_steps=1, checkpoint_steps=(2,), seed=3,
                      **CASES["noreg-rate"])
    forked = train(dataclasses.replace(cfg, world_size=2), src, tiny_model, tmp_path / "fork",
                   progress=False)
    monkeypatch.setitem(distributed.START_METHOD, "cpu", "spawn")
    spawned = train(dataclasses.replace(cfg, world_size=2), src, tiny_model, tmp_path / "spawn",
                    progress=False)
    _assert_close(forked, spawned, 0.0)


def test_a_two_rank_run_resumes_exactly(src, tiny_model, tmp_path, stop_at):
    """Dropout on: every rank's RNG state travels in the checkpoint rank 0 writes."""
    cfg = TrainConfig(algorithm="adamw", steps=6, batch_size=16, warmup_steps=2, mask=0.3,
                      checkpoint_steps=(3, 6), seed=5, log_every=2, world_size=2)
    straight = train(cfg, src, tiny_model, tmp_path / "a", progress=False)
    with pytest.raises(stop_at.Stopped):
        train(cfg, src, tiny_model, tmp_path / "b", progress=False, on_checkpoint=stop_at(3))
    resumed = train(cfg, src, tiny_model, tmp_path / "b", progress=False, resume=True)
    _assert_close(straight, resumed, 0.0)  # bit for bit
    assert resumed.history == straight.history
    assert list(resumed.checkpoints) == [3, 6]


@pytest.mark.parametrize("fields, message", [
    (dict(world_size=3, batch_size=16), r"train\.world_size=3: .*16 sentences"),
    (dict(world_size=4, batch_size=12, algorithm="sam"), r"train\.world_size=4: .*/ 2 under sam"),
    (dict(world_size=2, algorithm="adversarial"), r"train\.algorithm='adversarial' runs in one"),
    (dict(world_size=0), r"train\.world_size=0: use an integer >= 1"),
])
def test_bad_world_sizes_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**fields)


def test_resuming_on_another_number_of_ranks_is_refused(src, tiny_model, tmp_path):
    cfg = TrainConfig(algorithm="noreg", steps=2, batch_size=8, warmup_steps=1,
                      checkpoint_steps=(1,))
    train(cfg, src, tiny_model, tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"train\.world_size=1 -> 2"):  # before any process
        train(dataclasses.replace(cfg, world_size=2), src, tiny_model, tmp_path, resume=True,
              progress=False)


def test_more_ranks_than_gpus_is_refused_before_any_process_starts(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"train\.world_size=2: .* needs 2 GPUs, this machine "
                                         r"has 1"):
        rank_device(torch.device("cuda"), 0, 2)
    assert rank_device(torch.device("cpu"), 1, 2) == torch.device("cpu")


def test_an_error_in_another_rank_is_raised_in_rank_0():
    """Rank 1 fails (here: a source that does not load) while rank 0 waits in a collective: rank
    0 raises rank 1's error, not a lost connection, and does not wait for a timeout."""
    import torch.distributed as dist

    from flatlm.sources.base import SourceError
    from flatlm.train.distributed import _ranks
    from flatlm.train.registry import algorithm_named

    cfg = TrainConfig(world_size=2, batch_size=8)
    job = {"cfg": cfg, "source": {"kind": "no-such-kind"}, "model_cfg": None, "out_dir": None,
           "device": "cpu", "ckpt": None, "corpus": None,
           "algorithm": algorithm_named(cfg.algorithm), "plugins": ()}
    with pytest.raises(SourceError, match="source kind 'no-such-kind' is unknown"), \
            _ranks(job, 2, torch.device("cpu")):
        dist.barrier()
    assert not dist.is_initialized()


def test_a_two_rank_trial_reports_what_a_one_process_trial_does(tmp_path):
    """Rank 0 measures and reports every checkpoint; no dropout: the same run, so the same
    measurements up to rounding."""
    from flatlm.core.config import apply_overrides
    from flatlm.runs.trial import TrialConfig, run_trial

    def trial(world_size, out):
        cfg = apply_overrides(TrialConfig(), {
            "source": '{"kind":"pcfg","random":{"vocab":12,"depth":2,'
                      '"nonterminals_per_level":3,"roots":2},"seed":0}',
            "model": "d16-h2-l1-i32", "train.algorithm": "noreg", "train.batch_size": 16,
            "train.warmup_steps": 2, "train.steps": 4, "train.checkpoint_steps": [2, 4],
            "train.world_size": world_size, "measure.what": ["loss"], "measure.n_eval": 64})
        seen = []
        rows = run_trial(cfg, out, lambda step, m, d: seen.append(step))
        return rows, seen

    one, _ = trial(1, tmp_path / "one")
    two, seen = trial(2, tmp_path / "two")
    assert seen == [2, 4] == sorted(two)
    for step in (2, 4):
        assert two[step]["pretrain/kl"] == pytest.approx(one[step]["pretrain/kl"], abs=1e-5)
