"""Curvature beyond the trace (``measure.spectrum``, ``measure.blocks``) against dense float64
brute force on a tiny BERT.

The population is the 20 (sentence, position) pairs of ``test_flatness``'s pool, each equally
likely, with Dirichlet soft labels. The dense Hessian is central differences of autograd
gradients (first derivatives only), the dense Fisher J^T (diag p - p p^T) J from ``jacrev`` of
the logits: both independent of the double backward under test. (``torch.func.hessian`` of
these models disagrees with finite differences here when the labels are not the model's own:
not used.) To keep the dense Hessian cheap, only 36 parameters in three blocks count
(``FlatnessConfig.exclude`` leaves out the rest), d4-h1-l1-i8.
"""

import dataclasses
import fnmatch
import json
from types import SimpleNamespace

import pytest
import torch
from torch.func import jacrev

from flatlm.measure import (  # noqa: E402
    SLQ_NEGATIVE_TRACE,
    SLQ_TRACE_HESSIAN,
    TOP_EIG_FISHER,
    TOP_EIG_HESSIAN,
    TRACE_HESSIAN,
    block_key,
    se_key,
    sharpness_worst_key,
)
from flatlm.measure.curvature.blocks import block_of, block_order, block_traces  # noqa: E402
from flatlm.measure.curvature.common import (  # noqa: E402
    FlatnessConfig,
    masked_inputs,
    selected_parameters,
)
from flatlm.measure.curvature.hessian_trace import trace_hessian  # noqa: E402
from flatlm.measure.curvature.hvp import CurvatureOperator, flatten  # noqa: E402
from flatlm.measure.curvature.lanczos import lanczos, quadrature, ritz_values  # noqa: E402
from flatlm.measure.curvature.spectrum import (  # noqa: E402
    Sketch,
    SpectrumConfig,
    slq,
    slq_metrics,
    top_eigenvalue,
    write_density,
)
from tests.measure.test_flatness import POOL, POOL_LENGTHS, Exact, T, V, pool_pairs, tiny_bert  # noqa: E402

KEEP = ("bert.embeddings.LayerNorm.*", "bert.encoder.layer.0.attention.output.dense.*",
        "cls.predictions.transform.LayerNorm.*")


def excluding_all_but(model, keep) -> tuple[str, ...]:
    return tuple(n for n, _ in model.named_parameters()
                 if not any(fnmatch.fnmatchcase(n, k) for k in keep))


def fd_hessian(op: CurvatureOperator, eps: float = 1e-5) -> torch.Tensor:
    """Central differences of the mean gradient over ``op``'s inputs, column by column."""
    flat = flatten([p.detach() for p in op.params]).clone()

    def grad_at(theta):
        with torch.no_grad():
            for p, t in zip(op.params, theta.split([p.numel() for p in op.params]), strict=True):
                p.copy_(t.view_as(p))
        return sum(flatten(op.batch_grads(a, b)).detach() for a, b in op.spans()) / len(op.x)

    with op.ready():
        cols = [(grad_at(flat + eps * e) - grad_at(flat - eps * e)) / (2 * eps)
                for e in torch.eye(len(flat), dtype=flat.dtype)]
        grad_at(flat)  # parameters back
    H = torch.stack(cols)
    return (H + H.T) / 2


@pytest.fixture(scope="module")
def tiny():
    model = tiny_bert("d4-h1-l1-i8", seed=7, scale=0.5)
    exclude = excluding_all_but(model, KEEP)
    named = selected_parameters(model, exclude)
    params = list(named.values())
    x, rows, positions, _ = pool_pairs()
    g = torch.Generator().manual_seed(8)
    e = -torch.rand(len(POOL), T, V, generator=g, dtype=torch.float64).log()
    q_table = e / e.sum(-1, keepdim=True)  # (6, T, V) Dirichlet(1) soft labels per pair
    q = q_table[rows, positions]
    op = CurvatureOperator(model, params, x, q, 20, "cpu")
    exact = Exact(model, exclude)
    J = jacrev(exact.logits)(exact.theta)  # (20, V, P)
    p = exact.probs()
    A = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    F = torch.einsum("ivp,ivw,iwq->pq", J, A, J) / len(p)
    return SimpleNamespace(model=model, exclude=exclude, names=list(named), params=params,
                           rows=rows, positions=positions, q_table=q_table, op=op,
                           H=fd_hessian(op), F=F.detach())


