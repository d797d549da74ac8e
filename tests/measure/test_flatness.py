"""Flatness estimators against dense brute force on tiny float64 BERTs.

Exact references come from ``torch.func`` over the flattened selected parameters: the Jacobian of
the word logits J (for Tr(F) = sum_i w_i Tr(J_i^T (diag p_i - p_i p_i^T) J_i), equal to the sum
over every label c of p_c ||grad log p_c||^2) and the dense Hessian of the loss. The population is
a pool of 6 sentences of 1..5 words over 6 words, each sentence equally likely and its masked
word uniform: weight 1 / (6 L) per (sentence, position) pair. Estimators see the pool repeated
and are checked for convergence over a fixed budget and seed (3 standard errors), never on one
draw. The dense-Hessian tests use d8-h2-l1-i16 (858 parameters; a dense Hessian of the d16 model
takes ~15 s here), the others d16-h2-l1-i32 (2858).
"""

import dataclasses

import pytest
import torch
from torch import nn
from torch.func import functional_call, hessian, jacrev

from flatlm.measure import HESSIAN_FISHER_GAP, TRACE_FISHER, TRACE_HESSIAN, se_key
from flatlm.measure.curvature.common import (
    FlatnessConfig,
    grouped_mean_se,
    masked_inputs,
    selected_parameters,
)
from flatlm.measure.curvature.fisher import output_directions, trace_fisher
from flatlm.measure.curvature.flatness import measure_flatness, soft_labels
from flatlm.measure.curvature.hessian_trace import eager_attention, trace_hessian
from flatlm.models import build_model, encode, parse_model, word_logits
from flatlm.models.lstm_unrolled import lstm_encode_unrolled
from flatlm.sources import load
from tests.models.conftest import random_sentences

V, T = 6, 5
POOL = torch.tensor([[0, 1, 2, 3, 4], [5, 4, -1, -1, -1], [2, -1, -1, -1, -1],
                     [3, 3, 1, 0, -1], [1, 5, 2, -1, -1], [4, 0, 5, 1, 2]])
POOL_LENGTHS = (POOL >= 0).sum(1)
NO_EXCLUSION = FlatnessConfig(exclude=())



def tiny_bert(shape: str, seed: int, *, scale: float = 0.3) -> nn.Module:
    """A float64 BERT without dropout, its weights moved off initialisation (peaked predictions,
    heavy-tailed per-example norms) by N(0, scale^2) noise."""
    cfg = dataclasses.replace(parse_model(shape), dropout=0.0)
    model = build_model(cfg, vocab_size=V, max_length=T, seed=seed).double()
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def random_batch(seed: int, n: int):
    return random_sentences(seed, n, V, T)


def pool_pairs():
    """Every (sentence, position) pair of the pool as masked inputs, with population weights."""
    rows = torch.cat([torch.full((int(L),), i) for i, L in enumerate(POOL_LENGTHS)])
    positions = torch.cat([torch.arange(int(L)) for L in POOL_LENGTHS])
    x = masked_inputs(POOL[rows], POOL_LENGTHS[rows], 0, positions=positions)
    weights = 1.0 / (len(POOL) * POOL_LENGTHS[rows].double())
    return x, rows, positions, weights


class Exact:
    """Dense references over the flattened parameters that ``exclude`` keeps."""

    def __init__(self, model: nn.Module, exclude=()):
        self.model = model
        self.params = selected_parameters(model, exclude)
        self.theta = torch.cat([p.detach().flatten() for p in self.params.values()])
        self.x, self.rows, self.positions, self.w = pool_pairs()

    def logits(self, theta: torch.Tensor) -> torch.Tensor:  # (n_pairs, V)
        sizes = [p.numel() for p in self.params.values()]
        values = {name: t.view(p.shape) for (name, p), t in
                  zip(self.params.items(), theta.split(sizes), strict=True)}
        return _call(self.model, values, self.x)

    def probs(self) -> torch.Tensor:
        return self.logits(self.theta).softmax(-1).detach()

    def fisher(self) -> torch.Tensor:  # (P, P)
        J = jacrev(self.logits)(self.theta)  # (n_pairs, V, P)
        p = self.probs()
        A = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
        return torch.einsum("i,ivp,ivw,iwq->pq", self.w, J, A, J)

    def fisher_trace_by_labels(self) -> float:
        """sum_i w_i sum_c p_ic ||grad log p_ic||^2, every label c enumerated."""
        J = jacrev(lambda th: self.logits(th).log_softmax(-1))(self.theta)  # (n_pairs, V, P)
        return float((self.w[:, None] * self.probs() * J.square().sum(-1)).sum())

    def hessian(self, q: torch.Tensor) -> torch.Tensor:  # (P, P) of sum_i w_i sum_c -q log p
        def loss(theta):
            return -(self.w[:, None] * q * self.logits(theta).log_softmax(-1)).sum()

        with eager_attention(self.model):
            return hessian(loss)(self.theta)


