"""The fast path (``train.unpad``: length-grouped, trimmed micro-batches; ``train.compile``) gives
the plain path's updates: exactly in float64 up to summation order, to 1e-6 in a float32 run, and
a fast run still resumes bit for bit."""

import contextlib
import dataclasses

import pytest
import torch

from flatlm.models import build_model, parse_model
from flatlm.train import TrainConfig, resolve, train
from flatlm.train.algorithms import (
    StepContext,
    accumulate_mlm,
    build_optimizer,
    mlm_loss_sum,
    sam_step,
    standard_step,
)
from flatlm.train.compiled import EagerFallback, loss_function
from flatlm.train.config import switch_on
from flatlm.train.data import StepInputs
from tests.train.conftest import masked_sample

MODELS = ["d16-h2-l1-i32", "d16-h2-l1-i32-pre"]  # post-LN BERT, pre-LN RoBERTa
MASKS = {"one": {}, "rate": {"mask": 0.3, "max_predictions": 3}}


def _float64_model(src, model):
    return build_model(dataclasses.replace(parse_model(model), dropout=0.0), src.V,
                       src.max_length, seed=0).double()


def _context(cfg, model):
    cfg = resolve(cfg)
    return StepContext(cfg=cfg, model=model, optimizer=build_optimizer(cfg, model),
                       autocast=contextlib.nullcontext, mlm_loss=mlm_loss_sum)


def test_grouping_sorts_within_each_pass_and_trimming_cuts_only_padding(paper):
    batch, lengths = masked_sample(paper, 32, seed=1)
    grouped = batch.grouped_by_length(lengths, 16)  # sam's two halves stay apart
    for half in (slice(0, 16), slice(16, 32)):
        rows = sorted(map(tuple, batch.input_ids[half].tolist()))
        assert sorted(map(tuple, grouped.input_ids[half].tolist())) == rows
        assert list(grouped.lengths[half]) == sorted(lengths[half].tolist(), reverse=True)
    widths = []
    for micro in grouped.split(8):
        cut = micro.trimmed()
        width = cut.input_ids.shape[1]
        assert width == max(micro.lengths) + 2 and micro.attention_mask[:, width:].sum() == 0
        widths.append(width)
    assert min(widths) < paper.max_length + 2  # the test below compares a path that trims
    assert batch.trimmed() is batch  # no lengths attached (the plain path): nothing cut


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("model", MODELS)
def test_grouped_trimmed_steps_equal_plain_steps_in_float64(paper, model, mask):
    plain, fast = _float64_model(paper, model), _float64_model(paper, model)
    cfg = TrainConfig(batch_size=32, micro_batch_size=8, lr=1e-2, warmup_steps=0,
                      **MASKS[mask])
    ctx_plain, ctx_fast = _context(cfg, plain), _context(cfg, fast)
    for step in range(3):
        batch, lengths = masked_sample(paper, 32, seed=step, mask=cfg.mask,
                                       max_predictions=cfg.max_predictions)
        loss_plain = standard_step(ctx_plain, StepInputs(batch))["train/loss"]
        loss_fast = standard_step(ctx_fast, StepInputs(batch.grouped_by_length(lengths, 32)))
        # the update's loss read-out is summed in float32
        torch.testing.assert_close(loss_fast["train/loss"], loss_plain, rtol=0, atol=1e-6)
    for (name, a), b in zip(plain.named_parameters(), fast.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-10, msg=name)


def test_sam_groups_each_half_on_its_own(paper):
    plain, fast = (_float64_model(paper, MODELS[0]) for _ in range(2))
    cfg = TrainConfig(algorithm="sam", batch_size=32, micro_batch_size=4, lr=1e-2,
                      warmup_steps=0)
    batch, lengths = masked_sample(paper, 32, seed=3)
    sam_step(_context(cfg, plain), StepInputs(batch))
    sam_step(_context(cfg, fast), StepInputs(batch.grouped_by_length(lengths, 16)))
    for (name, a), b in zip(plain.named_parameters(), fast.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-10, msg=name)


@pytest.mark.parametrize("model", MODELS)
def test_an_unpadded_run_equals_the_plain_run(paper, model, tmp_path):
    """The whole loop (pipeline, float32): noreg has no dropout, so only float order differs."""
    cfg = TrainConfig(algorithm="noreg", steps=5, batch_size=32, micro_batch_size=8,
                      warmup_steps=2, log_every=1, seed=3, unpad=False)
    plain = train(cfg, paper, model, tmp_path / "plain", progress=False)
    fast = train(dataclasses.replace(cfg, unpad=True), paper, model, tmp_path / "fast",
                 progress=False)
    for (name, a), b in zip(plain.model.named_parameters(), fast.model.parameters(),
                            strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6, msg=name)  # seen: 7.5e-9
    for a, b in zip(plain.history, fast.history, strict=True):
        assert b["train/loss"] == pytest.approx(a["train/loss"], abs=1e-6)


