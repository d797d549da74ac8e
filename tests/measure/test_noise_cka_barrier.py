"""Weight-noise sensitivity, linear CKA and the loss barrier against closed forms and brute force:
CKA's invariances, a hand-computed value and the HSIC formula with centring matrices; the
parse features against enumeration of every parse; the noise's mean rise on a quadratic loss
against s^2 / 2 tr(H Sigma); the barrier of a quadratic along a segment; the model put back bit
for bit; and the real paths on tiny BERTs and tiny trials."""

import csv
import math

import numpy as np
import pytest
import torch
from torch import nn

from analysis import barriers
from flatlm.core.config import apply_overrides
from flatlm.measure import LOSS
from flatlm.measure.landscape.barrier import chord, interpolated_state, loss_barrier
from flatlm.measure.landscape.noise import NoiseConfig, noise_deltas, noise_key, weight_noise
from flatlm.measure.loss import LossConfig, loss_terms, pair_truth, per_token_loss, pretrain_loss
from flatlm.measure.probes.probe import ProbeConfig, encoder_probe_features
from flatlm.measure.representations.cka import (
    CKA_TRUTH,
    CKA_TRUTH_RANDOM_INIT,
    CKA_TRUTH_TOKEN,
    CKAConfig,
    check_cka_source,
    checkpoint_cka,
    linear_cka,
    model_features,
    truth_features,
)
from flatlm.measure.run import MeasureConfig, eval_data, measure_model
from flatlm.models import build_model, load_checkpoint, parse_model
from flatlm.runs.trial import TrialConfig, run_trial
from flatlm.sources import load
from flatlm.sources.reference import enumerate_parses

SHAPE = "d16-h1-l1-i32"  # 3.4k parameters on the tiny grammar


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


# ---- linear CKA ---------------------------------------------------------------------------------

def hsic_cka(X: np.ndarray, Y: np.ndarray) -> float:
    """CKA from the HSIC formula with centring matrices, K = X X^T, L = Y Y^T uncentred."""
    n = len(X)
    H = np.eye(n) - np.ones((n, n)) / n
    K, L = X @ X.T, Y @ Y.T

    def hsic(A, B):
        return np.trace(A @ H @ B @ H) / (n - 1) ** 2

    return hsic(K, L) / math.sqrt(hsic(K, K) * hsic(L, L))


@pytest.mark.parametrize(("n", "p", "q"), [(40, 3, 5), (6, 30, 20)])  # feature and Gram side
def test_cka_matches_the_hsic_formula_with_centring_matrices(n, p, q):
    X, Y = randn(n, p, seed=1) + 3.0, randn(n, q, seed=2) @ randn(q, q, seed=3) - 1.0
    Y[:, 0] += X[:, 0]  # some shared signal, so the value is not near 0
    assert linear_cka(X, Y) == pytest.approx(hsic_cka(X.numpy(), Y.numpy()), rel=1e-12)


@pytest.mark.parametrize(("n", "p"), [(40, 6), (5, 12)])
def test_cka_is_one_for_an_orthogonal_transform_and_a_scaling(n, p):
    X = randn(n, p, seed=4)
    Q = torch.linalg.qr(randn(p, p, seed=5))[0]
    assert linear_cka(X, X @ Q) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(X, 3.7 * X) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(X, X.float()) == pytest.approx(1.0, abs=1e-6)  # float32 features too
    assert math.isnan(linear_cka(X, torch.ones(n, 2)))  # a constant side: undefined


def test_cka_of_a_hand_computed_example():
    """Centred X = [e1, e2, -e1, -e2]: X^T X = 2 I, ||.||_F = 2 sqrt 2. Y's first column
    (6, 6, 4, 4) centres to (1, 1, -1, -1), its second is constant (centres to 0): Y^T Y =
    diag(4, 0), ||.|| = 4; Y^T X = [[2, 2], [0, 0]], ||.||^2 = 8. CKA = 8 / (8 sqrt 2)."""
    X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
    Y = torch.tensor([[6.0, 3.0], [6.0, 3.0], [4.0, 3.0], [4.0, 3.0]])
    assert linear_cka(X, Y) == pytest.approx(1 / math.sqrt(2), rel=1e-15)
    with pytest.raises(ValueError, match="same n inputs"):
        linear_cka(X, Y[:3])


def test_parse_features_are_the_expected_constituent_counts_of_every_parse(src):
    """f(t, A) = E[#constituents labelled A over word t | x], by enumerating every parse."""
    tokens, lengths = src.sample(8, 3)
    got = src.latent_posteriors(tokens, lengths)
    g = src.grammar
    for b in range(len(tokens)):
        L = int(lengths[b])
        parses = enumerate_parses(g, tokens[b, :L].tolist())
        total = sum(p for p, _ in parses)
        want = np.zeros((tokens.shape[1], g.N))
        for p, spans in parses:
            for A, i, j in spans:
                want[i:j, A] += p / total
        np.testing.assert_allclose(got[b].numpy(), want, rtol=0, atol=1e-13)
    flat = truth_features(src, tokens, lengths, "cpu")[0]
    assert flat.shape == (8, tokens.shape[1] * g.N)