def _call(model, values, x):
    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids, mask, pos):
            return word_logits(self.m, ids, mask, pos)

    return functional_call(Wrap(), {f"m.{k}": v for k, v in values.items()},
                           (x.input_ids, x.attention_mask, x.positions))


def replicated_pool(repeats: int):
    return POOL.repeat(repeats, 1), POOL_LENGTHS.repeat(repeats)


# --- fast per-example norms == a per-example backward loop ----------------------------------

@pytest.mark.parametrize("estimator", ["probe", "sampled"])
@pytest.mark.parametrize("exclude", [(), ("*pooler*", "cls.predictions.bias", "bias")],
                         ids=["all-params", "paper-exclusion"])
def test_ghost_norms_equal_per_example_loop(estimator, exclude):
    model = tiny_bert("d16-h2-l1-i32", seed=0)
    tokens, lengths = random_batch(1, 24)  # padding in most rows
    cfg = FlatnessConfig(n_inputs=24, batch_size=10, estimator=estimator, labels_per_input=2,
                         exclude=exclude, seed=3)
    fast = trace_fisher(model, tokens, lengths, cfg, per_example=True, method="ghost")
    slow = trace_fisher(model, tokens, lengths, cfg, per_example=True, method="loop")
    torch.testing.assert_close(fast["per_example"], slow["per_example"], rtol=1e-8, atol=0)
    assert fast["n"] == 24 and model.training  # train mode put back


def test_ghost_norms_with_sdpa_and_float32():
    model = build_model(parse_model("d16-h2-l1-i32"), V, T, seed=1)  # sdpa, float32, dropout
    tokens, lengths = random_batch(2, 12)
    cfg = FlatnessConfig(n_inputs=12, batch_size=12, seed=1)
    fast = trace_fisher(model, tokens, lengths, cfg, per_example=True)
    slow = trace_fisher(model, tokens, lengths, cfg, per_example=True, method="loop")
    torch.testing.assert_close(fast["per_example"], slow["per_example"], rtol=1e-4, atol=0)


def test_exclusion_changes_the_count_and_adds_up():
    model = tiny_bert("d16-h2-l1-i32", seed=2)
    tokens, lengths = random_batch(3, 16)
    bias = model.cls.predictions.bias
    assert bias is model.cls.predictions.decoder.bias  # aliased: one parameter, two names
    total = sum(p.numel() for p in model.parameters())  # tied decoder weight counts once
    default = trace_fisher(model, tokens, lengths, FlatnessConfig(n_inputs=16), per_example=True)
    assert default["n_params"] == total - bias.numel()
    cfgs = [FlatnessConfig(n_inputs=16, exclude=pat) for pat in
            [(), ("bert.encoder.*",), ("bert.embeddings.*", "cls.*")]]
    runs = [trace_fisher(model, tokens, lengths, c, per_example=True) for c in cfgs]
    encoder = sum(p.numel() for n, p in model.named_parameters() if n.startswith("bert.encoder"))
    assert runs[0]["n_params"] == total
    assert runs[1]["n_params"] == total - encoder and runs[2]["n_params"] == encoder
    # same probes (same seed): the per-example squared norm splits over the parameter blocks
    torch.testing.assert_close(runs[1]["per_example"] + runs[2]["per_example"],
                               runs[0]["per_example"], rtol=1e-10, atol=0)