def test_an_unpadded_run_resumes_bit_for_bit(paper, tmp_path):
    class StopError(Exception):
        pass

    def stop_at_3(step, model, ckpt_dir):
        if step == 3:
            raise StopError

    cfg = TrainConfig(steps=6, batch_size=32, micro_batch_size=8, warmup_steps=2,
                      checkpoint_steps=(3, 6), seed=5, unpad=True)  # adamw: dropout 0.1
    straight = train(cfg, paper, MODELS[0], tmp_path / "a", progress=False)
    with pytest.raises(StopError):
        train(cfg, paper, MODELS[0], tmp_path / "b", progress=False, on_checkpoint=stop_at_3)
    resumed = train(cfg, paper, MODELS[0], tmp_path / "b", progress=False, resume=True)
    for (name, a), b in zip(straight.model.state_dict().items(),
                            resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert resumed.history == straight.history


def test_switches_read_true_false_auto_and_refuse_anything_else(monkeypatch):
    assert TrainConfig(compile="true", unpad="off").compile is True
    assert TrainConfig(unpad="off").unpad is False
    assert switch_on("auto", "cuda") and not switch_on("auto", "cpu")
    assert switch_on(True, "cpu") and not switch_on(False, "cuda")
    with pytest.raises(ValueError, match=r"train\.unpad='fast'.*true, false or auto"):
        TrainConfig(unpad="fast")
    with pytest.raises(ValueError, match=r"train\.compile=1"):
        TrainConfig(compile=1)
    assert loss_function(TrainConfig(), "cpu") is mlm_loss_sum  # auto: eager on the CPU
    monkeypatch.setattr(torch, "compile", lambda fn, backend: fn)  # importing dynamo takes 3 s
    assert isinstance(loss_function(TrainConfig(compile=True), "cpu"), EagerFallback)


def test_a_compile_failure_falls_back_to_eager_with_one_warning(monkeypatch):
    def broken_compile(fn, backend):
        def compiled(*args):
            raise RuntimeError("no working C++ compiler\nlong traceback")
        return compiled

    monkeypatch.setattr(torch, "compile", broken_compile)
    calls = []
    loss = EagerFallback(lambda x: calls.append(x) or 2 * x)
    with pytest.warns(RuntimeWarning, match="torch.compile failed.*no working C.. compiler"):
        assert loss(3) == 6
    with warnings_as_errors():
        assert loss(4) == 8  # eager from now on, without another warning
    assert calls == [3, 4]


def test_out_of_memory_in_a_compiled_call_is_raised(monkeypatch):
    def oom_compile(fn, backend):
        def compiled(*args):
            raise torch.OutOfMemoryError("CUDA out of memory")
        return compiled

    monkeypatch.setattr(torch, "compile", oom_compile)
    with pytest.raises(torch.OutOfMemoryError):
        EagerFallback(lambda x: x)(1)


@contextlib.contextmanager
def warnings_as_errors():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_a_process_keeps_compiling_past_dynamo_s_recompile_limit(paper):
    """Each run resets Dynamo's cache: without it the ninth shape in one process (a replication
    runner's trials) would run eagerly without a word."""
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    batch, _ = masked_sample(paper, 4, seed=0)
    for width in range(16, 16 + 2 * 10, 2):  # ten runs, ten parameter shapes
        model = build_model(dataclasses.replace(parse_model(f"d{width}-h2-l1-i32"),
                                                dropout=0.0), paper.V, paper.max_length, seed=0)
        loss = loss_function(TrainConfig(compile=True), "cpu", backend=counting)
        assert torch.allclose(loss(model, batch), mlm_loss_sum(model, batch))
    assert len(graphs) >= 10


def test_a_compile_failure_in_the_backward_redoes_the_micro_batch_eagerly(paper):
    from torch._dynamo.backends.common import aot_autograd

    def no_backward(gm, example_inputs):
        raise RuntimeError("inductor: backward lowering failed")

    broken = aot_autograd(fw_compiler=lambda gm, _: gm.forward, bw_compiler=no_backward)
    batch, _ = masked_sample(paper, 8, seed=2)
    grads = []
    for mlm_loss in (mlm_loss_sum, loss_function(TrainConfig(compile=True), "cpu",
                                                 backend=broken)):
        model = _float64_model(paper, "d16-h2-l1-i32")
        ctx = dataclasses.replace(_context(TrainConfig(micro_batch_size=4), model),
                                  mlm_loss=mlm_loss)
        with pytest.warns(RuntimeWarning, match="backward lowering failed") \
                if mlm_loss is not mlm_loss_sum else contextlib.nullcontext():
            accumulate_mlm(ctx, batch)
        grads.append([p.grad.clone() for p in model.parameters()])
        assert getattr(mlm_loss, "compiled", None) is None  # eager from then on
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