def tiny_model(src, seed=0):
    return build_model(parse_model(SHAPE), src.V, src.max_length, seed=seed).double()


def test_cka_truth_measures_the_probe_features_against_the_parse(src):
    cfg = apply_overrides(MeasureConfig(), {"what": ["cka_truth"], "n_eval": 8,
                                            "n_downstream": 30, "cka.n_inputs": 24})
    shape = parse_model(SHAPE)
    data = eval_data(src, cfg, shape)
    model = build_model(shape, src.V, src.max_length, seed=7)
    out = measure_model(model, src, data, cfg, "cpu")
    tokens, lengths = data.downstream_tokens[:24], data.downstream_lengths[:24]
    sentence, token = model_features(model, tokens, lengths, cfg.probe, "cpu")
    # the probe's own features, and every real word's state
    assert torch.equal(sentence, encoder_probe_features(model, tokens, lengths))
    assert token.shape == (int(lengths.sum()), 16)
    truth_sentence, truth_token = truth_features(src, tokens, lengths, "cpu")
    assert torch.equal(truth_token, src.latent_posteriors(tokens, lengths)[
        torch.arange(tokens.shape[1]) < lengths[:, None]])
    assert out[CKA_TRUTH] == linear_cka(sentence, truth_sentence)
    assert out[CKA_TRUTH_TOKEN] == linear_cka(token, truth_token)
    for key in (CKA_TRUTH, CKA_TRUTH_TOKEN, CKA_TRUTH_RANDOM_INIT,
                CKA_TRUTH_TOKEN + "_random_init"):
        assert 0 < out[key] < 1, key
    assert out[CKA_TRUTH_RANDOM_INIT] != out[CKA_TRUTH]  # another model
    assert "cka_truth" in data.cache  # the truth's features: once per trial
    assert measure_model(model, src, data, cfg, "cpu")[CKA_TRUTH] == out[CKA_TRUTH]
    # two checkpoints: a model against itself is 1 at both levels
    same = checkpoint_cka(model, model, tokens, lengths, ProbeConfig(), "cpu")
    assert same == pytest.approx({"sentence": 1.0, "token": 1.0}, abs=1e-12)


def test_hmm_states_are_the_truth_features_of_an_hmm():
    hmm = load("hmm:seed=3,vocab=20,states=10")
    tokens, lengths = hmm.sample(5, 0)
    sentence, token = truth_features(hmm, tokens, lengths, "cpu")
    assert torch.equal(sentence, hmm.posteriors(tokens, lengths).flatten(1))
    assert token.shape == (int(lengths.sum()), 10)


def test_cka_truth_refuses_a_source_without_a_hidden_structure():
    with pytest.raises(ValueError, match="'cka_truth' needs a source with a posterior.*drop"):
        check_cka_source(load("dyck:4"))
    check_cka_source(type("Text", (), {"has_truth": False})())  # skipped, as needs_truth


# ---- weight noise -------------------------------------------------------------------------------

