"""algorithm="grow": the model grows function-preservingly mid-run, keeps learning, and a run
resumed across a growth is the uninterrupted run bit for bit."""

import contextlib
import json

import pytest
import torch
import torch.nn.functional as F

from flatlm.core.config import apply_overrides
from flatlm.measure.loss import kl_to_truth
from flatlm.models import build_model, load_checkpoint, parse_model, word_logits
from flatlm.models.growth import max_logit_difference
from flatlm.train import TrainConfig, resolve, train
from flatlm.train.algorithms import StepContext, build_optimizer, mlm_loss_sum, standard_step
from flatlm.train.config import GrowConfig
from flatlm.train.data import BatchPipeline, FreshSamples
from flatlm.train.growth import grow_context, replication_scale

SMALL = "d16-h1-l1-i32"



@contextlib.contextmanager
def _one_thread():
    """What the suite's autouse ``one_thread`` gives a test, for module-scoped runs, which are set
    up before it: runs compared bit for bit must use the same thread count."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _grow_cfg(at, to, **fields):
    return TrainConfig(algorithm="grow", sections={"grow": GrowConfig(steps=at, to=to)}, **fields)


@pytest.fixture(scope="module")
def grown_run(src, eval_sentences, tmp_path_factory):
    """24 updates, width and depth doubled after 8; no dropout, the loss logged every update."""
    cfg = _grow_cfg((8,), ("d32-h2-l2-i64",), steps=24, batch_size=32, lr=3e-3, warmup_steps=2,
                    dropout=0.0, log_every=1, checkpoint_steps=(8, 9, 24), seed=3)
    out = tmp_path_factory.mktemp("grown")
    seen = {}

    def hook(step, model, ckpt):
        seen[step] = (sum(p.numel() for p in model.parameters()),
                      kl_to_truth(model, src, *eval_sentences))

    with _one_thread():
        result = train(cfg, src, SMALL, out, progress=False, on_checkpoint=hook)
    return cfg, out, result, seen


def test_the_loss_is_unchanged_at_the_growth(src, grown_run):
    cfg, out, result, _ = grown_run
    small, _ = load_checkpoint(out / "checkpoints" / "step-8")  # written before the growth
    inputs = BatchPipeline(resolve(cfg), FreshSamples(src, 32, cfg.seed), torch.device("cpu"))
    batch = inputs.inputs_at(8).mlm  # update 9's batch, the first the grown model sees
    with torch.no_grad():
        expected = F.cross_entropy(word_logits(small.eval(), batch.input_ids,
                                               batch.attention_mask, batch.positions),
                                   batch.targets)
    logged = next(r for r in result.history if r["step"] == 9)["train/loss"]
    assert abs(logged - float(expected)) < 1e-5, (logged, float(expected))


def test_checkpoints_and_measurements_after_the_growth_have_the_grown_shape(grown_run):
    _, out, _, seen = grown_run
    shapes = {s: json.loads((out / "checkpoints" / f"step-{s}" / "flatlm.json").read_text())
              ["model"] for s in (8, 9, 24)}
    assert (shapes[8]["d_model"], shapes[8]["n_layers"]) == (16, 1)
    assert (shapes[9]["d_model"], shapes[9]["n_layers"]) == (32, 2) and shapes[9] == shapes[24]
    assert seen[9][0] > 2 * seen[8][0]  # the hook measured the grown model
    model, _ = load_checkpoint(out / "checkpoints" / "step-24")
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2


def test_training_continues_after_the_growth(grown_run):
    _, _, result, seen = grown_run
    assert seen[24][1] < 0.8 * seen[8][1], seen  # KL to the truth keeps falling
    before = [r["train/loss"] for r in result.history if 6 <= r["step"] <= 8]
    after = [r["train/loss"] for r in result.history if r["step"] >= 22]
    assert sum(after) / 3 < sum(before) / 3


@pytest.mark.parametrize("shape, to", [
    (SMALL, "d32-h2-l2-i64"),  # post-LN, width and depth
    (SMALL + "-pre", "d32-h2-l2-i128"),  # pre-LN; the shape takes the model's ln_mode
])
def test_grow_context_keeps_the_logits(src, shape, to):
    from flatlm.train.growth import check_schedule

    cfg = resolve(_grow_cfg((1,), (to,), steps=2, batch_size=8, dropout=0.0))
    model_cfg = parse_model(shape)
    model = build_model(model_cfg, src.V, src.max_length, seed=1)
    ctx = _context(cfg, model)
    grown = grow_context(ctx, check_schedule(cfg, model_cfg)[0], step=1)
    assert grown.model.config.num_hidden_layers == 2
    assert max_logit_difference(model, grown.model, n=16) < 1e-5


def _context(cfg, model):
    return StepContext(cfg=cfg, model=model, optimizer=build_optimizer(cfg, model),
                       autocast=contextlib.nullcontext, mlm_loss=mlm_loss_sum)


def test_adam_state_is_carried_by_the_replication_map(src):
    """Replicated parameters: exp_avg tiled times c, exp_avg_sq tiled times c**2, step kept;
    added blocks: no state."""
    cfg = resolve(_grow_cfg((1,), ("d32-h2-l2-i64",), steps=2, batch_size=16, dropout=0.0))
    model = build_model(parse_model(SMALL), src.V, src.max_length, seed=0)
    ctx = _context(cfg, model)
    pipeline = BatchPipeline(cfg, FreshSamples(src, 16, 0), torch.device("cpu"))
    standard_step(ctx, pipeline.inputs_at(0))
    grown = grow_context(ctx, parse_model("d32-h2-l2-i64"), step=1)
    old = {n: ctx.optimizer.state[p] for n, p in model.named_parameters()}
    new = {n: grown.optimizer.state.get(p, {}) for n, p in grown.model.named_parameters()}
    cases = {  # name -> (tiling, c): embeddings and biases repeat, Linears average their input
        "bert.embeddings.word_embeddings.weight": ((1, 2), 1.0),
        "bert.encoder.layer.0.attention.self.query.weight": ((2, 2), 0.5),
        "bert.encoder.layer.0.intermediate.dense.bias": ((2,), 1.0),
        "bert.encoder.layer.0.output.dense.weight": ((2, 2), 0.5),
        "cls.predictions.transform.LayerNorm.weight": ((2,), 0.5),  # the head's 1/m
    }
    for name, (reps, c) in cases.items():
        torch.testing.assert_close(new[name]["exp_avg"], old[name]["exp_avg"].repeat(reps) * c,
                                   rtol=0, atol=0, msg=name)
        torch.testing.assert_close(new[name]["exp_avg_sq"],
                                   old[name]["exp_avg_sq"].repeat(reps) * c * c, rtol=0, atol=0,
                                   msg=name)
        assert torch.equal(new[name]["step"], old[name]["step"]), name
    assert not [n for n in new if n.startswith("bert.encoder.layer.1.") and new[n]]
    # the last original block's output LayerNorm, reset to (1, 0) under the added block: fresh
    assert not new["bert.encoder.layer.0.output.LayerNorm.bias"]
    standard_step(grown, pipeline.inputs_at(1))  # the grown optimizer steps with that state


def test_depth_only_growth_copies_the_state_exactly(src):
    cfg = resolve(_grow_cfg((1,), ("d16-h1-l2-i32-pre",), steps=2, batch_size=16))
    model = build_model(parse_model(SMALL + "-pre"), src.V, src.max_length, seed=0)
    ctx = _context(cfg, model)
    standard_step(ctx, BatchPipeline(cfg, FreshSamples(src, 16, 0),
                                     torch.device("cpu")).inputs_at(0))
    grown = grow_context(ctx, parse_model("d16-h1-l2-i32-pre"), step=1)
    new = dict(grown.model.named_parameters())
    for name, p in model.named_parameters():  # pre-LN: every original parameter is kept as is
        for key, value in ctx.optimizer.state[p].items():
            assert torch.equal(grown.optimizer.state[new[name]][key], value), (name, key)


def test_replication_scale_recognises_only_scaled_tilings():
    w = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    assert replication_scale(w, w.repeat(2, 3) / 3) == pytest.approx(1 / 3, abs=0)
    assert replication_scale(w, w.clone()) == 1.0
    assert replication_scale(w, torch.ones(6, 8)) is None
    assert replication_scale(w, -w.repeat(2, 1)) is None
    assert replication_scale(w, torch.randn(6, 8)) is None
    assert replication_scale(w.abs() / 10, torch.ones(6, 8)) is None  # c ~ 10: not 1/k
    assert replication_scale(w, w.repeat(2, 2)[:5]) is None  # not a whole tiling


GROW_RESUME = dict(algorithm="grow", steps=6, batch_size=16, warmup_steps=2, seed=5,
                   log_every=4, checkpoint_steps=(2, 3, 6),  # dropout on: its RNG restored
                   sections={"grow": GrowConfig(steps=(2, 4),
                                                to=("d32-h2-l1-i64", "d32-h2-l2-i64"))})


@pytest.fixture(scope="module")
def straight_grow(src, tmp_path_factory):
    with _one_thread():
        return train(TrainConfig(**GROW_RESUME), src, SMALL,
                     tmp_path_factory.mktemp("straight"), progress=False)


@pytest.mark.parametrize("stop", [2, 3])  # before both growths; between the two
def test_resume_across_a_growth_equals_never_stopping(stop, src, straight_grow, tmp_path,
                                                      stop_at):
    cfg = TrainConfig(**GROW_RESUME)
    with pytest.raises(stop_at.Stopped):
        train(cfg, src, SMALL, tmp_path, progress=False, on_checkpoint=stop_at(stop))
    resumed = train(cfg, src, SMALL, tmp_path, progress=False, resume=True)
    assert resumed.model.config.num_hidden_layers == 2
    for (k, a), b in zip(straight_grow.model.state_dict().items(),
                         resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), k  # bit for bit
    assert resumed.history == straight_grow.history


@pytest.mark.parametrize("overrides, named", [
    ({"grow.steps": "[4, 2]", "grow.to": "d32-h2-l1-i64,d32-h2-l2-i64"}, r"train\.grow\.steps"),
    ({"grow.steps": "[2]", "grow.to": "[]"}, r"train\.grow\.to=\(\): give one shape"),
    ({"grow.steps": "[10]", "grow.to": "d32-h2-l1-i64"}, r"train\.grow\.steps=\(10,\).*1\.\.9"),
    ({"grow.steps": "[0]", "grow.to": "d32-h2-l1-i64"}, r"train\.grow\.steps=\(0,\)"),
    ({}, r"train\.grow\.steps=\(\): algorithm 'grow' needs at least one growth"),
])
def test_bad_schedules_are_named(overrides, named):
    with pytest.raises(ValueError, match=named):
        apply_overrides(TrainConfig(steps=10),
                        {"algorithm": "grow", **overrides})


def test_the_schedule_takes_the_sweeps_override_syntax():
    cfg = apply_overrides(TrainConfig(steps=10), {"algorithm": "grow", "grow.steps": "3,6",
                                                  "grow.to": "d32-h2-l1-i64,d32-h2-l2-i64"})
    assert cfg.settings("grow") == GrowConfig(steps=(3, 6), to=("d32-h2-l1-i64", "d32-h2-l2-i64"))
    plain = TrainConfig(steps=10, sections={"grow": GrowConfig(steps=(20,), to=("x",))})
    assert plain.algorithm == "adamw"  # ignored by adamw


@pytest.mark.parametrize("model, to, named", [
    (SMALL, ("d24-h1-l1-i32",), r"train\.grow\.to\[0\]='d24-h1-l1-i32' is not a growth of "
                                r"d16-h1-l1-i32.*not a multiple"),
    (SMALL, ("d32-h2-l2-i64", "d32-h2-l1-i64"), r"train\.grow\.to\[1\].*fewer than"),
    (SMALL, ("bert-3m",), r"train\.grow\.to\[0\]='bert-3m'"),
    ("lstm-h16-l1", ("d32-h2-l1-i64",), r"train\.grow\.to\[0\].*only BERTs can grow"),
    (SMALL, ("d32-h2-l1-i64-pre",), r"train\.grow\.to\[0\].*ln_mode"),
])
def test_shapes_that_are_not_growths_are_refused_before_any_work(model, to, named, src,
                                                                 tmp_path):
    cfg = _grow_cfg(tuple(range(1, len(to) + 1)), to, steps=4, batch_size=8)
    with pytest.raises(ValueError, match=named):
        train(cfg, src, model, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