@pytest.mark.parametrize("layers", [1, 2])
def test_lstm_vmap_route_equals_per_example_loop(layers):
    cfg = dataclasses.replace(parse_model(f"lstm-h8-l{layers}"), dropout=0.0)
    model = build_model(cfg, vocab_size=V, max_length=T, seed=layers).double().eval()
    tokens, lengths = random_batch(4, 10)  # padding in most rows
    ids, mask = encode(tokens, lengths)
    torch.testing.assert_close(  # the unrolled LSTM is the packed nn.LSTM on real positions
        lstm_encode_unrolled(model, ids, mask)[mask.bool()],
        model.encode(ids, mask)[mask.bool()], rtol=1e-10, atol=1e-12)
    fc = FlatnessConfig(n_inputs=10, batch_size=6, labels_per_input=2)
    with pytest.raises(TypeError, match="ghost norms need BertForMaskedLM"):
        trace_fisher(model, tokens, lengths, fc, method="ghost")
    auto = trace_fisher(model, tokens, lengths, fc, per_example=True)  # vmap
    loop = trace_fisher(model, tokens, lengths, fc, per_example=True, method="loop")
    torch.testing.assert_close(auto["per_example"], loop["per_example"], rtol=1e-8, atol=0)
    assert auto["n_params"] == sum(p.numel() for p in model.parameters()) - V - 4  # no bias


# --- convergence to the exact traces ----------------------------------------------------------

def test_output_directions_have_the_fisher_covariance():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, V, generator=g, dtype=torch.float64)
    p = logits.softmax(-1)
    target = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    for estimator in ("probe", "sampled"):
        u = output_directions(logits, 200_000, estimator, g)  # (k, 3, V)
        cov = torch.einsum("kbv,kbw->bvw", u, u) / len(u)
        torch.testing.assert_close(cov, target, atol=4e-3, rtol=0)


def test_exact_fisher_trace_two_ways():
    exact = Exact(tiny_bert("d16-h2-l1-i32", seed=5))
    F = exact.fisher()
    assert abs(float(F.trace()) - exact.fisher_trace_by_labels()) < 1e-8 * float(F.trace())


@pytest.mark.parametrize("estimator", ["probe", "sampled"])
def test_trace_fisher_converges(estimator):
    model = tiny_bert("d16-h2-l1-i32", seed=5)
    exact = float(Exact(model, FlatnessConfig().exclude).fisher().trace())
    runs = []
    for repeats in (125, 500):  # 750 and 3000 inputs
        tokens, lengths = replicated_pool(repeats)
        cfg = FlatnessConfig(n_inputs=len(tokens), batch_size=500, estimator=estimator, seed=11)
        runs.append(trace_fisher(model, tokens, lengths, cfg))
    small, large = runs
    assert abs(large["mean"] - exact) < 3 * large["se"], (large, exact)
    assert large["se"] < 0.06 * exact  # not a vacuous interval
    assert 1.4 < small["se"] / large["se"] < 2.8  # ~ sqrt(4): se ~ 1 / sqrt(n)


def test_probe_beats_sampled_labels_on_the_tiny_model():
    """Not a general law: on the paper's PCFG the two are within noise (bench/flatness.py)."""
    model = tiny_bert("d16-h2-l1-i32", seed=5)
    tokens, lengths = replicated_pool(200)
    se = {est: trace_fisher(model, tokens, lengths,
                            FlatnessConfig(n_inputs=1200, batch_size=600, estimator=est))["se"]
          for est in ("probe", "sampled")}
    assert se["probe"] < se["sampled"]


