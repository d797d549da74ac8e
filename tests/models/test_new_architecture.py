"""A new architecture is one file and one ``register_architecture`` call: the toy in
tests/assets/toy_architecture.py, registered through the public API and nothing else, gets the
shape strings, counts and messages derived from the registry, builds, reads, saves and loads
through the architecture-agnostic helpers, is measured (Tr(F) by the per-example loop, Tr(H)
through ``word_logits``) and runs a whole trial."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from flatlm.core.config import apply_overrides
from flatlm.measure.curvature.common import FlatnessConfig
from flatlm.measure.curvature.fisher import auto_method, trace_fisher
from flatlm.measure.curvature.grown import check_grow_to
from flatlm.measure.curvature.hessian_trace import second_order_logits, trace_hessian
from flatlm.models import (
    Architecture,
    ModelConfig,
    ModelSpec,
    architecture,
    architecture_of,
    build_model,
    count_parameters,
    describe,
    encode,
    ln_mode_of,
    load_checkpoint,
    paper_parameter_count,
    parameter_count,
    parse_model,
    register_architecture,
    save_checkpoint,
    sentence_features,
    shape_string,
    word_logits,
)
from flatlm.models.architectures import all_architectures, unpackable_reason
from flatlm.models.growth import growth
from flatlm.runs.trial import TrialConfig, run_trial
from tests.assets.toy_architecture import TOY, ToyMLM  # registers "toy"
from tests.models.conftest import random_sentences

V, T = 6, 5
SHAPE = "toy-d16-l2"
SOURCE = {"kind": "dyck", "length": 4}


def _batch(n: int = 8, seed: int = 0):
    return random_sentences(seed, n, V, T)


def test_the_registry_derives_shapes_counts_and_messages():
    cfg = parse_model(SHAPE)
    assert cfg == ModelConfig(arch="toy", d_model=16, n_layers=2) == ModelSpec(SHAPE).config
    assert architecture(cfg) is TOY and shape_string(cfg) == SHAPE
    assert parameter_count(cfg, V, T) == count_parameters(build_model(cfg, V, T, seed=0))
    assert describe(cfg, V, T).startswith(f"toy {SHAPE}: ")
    assert "paper convention" not in describe(cfg, V, T)
    with pytest.raises(ValueError, match="model.d_hidden is not used by arch='toy'"):
        ModelConfig(arch="toy", n_layers=1, d_model=8, d_hidden=4)
    with pytest.raises(ValueError, match=r"model.ln_mode='pre' .*arch='toy'"):
        ModelConfig(arch="toy", n_layers=1, d_model=8, ln_mode="pre")
    with pytest.raises(ValueError, match="applies to BERT shapes only"):
        parse_model(SHAPE + "-pre")
    with pytest.raises(ValueError, match="'toy-d{d_model}-l{n_layers}' \\(toy MLM\\)"):
        parse_model("toy-16")
    with pytest.raises(ValueError, match="model.arch='gpt': use one of bert, lstm, toy \\(add"):
        ModelConfig(arch="gpt", n_layers=1)
    with pytest.raises(ValueError, match="model.arch='toy': the paper quotes .* only for BERTs"):
        paper_parameter_count(cfg)
    with pytest.raises(ValueError, match="checkpoint model.arch='toy': only BERTs can grow"):
        growth(cfg, parse_model("d32-h2-l2-i64"))
    with pytest.raises(ValueError, match="measure.grow_to='toy-d16-l2': only BERT shapes"):
        check_grow_to(SHAPE)
    # no pack hook: its trials train unpacked; a BERT packs by its hook, in its pack_ln_modes
    assert unpackable_reason(cfg) == ("model toy MLM ln_mode=post: only the post-LN BERT is "
                                      "packed")
    assert unpackable_reason(parse_model("d16-h1-l1-i64")) is None
    assert "ln_mode=pre" in unpackable_reason(parse_model("d16-h1-l1-i64-pre"))


def test_register_architecture_refuses_what_the_registry_cannot_read():
    with pytest.raises(ValueError, match="'toy' is registered already"):
        register_architecture(dataclasses.replace(TOY, label="another toy"))
    assert register_architecture(TOY) is TOY  # the same object again: a no-op
    fields = dict(name="x", label="x", build=ToyMLM, classes=lambda: {"post": ToyMLM})
    with pytest.raises(ValueError, match=r"sizes \['width'\] are not ModelConfig fields"):
        Architecture(shape="x-w{width}-l{n_layers}", sizes=("width",), **fields)
    with pytest.raises(ValueError, match="must name n_layers and each of sizes"):
        Architecture(shape="x-d{d_model}", sizes=("d_model",), **fields)


def test_the_helpers_build_read_save_and_load_it(tmp_path):
    cfg = parse_model(SHAPE)
    state = torch.random.get_rng_state()
    model = build_model(cfg, V, T, seed=1).eval()
    assert torch.equal(torch.random.get_rng_state(), state)  # seeded: global RNG untouched
    assert isinstance(model, ToyMLM) and model.training is False
    assert architecture_of(model) is TOY and ln_mode_of(model) == "post"
    ids, mask = encode(*_batch())
    with torch.no_grad():
        every = word_logits(model, ids, mask)
        one = word_logits(model, ids, mask, torch.zeros(8, dtype=torch.long))
        features = sentence_features(model, ids, mask)
    assert every.shape == (8, T + 2, V) and torch.allclose(one, every[:, 1])
    assert features.shape == (8, (T + 2) * 16)

    save_checkpoint(model, tmp_path / "c", source_spec=SOURCE, model_cfg=cfg, extra={"step": 3})
    info = json.loads((tmp_path / "c" / "flatlm.json").read_text())
    assert info["shape"] == SHAPE and info["load"] == "flatlm.models.load_checkpoint(dir)"
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["flatlm.json",
                                                                   "model.safetensors"]
    loaded, loaded_info = load_checkpoint(tmp_path / "c")
    assert isinstance(loaded, ToyMLM) and not loaded.training and loaded_info == info
    with torch.no_grad():
        assert torch.equal(word_logits(loaded, ids, mask), every)
    with pytest.raises(ValueError, match="model_cfg.arch='bert'"):
        save_checkpoint(model, tmp_path / "x", source_spec=SOURCE, model_cfg=parse_model("bert-2m"))


def test_it_is_measured_by_the_fallbacks():
    model = build_model(parse_model(SHAPE), V, T, seed=2).double()
    tokens, lengths = _batch(12, seed=1)
    assert auto_method(model) == "loop" and second_order_logits(model) is word_logits
    fc = FlatnessConfig(n_inputs=12, batch_size=4, labels_per_input=2, hutchinson_batch_size=4,
                        hutchinson_probes=2)
    auto = trace_fisher(model, tokens, lengths, fc, per_example=True)
    loop = trace_fisher(model, tokens, lengths, fc, per_example=True, method="loop")
    assert torch.equal(auto["per_example"], loop["per_example"]) and auto["mean"] > 0
    hessian = trace_hessian(model, tokens, lengths, fc, with_gap=True)
    assert all(torch.isfinite(torch.tensor(hessian[k])) for k in ("mean", "gap_mean"))


def test_a_registered_toy_architecture_runs_a_trial(tmp_path):
    cfg = apply_overrides(TrialConfig(), {
        "source": "dyck:4", "model": SHAPE, "train.steps": 4, "train.batch_size": 8,
        "train.warmup_steps": 1, "train.checkpoint_steps": [2, 4], "measure.n_eval": 16,
        "measure.n_downstream": 40, "measure.what": ["loss", "fisher", "hessian", "probe"],
        "measure.probe.epochs": 2, "measure.probe.seeds": 2})
    done = run_trial(cfg, tmp_path / "trial")
    metrics = done[4]
    for key in ("pretrain/loss", "flat/trace_fisher", "flat/trace_hessian",
                "probe/g_star/acc_mean", "random_init/g_star/acc_mean"):
        assert key in metrics, key
    assert metrics["flat/trace_fisher"] > 0


def test_the_registry_stays_light_and_below_the_measure_layer():
    """presets validates a ModelConfig against the registry without importing torch (sweep
    configs are parsed without it), and no built-in hook names the measure layer."""
    code = ("import sys, flatlm.models.presets as p; p.parse_model('lstm-h8-l1'); "
            "p.describe(p.parse_model('bert-2m-pre'), 5, 4); "
            "print(sorted(m for m in sys.modules if m in ('torch', 'transformers')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr
    hooks = [repr(getattr(a, f)) for a in all_architectures() if a is not TOY
             for f in a.__dataclass_fields__]
    assert any("flatlm.models.lstm_unrolled" in h for h in hooks)
    assert not any("flatlm.measure" in h for h in hooks)