def sampled(tiny, n: int, seed: int):
    """n pairs drawn uniformly from the 20 (so the population is the dense one): tokens,
    lengths, positions, soft labels."""
    pick = torch.randint(0, len(tiny.rows), (n,), generator=torch.Generator().manual_seed(seed))
    rows, positions = tiny.rows[pick], tiny.positions[pick]
    return POOL[rows], POOL_LENGTHS[rows], positions, tiny.q_table[rows, positions]


def operator(tiny, n, seed, batch_size, fisher=False) -> CurvatureOperator:
    tokens, lengths, positions, q = sampled(tiny, n, seed)
    x = masked_inputs(tokens, lengths, 0, positions=positions)
    return CurvatureOperator(tiny.model, tiny.params, x, q, batch_size, "cpu", fisher=fisher)


# --- the products and the exact top eigenvalues -----------------------------------------------

def test_products_equal_the_dense_matrices(tiny):
    g = torch.Generator().manual_seed(0)
    v = torch.randn(tiny.op.n_params, generator=g, dtype=torch.float64)
    fisher = CurvatureOperator(tiny.model, tiny.params, tiny.op.x, None, 7, "cpu", fisher=True)
    with tiny.op.ready():
        torch.testing.assert_close(tiny.op.matvec(v), tiny.H @ v, rtol=1e-6, atol=1e-8)
        torch.testing.assert_close(fisher.matvec(v), tiny.F @ v, rtol=1e-10, atol=1e-12)
    assert float(torch.linalg.eigvalsh(tiny.H)[0]) < 0  # indefinite: not the Fisher
    assert tiny.model.config._attn_implementation == "sdpa"  # put back


@pytest.mark.parametrize("which", ["H", "F"])
def test_top_eigenvalue_on_the_population_is_exact(tiny, which):
    op = tiny.op if which == "H" else CurvatureOperator(
        tiny.model, tiny.params, tiny.op.x, None, 5, "cpu", fisher=True)  # 4 batches
    top = top_eigenvalue(op, steps=12, seed=1)
    exact = float(torch.linalg.eigvalsh(getattr(tiny, which))[-1])
    assert top["value"] == pytest.approx(exact, rel=1e-7)
    vec = torch.linalg.eigh(getattr(tiny, which)).eigenvectors[:, -1]
    assert abs(float(top["vector"] @ vec)) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("fisher", [False, True], ids=["hessian", "fisher"])
def test_top_eigenvalue_converges_within_its_standard_error(tiny, fisher):
    """Sampled inputs (240, 15 batches): the estimate is within 3 s.e. of the dense value and
    the s.e. is not vacuous."""
    top = top_eigenvalue(operator(tiny, 240, seed=3, batch_size=16, fisher=fisher), 10, seed=2)
    exact = float(torch.linalg.eigvalsh(tiny.F if fisher else tiny.H)[-1])
    assert abs(top["value"] - exact) < 3 * top["se"], (top["value"], top["se"], exact)
    assert 0 < top["se"] < 0.15 * exact
    assert top["n_batches"] == 15


# --- stochastic Lanczos quadrature ----------------------------------------------------------