def test_standard_error_covers_the_exact_trace():
    """The default estimator's mean +- 1.96 se covers the dense Tr(F) in 90-99% of 200
    independent estimates of 200 inputs each (sentences drawn from the pool, so the population is
    exactly the one ``Exact`` weighs), and the s.e. is not biased low in the typical sample.
    Per-input values are i.i.d., so disjoint slices of one long run are independent repeats.
    Measured here: 0.935 for the default (8 sampled labels, i.i.d. s.e.; median s.e. / true 0.99);
    the old default (1 probe, 32 batch means) also passes on this light-tailed tiny model (0.945):
    the difference shows on trained BERTs, whose tails are heavy (bench/flatness_se.py)."""
    model = tiny_bert("d16-h2-l1-i32", seed=5)
    cfg = FlatnessConfig(n_inputs=None, batch_size=4000, seed=13)
    exact = float(Exact(model, cfg.exclude).fisher().trace())
    reps, n = 200, 200
    rows = torch.randint(0, len(POOL), (reps * n,), generator=torch.Generator().manual_seed(0))
    values = trace_fisher(model, POOL[rows], POOL_LENGTHS[rows], cfg, per_example=True)
    values = values["per_example"].view(reps, n)
    estimates = [grouped_mean_se(chunk, cfg.se_groups) for chunk in values]
    covered = sum(abs(m - exact) <= 1.96 * se for m, se in estimates) / reps
    assert 0.90 <= covered <= 0.99, covered
    true_se = float(values.std()) / n**0.5
    ratio = torch.tensor([se for _, se in estimates]).median() / true_se
    assert 0.85 < ratio < 1.15, ratio


@pytest.fixture(scope="module")
def small_exact():
    """d8 model, its dense Fisher, dense Hessians with soft labels q and with q = p_theta."""
    model = tiny_bert("d8-h2-l1-i16", seed=7, scale=0.5)
    exact = Exact(model, NO_EXCLUSION.exclude)
    g = torch.Generator().manual_seed(8)
    e = -torch.rand(len(POOL), T, V, generator=g, dtype=torch.float64).log()
    q_table = e / e.sum(-1, keepdim=True)  # (6, T, V) Dirichlet(1) soft labels per pair
    return {"model": model, "exact": exact, "q_table": q_table, "F": exact.fisher(),
            "H_q": exact.hessian(q_table[exact.rows, exact.positions]),
            "H_p": exact.hessian(exact.probs())}


def test_lemma_3_2_hessian_equals_fisher_with_model_labels(small_exact):
    F, H_p = small_exact["F"], small_exact["H_p"]
    assert float((H_p - F).abs().max()) < 1e-8 * float(F.abs().max())
    assert abs(float(H_p.trace() - F.trace())) < 1e-8 * float(F.trace())
    # ... and not with other labels
    assert abs(float(small_exact["H_q"].trace() - F.trace())) > 1e-3 * float(F.trace())


def _hutchinson_inputs(small_exact, repeats, q_of):
    tokens, lengths = replicated_pool(repeats)
    cfg = FlatnessConfig(n_inputs=len(tokens), hutchinson_batch_size=48, hutchinson_probes=4,
                         exclude=(), seed=21)
    positions = masked_inputs(tokens, lengths, cfg.seed).positions
    rows = torch.arange(len(tokens)) % len(POOL)
    return tokens, lengths, cfg, positions, q_of(rows, positions)


def test_hutchinson_with_model_labels_matches_fisher(small_exact):
    model = small_exact["model"]

    def model_probs(rows, positions):
        x = masked_inputs(POOL[rows], POOL_LENGTHS[rows], 0, positions=positions)
        with torch.no_grad():
            return word_logits(model.eval(), x.input_ids, x.attention_mask,
                               x.positions).softmax(-1)

    tokens, lengths, cfg, positions, q = _hutchinson_inputs(small_exact, 256, model_probs)
    est = trace_hessian(model, tokens, lengths, cfg, soft_labels=q, positions=positions,
                        with_gap=True)
    exact = float(small_exact["F"].trace())
    assert abs(est["mean"] - exact) < 3 * est["se"], (est, exact)
    assert est["se"] < 0.25 * exact
    assert abs(est["gap_mean"]) < 1e-10 * exact  # residual sum_k (p_k - q_k) grad^2 z_k = 0


def test_hutchinson_converges_to_the_soft_label_hessian(small_exact):
    model, q_table = small_exact["model"], small_exact["q_table"]
    tokens, lengths, cfg, positions, q = _hutchinson_inputs(
        small_exact, 256, lambda rows, pos: q_table[rows, pos])
    est = trace_hessian(model, tokens, lengths, cfg, soft_labels=q, positions=positions,
                        with_gap=True)
    exact_h = float(small_exact["H_q"].trace())
    exact_gap = exact_h - float(small_exact["F"].trace())
    assert abs(est["mean"] - exact_h) < 3 * est["se"], (est, exact_h)
    assert abs(est["gap_mean"] - exact_gap) < 3 * est["gap_se"], (est, exact_gap)
    assert est["gap_se"] < 0.5 * abs(exact_gap)
    assert model.config._attn_implementation == "sdpa"  # put back after the eager measurement


