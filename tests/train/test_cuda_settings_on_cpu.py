"""What a CUDA run switches on by default (torch.compile, bf16 autocast, the fused AdamW kernel,
unpadded micro-batches), forced together on the CPU for every algorithm: the run trains, and
stopping and resuming gives the run that never stopped, bit for bit. Compiled with Dynamo's
``aot_eager`` backend (the graph capture and AOT autograd that inductor also goes through,
without its code generation): inductor's own kernels need a GPU to mean anything."""

import functools
import shutil

import pytest
import torch

from flatlm.train import AdversarialConfig, TrainConfig, algorithms, compiled, growth, train
from flatlm.train import run as loop  # the run (flatlm.train.run) builds optimizer and loss
from flatlm.train.config import GrowConfig, LabelNoiseConfig

N = 2
CUDA_SETTINGS = dict(compile=True, precision="bf16", unpad=True, micro_batch_size=8,
                     batch_size=32, warmup_steps=2, steps=2 * N, checkpoint_steps=(N, 2 * N),
                     seed=3, log_every=2)
CASES = {
    "adamw-rate": dict(algorithm="adamw", mask=0.3, max_predictions=2),
    "sam": dict(algorithm="sam"),
    "adversarial": dict(algorithm="adversarial",
                        sections={"adversarial": AdversarialConfig(d1=16, d2=16, pool=128)}),
    "grow": dict(algorithm="grow",
        sections={"grow": GrowConfig(steps=(N - 1,), to=("d32-h2-l2-i64",))}),
    "label_noise": dict(algorithm="label_noise", sections={"label_noise": LabelNoiseConfig(p=0.2)}),
    "muon": dict(algorithm="muon"),  # its AdamW part fused
    "truth-rate": dict(algorithm="adamw", targets="truth", mask=0.3),  # soft targets, compiled
}



@pytest.fixture
def cuda_defaults(monkeypatch):
    """The fused optimizer and a compiled loss wherever a run builds them, as on CUDA; returns
    the ``fused`` flag of every optimizer built."""
    built, original = [], algorithms.build_optimizer

    def fused_optimizer(cfg, model, **_):
        built.append(True)
        return original(cfg, model, fused=True)

    monkeypatch.setattr(loop, "build_optimizer", fused_optimizer)
    monkeypatch.setattr(growth, "build_optimizer", fused_optimizer)
    monkeypatch.setattr(loop, "loss_function", functools.partial(compiled.loss_function,
                                                                 backend="aot_eager"))
    return built


def copy_at(step, src_dir, dst_dir):
    """A checkpoint hook that copies the run directory as it stands right after checkpoint
    ``step`` is written: what a process killed there leaves on disk, without training the
    first half a second time (each run compiles its loss anew: the compiles dominated)."""
    def hook(s, model, ckpt_dir):
        if s == step:
            shutil.copytree(src_dir, dst_dir)
    return hook


@pytest.mark.parametrize("name", CASES)
def test_cuda_settings_train_and_resume_bit_for_bit(name, src, tiny_model, tmp_path,
                                                    cuda_defaults):
    cfg = TrainConfig(**CUDA_SETTINGS, **CASES[name])
    straight = train(cfg, src, tiny_model, tmp_path / "a", progress=False,
                     on_checkpoint=copy_at(N, tmp_path / "a", tmp_path / "b"))
    assert cuda_defaults  # the fused kernel
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in straight.history)
    assert isinstance(loop.loss_function(cfg, "cpu"), compiled.EagerFallback)
    steps_run = []
    resumed = train(cfg, src, tiny_model, tmp_path / "b", progress=False, resume=True,
                    on_step=steps_run.append)
    assert steps_run[0] == N  # from the copied checkpoint, not afresh
    for (k, a), b in zip(straight.model.state_dict().items(),
                         resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    assert resumed.history == straight.history
