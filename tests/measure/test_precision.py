"""Reduced-precision settings against the fp32 value on the CPU, each within its stated
tolerance (``flatlm.measure.precision``); fp32 is the default and leaves the numbers as they
were."""

import dataclasses

import pytest
import torch

from flatlm.measure.curvature.common import FlatnessConfig
from flatlm.measure.curvature.fisher import trace_fisher
from flatlm.measure.curvature.hessian_trace import trace_hessian
from flatlm.measure.loss import LossConfig, pretrain_loss
from flatlm.measure.precision import computing_in
from flatlm.models import build_model, parse_model
from flatlm.sources import load

FISHER_BF16_RTOL = 0.01  # Tr(F) in bf16: within 1% of fp32 (its s.e. at the defaults: ~2.5%)


@pytest.fixture(scope="module")
def paper():
    src = load("pcfg:paper")
    cfg = dataclasses.replace(parse_model("d32-h2-l2-i64"), dropout=0.0)
    model = build_model(cfg, src.V, src.max_length, seed=0).eval()
    tokens, lengths = src.sample(256, seed=1)
    return src, model, tokens, lengths


def test_fisher_in_bf16_is_within_one_percent_of_fp32(paper):
    _, model, tokens, lengths = paper
    fp32 = FlatnessConfig(n_inputs=256, batch_size=128)
    ref = trace_fisher(model, tokens, lengths, fp32)
    bf16 = trace_fisher(model, tokens, lengths, dataclasses.replace(fp32,
                                                                    fisher_precision="bf16"))
    assert bf16["mean"] == pytest.approx(ref["mean"], rel=FISHER_BF16_RTOL)
    assert bf16["mean"] != ref["mean"]  # bf16 did run: the check can fail


def test_tf32_on_a_cpu_equals_fp32(paper):
    """TF32 is a GPU's matmul mode: on a CPU the numbers are fp32's (the GPU check compares)."""
    src, model, tokens, lengths = paper
    cfg = FlatnessConfig(n_inputs=32, hutchinson_batch_size=16)
    ref = trace_hessian(model, tokens, lengths, cfg)
    tf32 = trace_hessian(model, tokens, lengths, dataclasses.replace(cfg,
                                                                     hessian_precision="tf32"))
    assert tf32["mean"] == ref["mean"]
    loss = pretrain_loss(model, src, tokens[:64], lengths[:64], LossConfig())
    loss_tf32 = pretrain_loss(model, src, tokens[:64], lengths[:64], LossConfig(precision="tf32"))
    assert loss == loss_tf32


def test_settings_outside_a_tolerance_are_refused_by_name():
    with pytest.raises(ValueError, match=r"flatness.hessian_precision='bf16'.*tolerance"):
        FlatnessConfig(hessian_precision="bf16")
    with pytest.raises(ValueError, match=r"loss.precision='bf16'.*tolerance"):
        LossConfig(precision="bf16")
    with pytest.raises(ValueError, match=r"flatness.fisher_precision='fp16'"):
        FlatnessConfig(fisher_precision="fp16")


def test_the_matmul_setting_is_put_back():
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # as a training loop may leave it
    try:
        with computing_in("fp32", "cpu"):
            assert torch.get_float32_matmul_precision() == "highest"
        assert torch.get_float32_matmul_precision() == "high"
        with computing_in("bf16", "cpu"):
            assert torch.get_autocast_dtype("cpu") == torch.bfloat16
            assert torch.is_autocast_enabled("cpu")
        assert not torch.is_autocast_enabled("cpu")
    finally:
        torch.set_float32_matmul_precision(old)