def test_hutchinson_data_labels(small_exact):
    """soft_labels=None: the one-hot data label (the paper's code and PyHessian)."""
    model, exact = small_exact["model"], small_exact["exact"]
    one_hot = nn.functional.one_hot(POOL[exact.rows, exact.positions], V).double()
    exact_h = float(exact.hessian(one_hot).trace())
    tokens, lengths, cfg, positions, _ = _hutchinson_inputs(small_exact, 128, lambda r, p: None)
    est = trace_hessian(model, tokens, lengths, cfg, positions=positions)
    assert abs(est["mean"] - exact_h) < 3 * est["se"], (est, exact_h)


# --- the metrics dict ----------------------------------------------------------------------

def test_measure_flatness_keys_and_consistency():
    src = load({"kind": "pcfg", "random": {"vocab": 6, "depth": 2, "nonterminals_per_level": 3,
                                           "roots": 2}, "seed": 0})
    model = build_model(dataclasses.replace(parse_model("d16-h2-l1-i32"), dropout=0.0), src.V,
                        src.max_length, seed=0).double()
    tokens, lengths = src.sample(384, seed=1)
    cfg = FlatnessConfig(n_inputs=384, batch_size=128, hutchinson_batch_size=24, seed=2)
    out = measure_flatness(model, src, tokens, lengths, cfg)
    for key in (TRACE_FISHER, TRACE_HESSIAN, HESSIAN_FISHER_GAP):
        assert key in out and se_key(key) in out and out[se_key(key)] > 0
    # the direct gap estimate agrees with the difference of the two estimates
    diff = out[TRACE_HESSIAN] - out[TRACE_FISHER]
    spread = (out[se_key(TRACE_HESSIAN)] ** 2 + out[se_key(TRACE_FISHER)] ** 2
              + out[se_key(HESSIAN_FISHER_GAP)] ** 2) ** 0.5
    assert abs(diff - out[HESSIAN_FISHER_GAP]) < 3 * spread
    q = soft_labels(src, tokens, lengths, masked_inputs(tokens, lengths, cfg.seed).positions)
    torch.testing.assert_close(q.sum(-1), torch.ones(384, dtype=torch.float64))


def test_mean_se_batch_means():
    values = torch.arange(100, dtype=torch.float64)
    mean, se = grouped_mean_se(values, n_groups=4)
    assert mean == pytest.approx(49.5)
    group_means = values.view(4, 25).mean(1)
    assert se == pytest.approx(float(group_means.std() / 2))
    with pytest.raises(ValueError):
        FlatnessConfig(estimator="exact")


def test_tied_cross_term_equals_materialised_gradients():
    """The analytic norm of a tied embedding / decoder weight (Gram terms + 2 <G_emb, G_dec>)
    against summing the materialised per-example gradients, with padding and S > 1."""
    from flatlm.measure.curvature.ghost import _per_example_grad, _shared_sq

    g = torch.Generator().manual_seed(0)
    emb, dec = nn.Embedding(10, 4, padding_idx=0).double(), nn.Linear(4, 10).double()
    dec.weight = emb.weight
    ids = torch.randint(0, 10, (3, 7), generator=g)  # includes padding id 0
    g_e = torch.randn(3, 7, 4, generator=g, dtype=torch.float64)
    a, g_d = (torch.randn(3, 2, n, generator=g, dtype=torch.float64) for n in (4, 10))
    pieces = [(dec, "weight", a, g_d), (emb, "weight", ids, g_e)]
    dense = sum(_per_example_grad(m, k, x, gr) for m, k, x, gr in pieces)  # (3, 10, 4)
    torch.testing.assert_close(_shared_sq(pieces), dense.flatten(1).square().sum(1),
                               rtol=1e-12, atol=0)
