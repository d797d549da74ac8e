"""The measurements on a pre-LN BERT: ghost norms against the per-example loop, Hutchinson against
the exact Fisher (labels from the model), the default exclusion, pre-training loss and the probe."""


import pytest
import torch
from torch import nn

from flatlm.measure import ENTROPY, KL, LOSS
from flatlm.measure.curvature import ghost
from flatlm.measure.curvature.common import FlatnessConfig, masked_inputs, selected_parameters
from flatlm.measure.curvature.fisher import trace_fisher
from flatlm.measure.curvature.hessian_trace import trace_hessian
from flatlm.measure.loss import LossConfig, pretrain_loss
from flatlm.measure.probes.probe import ProbeConfig, probe
from flatlm.models import build_model, parse_model, word_logits
from tests.measure.test_flatness import V, random_batch, tiny_bert  # noqa: E402

SHAPE = "d16-h2-l2-i32-pre"


def tiny_pre_ln(seed: int, scale: float = 0.3) -> nn.Module:
    """A float64 pre-LN BERT without dropout, weights moved off initialisation."""
    return tiny_bert(SHAPE, seed, scale=scale)


@pytest.mark.parametrize("exclude", [(), FlatnessConfig().exclude],
                         ids=["all-params", "default-exclusion"])
def test_ghost_norms_equal_per_example_loop(exclude):
    model = tiny_pre_ln(seed=0)
    assert ghost.supports(model)
    tokens, lengths = random_batch(1, 20)  # padding in most rows
    cfg = FlatnessConfig(n_inputs=20, batch_size=8, labels_per_input=2, exclude=exclude, seed=3)
    fast = trace_fisher(model, tokens, lengths, cfg, per_example=True)  # auto: ghost
    slow = trace_fisher(model, tokens, lengths, cfg, per_example=True, method="loop")
    torch.testing.assert_close(fast["per_example"], slow["per_example"], rtol=1e-6, atol=0)
    assert fast["n"] == 20 and model.training  # train mode put back


def test_default_exclusion_leaves_out_the_output_bias():
    model = tiny_pre_ln(seed=1)
    names = list(selected_parameters(model, FlatnessConfig().exclude))
    total = sum(p.numel() for p in model.parameters())
    assert "lm_head.bias" not in names and "lm_head.decoder.bias" not in names
    kept = sum(p.numel() for p in selected_parameters(model, FlatnessConfig().exclude).values())
    assert kept == total - (V + 4)


def _exact_fisher_trace(model, x) -> float:
    """sum_i sum_c p_c ||grad log p_c(x_i)||^2 over all parameters, one backward per label."""
    params = list(model.parameters())
    total = 0.0
    model.eval()
    for i in range(len(x)):
        z = word_logits(model, x.input_ids[i : i + 1], x.attention_mask[i : i + 1],
                        x.positions[i : i + 1])[0]
        log_p = z.log_softmax(-1)
        for c in range(V):
            grads = torch.autograd.grad(log_p[c], params, retain_graph=True, allow_unused=True)
            sq = sum(float(g.square().sum()) for g in grads if g is not None)
            total += log_p[c].exp().item() * sq
    return total


def test_hutchinson_with_model_labels_matches_the_exact_fisher():
    model = tiny_pre_ln(seed=2)
    tokens, lengths = random_batch(2, 4)
    tokens, lengths = tokens.repeat(24, 1), lengths.repeat(24)  # 24 batches of the same 4 inputs
    cfg = FlatnessConfig(n_inputs=len(tokens), hutchinson_batch_size=4, hutchinson_probes=4,
                         exclude=(), seed=5)
    x = masked_inputs(tokens, lengths, cfg.seed)
    with torch.no_grad():
        q = word_logits(model.eval(), x.input_ids, x.attention_mask, x.positions).softmax(-1)
    exact = _exact_fisher_trace(model, x.batch(0, 4, "cpu")) / 4  # per input
    model.train()
    est = trace_hessian(model, tokens, lengths, cfg, soft_labels=q, positions=x.positions,
                        with_gap=True)
    assert abs(est["mean"] - exact) < 3 * est["se"], (est, exact)
    assert est["se"] < 0.3 * exact
    assert abs(est["gap_mean"]) < 1e-10 * exact  # H = F with labels from the model (Lemma 3.2)
    assert model.config._attn_implementation == "sdpa" and model.training  # put back


def test_pretrain_loss_and_probe_run(src):
    model = build_model(parse_model("d16-h2-l1-i32-pre"), src.V, src.max_length, seed=0)
    tokens, lengths = src.sample(60, seed=1)
    out = pretrain_loss(model, src, tokens, lengths, LossConfig(batch_size=25, seed=2))
    assert abs(out[LOSS] - out[ENTROPY] - out[KL]) < 1e-6 and out[KL] > 0
    labels = src.labels(tokens, lengths, "A")
    cfg = ProbeConfig(epochs=3, seeds=2, batch_size=32)
    result = probe(model, src, tokens, lengths, labels, "A", cfg)
    assert 0.0 <= result["probe/A/acc_mean"] <= 1.0
    assert result == probe(model, src, tokens, lengths, labels, "A", cfg)