def test_lanczos_quadrature_is_gauss_quadrature(tiny):
    """m steps integrate every polynomial of degree <= 2m - 1 exactly against the probe's
    spectral measure; a full Krylov space recovers the eigenvalues."""
    H = tiny.H
    v = torch.randn(len(H), generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    theta, tau = quadrature(lanczos(lambda u: H @ u, v, 5))
    power = v.clone()
    for r in range(10):
        exact = float(v @ power) / float(v @ v)  # v^T H^r v / v^T v
        assert float((tau * theta**r).sum()) == pytest.approx(exact, rel=1e-9, abs=1e-12), r
        power = H @ power
    # a full Krylov space integrates any f: the negative part's trace, v^T min(H, 0) v
    sign = torch.randint(0, 2, (len(H),), generator=torch.Generator().manual_seed(6)) * 2 - 1.0
    theta, tau = quadrature(lanczos(lambda u: H @ u, sign.double(), len(H)))
    sketch = Sketch(theta[None], tau[None], len(H))
    lam, U = torch.linalg.eigh(H)
    negative = float(sign.double() @ U @ torch.diag(lam.clamp(max=0)) @ U.T @ sign.double())
    assert slq_metrics(sketch)[SLQ_NEGATIVE_TRACE] == pytest.approx(negative, rel=1e-8)
    A = torch.randn(12, 12, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    A = A + A.T
    full = ritz_values(lanczos(lambda u: A @ u, torch.ones(12, dtype=torch.float64), 12))
    torch.testing.assert_close(torch.tensor(full, dtype=A.dtype), torch.linalg.eigvalsh(A),
                               rtol=0, atol=1e-10)


def test_slq_trace_converges_and_the_density_is_written(tiny, tmp_path):
    op = operator(tiny, 320, seed=6, batch_size=20)
    cfg = SpectrumConfig(slq_probes=32, slq_steps=4, n_inputs=320)
    sketch = slq(op, cfg.slq_probes, cfg.slq_steps, seed=7)
    out = slq_metrics(sketch)
    exact = float(tiny.H.trace())
    assert abs(out[SLQ_TRACE_HESSIAN] - exact) < 3 * out[se_key(SLQ_TRACE_HESSIAN)], (out, exact)
    # not vacuous: the probes alone give sqrt(2 / probes) ||H||_F = 0.25 ||H||_F
    assert out[se_key(SLQ_TRACE_HESSIAN)] < 0.6 * float(tiny.H.norm())  # + data noise
    grid, phi = sketch.density(cfg.grid_points, cfg.kernel_width)
    assert float(torch.trapezoid(phi, grid)) == pytest.approx(1.0, abs=1e-6)
    mean = float(torch.trapezoid(grid * phi, grid))  # the smoothing keeps the first moment
    span = float(grid[-1] - grid[0])
    assert abs(mean * sketch.n_params - out[SLQ_TRACE_HESSIAN]) < 1e-6 * span * sketch.n_params
    path = write_density(sketch, cfg, tmp_path, {"n_inputs": 320})
    written = json.loads(path.read_text())
    assert len(written["density"]) == cfg.grid_points and len(written["nodes"]) == 32
    assert path.with_suffix(".png").stat().st_size > 0


# --- Tr(H) per block --------------------------------------------------------------------------

def test_block_traces_converge_and_split_the_hutchinson_trace(tiny):
    tokens, lengths, positions, q = sampled(tiny, 384, seed=9)
    cfg = FlatnessConfig(n_inputs=None, hutchinson_batch_size=16, hutchinson_probes=2,
                         exclude=tiny.exclude, seed=10)
    est = block_traces(tiny.model, tokens, lengths, cfg, q, positions=positions)
    assert list(est) == ["embeddings", "layer0", "head", "total"]
    blocks = torch.tensor([["embeddings", "layer0", "head"].index(block_of(n)) for n in tiny.names
                           for _ in range(dict(zip(tiny.names, tiny.params,
                                                   strict=True))[n].numel())])
    for j, name in enumerate(["embeddings", "layer0", "head"]):
        exact = float(tiny.H.diagonal()[blocks == j].sum())
        assert abs(est[name]["mean"] - exact) < 3 * est[name]["se"], (name, est[name], exact)
    parts = sum(est[name]["mean"] for name in ("embeddings", "layer0", "head"))
    assert parts == pytest.approx(est["total"]["mean"], rel=1e-12)
    hutchinson = trace_hessian(tiny.model, tokens, lengths, cfg, soft_labels=q,
                               positions=positions)
    assert est["total"]["mean"] == pytest.approx(hutchinson["mean"], rel=1e-10)
    assert est["total"]["se"] == pytest.approx(hutchinson["se"], rel=1e-8)


def test_block_names_of_every_architecture():
    from flatlm.models import build_model, parse_model

    pre = build_model(parse_model("d8-h2-l2-i16-pre"), V, T, seed=0)
    lstm = build_model(parse_model("lstm-h4-l2"), V, T, seed=0)
    for model, expected in ((pre, ["embeddings", "layer0", "layer1", "head"]),
                            (lstm, ["embeddings", "layer0", "layer1", "head"])):
        assert block_order(block_of(n) for n in selected_parameters(model)) == expected
    assert block_of("roberta_prelayernorm.LayerNorm.weight") == "head"  # the final LayerNorm


# --- through measure_model -----------------------------------------------------------------

@pytest.mark.parametrize(("shape", "blocks"), [("d8-h2-l1-i16", ("embeddings", "layer0", "head")),
                                               ("lstm-h4-l2", ("embeddings", "layer0", "layer1",
                                                               "head"))])
def test_measure_model_logs_every_new_measurement(src, tmp_path, shape, blocks):
    from flatlm.core.config import apply_overrides
    from flatlm.measure.run import MeasureConfig, eval_data, measure_model
    from flatlm.models import build_model, parse_model

    cfg = apply_overrides(MeasureConfig(), {
        "what": ["hessian", "eigen", "density", "blocks", "sharpness"], "n_eval": 48,
        "flatness.hutchinson_batch_size": 16, "spectrum.n_inputs": 24, "spectrum.batch_size": 12,
        "spectrum.lanczos_steps": 3, "spectrum.slq_probes": 3, "spectrum.slq_steps": 3,
        "sharpness.n_inputs": 16, "sharpness.batch_size": 8, "sharpness.steps": 2,
        "sharpness.samples": 2})
    model_cfg = dataclasses.replace(parse_model(shape), dropout=0.0)
    model = build_model(model_cfg, src.V, src.max_length, seed=0).double()
    out = measure_model(model, src, eval_data(src, cfg), cfg, "cpu", artifact_dir=tmp_path)
    keys = [TOP_EIG_HESSIAN, TOP_EIG_FISHER, SLQ_TRACE_HESSIAN, sharpness_worst_key("linf"),
            sharpness_worst_key("l2"), "flat/sharpness_avg", "flat/slq_negative_trace",
            *(block_key(b) for b in blocks)]
    for key in keys:
        assert key in out and se_key(key) in out, key
    total = sum(out[block_key(b)] for b in blocks)
    assert total == pytest.approx(out[TRACE_HESSIAN], rel=1e-8)  # same vectors, same inputs
    assert out[TOP_EIG_FISHER] > 0 and out[sharpness_worst_key("linf")] > 0
    assert (tmp_path / "spectral_density.json").is_file()


def test_configs_are_checked():
    from flatlm.measure.landscape.sharpness import SharpnessConfig
    from flatlm.measure.run import MeasureConfig
    from flatlm.runs.trial import TrialConfig, tracked_params

    logged = tracked_params(TrialConfig(measure=MeasureConfig(what=("eigen",))))
    assert "measure.spectrum.lanczos_steps" in logged and "measure.flatness.exclude" in logged
    assert not any(k.startswith("measure.sharpness.") for k in logged)

    with pytest.raises(ValueError, match="spectrum.lanczos_steps"):
        SpectrumConfig(lanczos_steps=0)
    with pytest.raises(ValueError, match="spectrum.slq_probes"):
        SpectrumConfig(n_inputs=4, slq_probes=8)
    with pytest.raises(ValueError, match="spectrum.kernel_width"):
        SpectrumConfig(kernel_width=0.0)
    with pytest.raises(ValueError, match="sharpness.norms"):
        SharpnessConfig(norms=("l1",))
    with pytest.raises(ValueError, match="sharpness.rho_l2"):
        SharpnessConfig(rho_l2=-1.0)
    with pytest.raises(ValueError, match="sharpness.steps"):
        SharpnessConfig(steps=0)
    with pytest.raises(ValueError, match="eigen"):  # the error lists the new names
        MeasureConfig(what=("eigenvalues",))


def test_a_trial_writes_the_density_into_each_checkpoint(tmp_path):
    from flatlm.core.config import apply_overrides
    from flatlm.runs.trial import TrialConfig, read_metrics, run_trial

    cfg = apply_overrides(TrialConfig(), {
        "source": "dyck:4", "model": "d16-h1-l1-i32", "train.steps": 1, "train.batch_size": 4,
        "train.checkpoint_steps": [1], "train.warmup_steps": 0, "measure.n_eval": 8,
        "measure.n_downstream": 20, "measure.what": ["density"], "measure.spectrum.n_inputs": 8,
        "measure.spectrum.slq_probes": 2, "measure.spectrum.slq_steps": 3})
    run_trial(cfg, tmp_path)
    written = json.loads((tmp_path / "checkpoints" / "step-1" / "spectral_density.json")
                         .read_text())
    assert written["probes"] == 2 and len(written["grid"]) == 256
    assert SLQ_TRACE_HESSIAN in read_metrics(tmp_path)[1]