@pytest.mark.parametrize("slope", [0.0, 1.0])  # at the minimum, and off it
def test_noise_on_a_quadratic_matches_half_trace_of_h_sigma(slope):
    """L(w) = g.v + 1/2 v^T H v, v = w - w*: E[L(w + delta)] - L(w) = s^2 / 2 tr(H Sigma), Sigma
    = diag(RMS(W_k)^2) per tensor k, for any g (the linear term averages out; it only adds
    variance)."""
    w1 = nn.Parameter(randn(3, seed=6) + 1.0)
    w2 = nn.Parameter(randn(2, 2, seed=7) * 3.0)
    star = torch.cat([w1.detach().flatten(), w2.detach().flatten()]) - 0.3 * slope
    B = randn(7, 7, seed=8)
    H = B @ B.T / 7 + torch.eye(7)
    g = slope * randn(7, seed=9)

    def loss():
        v = torch.cat([w1.flatten(), w2.flatten()]) - star
        return float(g @ v + 0.5 * v @ H @ v)

    rms2 = torch.cat([torch.full((3,), float(w1.detach().square().mean())),
                      torch.full((4,), float(w2.detach().square().mean()))])
    scales, draws = (0.01, 0.1), 4000
    before = [w1.detach().clone(), w2.detach().clone()]
    deltas = noise_deltas(loss, [w1, w2], scales, draws, seed=0)
    for s in scales:
        want = s**2 / 2 * float((torch.diagonal(H) * rms2).sum())
        mean, se = deltas[s].mean(), deltas[s].std(ddof=1) / math.sqrt(draws)
        assert abs(mean - want) < 3 * se, (s, mean, want, se)
    assert torch.equal(w1.detach(), before[0]) and torch.equal(w2.detach(), before[1])
    again = noise_deltas(loss, [w1, w2], scales, draws=5, seed=0)
    assert all(np.array_equal(again[s], deltas[s][:5]) for s in scales)  # seeded per draw


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_noise_puts_the_model_back_bit_for_bit_also_after_an_error(src):
    model = tiny_model(src)
    tokens, lengths = src.sample(16, 1)
    before = state(model)
    cfg = NoiseConfig(scales=(0.01, 0.1), draws=3, n_inputs=12, seed=5)
    out = weight_noise(model, src, tokens, lengths, cfg, LossConfig(), "cpu")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert set(out) == {noise_key(0.01), noise_key(0.01) + "_se", noise_key(0.1),
                        noise_key(0.1) + "_se"}
    assert out == weight_noise(model, src, tokens, lengths, cfg, LossConfig(), "cpu")
    params = list(model.parameters())
    calls = []

    def failing():
        calls.append(1)
        if len(calls) == 3:  # mid-way, the weights perturbed
            raise RuntimeError("boom")
        return 0.0

    with pytest.raises(RuntimeError, match="boom"):
        noise_deltas(failing, params, (0.5,), draws=4, seed=0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_noise_loss_is_the_pretrain_loss_with_the_truth_inferred_once(src):
    model = tiny_model(src, seed=2)
    tokens, lengths = src.sample(20, 4)
    for cfg in (LossConfig(batch_size=7), LossConfig(positions="all", batch_size=16)):
        truth = pair_truth(src, tokens, lengths, cfg, device="cpu")
        given = loss_terms(model, src, tokens, lengths, cfg, truth=truth)
        computed = loss_terms(model, src, tokens, lengths, cfg)
        assert all(torch.equal(given[k], computed[k]) for k in computed)
        assert per_token_loss(model, src, tokens, lengths, cfg, truth=truth) == \
            pretrain_loss(model, src, tokens, lengths, cfg)[LOSS]


def test_noise_is_a_registered_measurement_on_the_validation_sentences(src):
    cfg = apply_overrides(MeasureConfig(), {"what": ["noise"], "n_eval": 10, "n_downstream": 10,
                                            "noise.scales": [0.05], "noise.draws": 2})
    model = tiny_model(src).float()
    data = eval_data(src, cfg)
    out = measure_model(model, src, data, cfg, "cpu")
    assert out[noise_key(0.05)] == weight_noise(model, src, data.tokens, data.lengths, cfg.noise,
                                                cfg.loss, "cpu")[noise_key(0.05)]
    assert out["time/noise_s"] > 0


@pytest.mark.parametrize(("override", "field"), [
    ({"noise.scales": []}, "noise.scales"), ({"noise.scales": [0.1, -1.0]}, "noise.scales"),
    ({"noise.scales": [0.1, 0.1]}, "noise.scales"), ({"noise.draws": 1}, "noise.draws"),
    ({"noise.n_inputs": 0}, "noise.n_inputs"), ({"cka.n_inputs": 1}, "cka.n_inputs")])
def test_a_bad_setting_is_an_error_naming_the_field(override, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        apply_overrides(MeasureConfig(), override)
    with pytest.raises(ValueError, match="noise.exclude"):
        NoiseConfig(exclude="bias")
    with pytest.raises(ValueError, match="narrow its patterns"):
        noise_deltas(lambda: 0.0, [], (0.1,), 2, 0)
    assert CKAConfig().n_inputs is None and NoiseConfig().scales == (0.01, 0.03, 0.1)


# ---- loss barrier -------------------------------------------------------------------------------

class Point(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.w = nn.Parameter(w.clone())
        self.register_buffer("ids", torch.arange(3))  # an integer entry: must agree


def quadratic(A):
    return lambda m: float(0.5 * m.w.detach() @ A @ m.w.detach())


def test_barrier_is_zero_between_identical_endpoints():
    a = Point(randn(4, seed=10))
    A = randn(4, 4, seed=11)
    result = loss_barrier(a, Point(a.w.detach()), quadratic(A + A.T), points=7)
    assert result.barrier == 0.0 and set(result.rise) == {0.0} and len(result.t) == 7


def test_the_path_and_the_chord_are_exact_at_the_ends_and_between_equal_endpoints():
    """Bit for bit: the path is a at t = 0, b at t = 1 and a everywhere when b == a; the chord
    is L(a), L(b) at the ends and constant between equal losses ((1 - t) a + t b is not: it
    puts identical endpoints a few ulps apart, and an exact-zero barrier then depends on the
    CPU's rounding)."""
    a, b = {"w": randn(64, seed=20), "n": torch.tensor(3)}, {"w": randn(64, seed=21),
                                                             "n": torch.tensor(3)}
    assert torch.equal(interpolated_state(a, b, 0.0)["w"], a["w"])
    assert torch.equal(interpolated_state(a, b, 1.0)["w"], b["w"])
    same = {"w": a["w"].clone(), "n": a["n"]}
    ts = np.linspace(0.0, 1.0, 13)
    for t in ts:
        assert torch.equal(interpolated_state(a, same, float(t))["w"], a["w"])
    assert torch.allclose(interpolated_state(a, b, 0.3)["w"], 0.7 * a["w"] + 0.3 * b["w"],
                          rtol=0, atol=1e-15)
    assert set(chord(-1.946347784237273, -1.946347784237273, ts)) == {-1.946347784237273}
    ends = chord(0.1, 0.7, ts)
    assert (ends[0], ends[-1]) == (0.1, 0.7)
    assert ends == pytest.approx(0.1 + 0.6 * ts, abs=1e-15)


def test_barrier_of_a_quadratic_is_its_closed_form_along_the_segment():
    """L(t) - chord = -t (1 - t) / 2 d^T A d, d = a - b: across a ridge (d^T A d < 0) the
    barrier -1/8 d^T A d at t = 1/2; in a bowl (A > 0) 0, at the ends."""
    a, b = Point(randn(4, seed=12)), Point(randn(4, seed=13))
    d = a.w.detach() - b.w.detach()
    ridge = -(torch.outer(d, d) + 0.1 * torch.eye(4, dtype=torch.float64))  # d^T A d < 0
    dAd = float(d @ ridge @ d)
    result = loss_barrier(a, b, quadratic(ridge), points=11)
    assert result.barrier == pytest.approx(-dAd / 8, rel=1e-12) and result.t_max == 0.5
    want = [-t * (1 - t) / 2 * dAd for t in result.t]
    np.testing.assert_allclose(result.rise, want, rtol=1e-11, atol=1e-13)
    bowl = loss_barrier(a, b, quadratic(torch.eye(4, dtype=torch.float64) + 0.5), points=11)
    assert bowl.barrier == 0.0 and bowl.t_max in (0.0, 1.0)
    assert torch.equal(a.w.detach(), randn(4, seed=12))  # the endpoints are left as they were
    other = Point(randn(4, seed=12))
    other.ids += 1
    with pytest.raises(ValueError, match="integer entry ids differs"):
        loss_barrier(a, other, quadratic(ridge))
    with pytest.raises(ValueError, match="points=2"):
        loss_barrier(a, b, quadratic(ridge), points=2)


TINY_TRIAL = {
    "source": '{"kind":"pcfg","random":{"vocab":12,"depth":2,"nonterminals_per_level":3,'
              '"roots":2},"seed":0}',
    "model": SHAPE, "train.batch_size": 16, "train.warmup_steps": 2, "train.steps": 4,
    "train.checkpoint_steps": [2, 4], "measure.what": ["loss", "noise", "cka_truth"],
    "measure.n_eval": 32, "measure.n_downstream": 20, "measure.tasks": ["B"],
    "measure.noise.draws": 2, "measure.noise.n_inputs": 16,
}


def test_barriers_between_two_tiny_trained_berts_end_to_end(tmp_path):
    root = tmp_path / "trials"
    for seed in (0, 1):
        rows = run_trial(apply_overrides(TrialConfig(), {**TINY_TRIAL, "train.seed": seed}),
                         root / "paper" / "seeds" / f"seed{seed}")
        for key in (noise_key(0.1), CKA_TRUTH, CKA_TRUTH_TOKEN, CKA_TRUTH_RANDOM_INIT):
            assert all(math.isfinite(rows[step][key]) for step in (2, 4)), key
    out = tmp_path / "barriers.csv"
    assert barriers.main(["--trials", str(root), "--out", str(out), "--kl-tol", "10",
                          "--n-eval", "24", "--points", "5"]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 1 and rows[0]["run_a"] == "paper/seeds/seed0"
    row = rows[0]
    assert float(row["barrier"]) >= 0 and math.isfinite(float(row["barrier"]))
    runs = barriers.final_runs(root)
    src = load(runs.loc[0, "source"])
    tokens, lengths = src.sample_validation(24, 0)
    model_a = load_checkpoint(runs.loc[0, "checkpoint"])[0]
    assert float(row["loss_a"]) == pytest.approx(
        pretrain_loss(model_a, src, tokens, lengths, LossConfig())[LOSS], rel=1e-12)
    assert runs["end"].nunique() == 2  # the seeds end at other KLs: none within 0
    assert barriers.main(["--trials", str(root), "--out", str(out), "--kl-tol", "0"]) == 1
