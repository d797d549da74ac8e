"""Pre-LN BERTs (``ModelConfig.ln_mode="pre"``): shape strings, the model really being pre-LN,
the helpers, training, checkpoints and exact growth."""

import dataclasses
import json

import pytest
import torch
from torch import nn
from transformers import BertForMaskedLM, RobertaPreLayerNormForMaskedLM

from flatlm.models import (
    PRESETS,
    ModelConfig,
    ModelSpec,
    build_model,
    cls_features,
    count_parameters,
    encode,
    encoder_features,
    grow,
    grow_checkpoint,
    load_checkpoint,
    max_logit_difference,
    model_layout,
    parameter_count,
    parse_model,
    save_checkpoint,
    sentence_features,
    shape_string,
    token_layout,
    word_logits,
)
from flatlm.models.growth import bert_shape, growth
from tests.models.conftest import random_sentences

V, T = 7, 5
SHAPE = "d16-h2-l2-i32-pre"
SOURCE = {"kind": "dyck", "length": T}


def _batch(seed: int, n: int = 6):
    return encode(*random_sentences(seed, n, V, T))


def _moved(shape: str = SHAPE, seed: int = 0, dtype=torch.float64, attention="sdpa") -> nn.Module:
    """A dropout-free model with its weights moved off initialisation (and off LayerNorm's 1, 0)."""
    cfg = dataclasses.replace(parse_model(shape), dropout=0.0, attention=attention)
    model = build_model(cfg, V, T, seed=seed).to(dtype).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


# --- config and shape strings -----------------------------------------------------------------

def test_shape_suffix_round_trips_and_presets_stay_post_ln():
    cfg = parse_model("d64-h1-l1-i256-pre")
    assert cfg.ln_mode == "pre" and cfg.d_model == 64 and shape_string(cfg) == "d64-h1-l1-i256-pre"
    assert parse_model(shape_string(cfg)) == cfg
    assert parse_model("bert-2m-pre") == dataclasses.replace(PRESETS["bert-2m"], ln_mode="pre")
    assert parse_model("BERT-110M-Pre").n_layers == 12
    assert all(c.ln_mode == "post" for c in PRESETS.values())
    assert shape_string(parse_model("bert-2m")) == "d64-h1-l1-i256"  # no suffix for post-LN
    assert ModelSpec("bert-2m-pre") == ModelSpec("d64-h1-l1-i256-pre") != ModelSpec("bert-2m")
    assert ModelSpec("bert-2m-pre").to_json() == "bert-2m-pre"


@pytest.mark.parametrize("make, message", [
    (lambda: ModelConfig(n_layers=1, d_model=8, n_heads=1, d_inter=8, ln_mode="sandwich"),
     r"model\.ln_mode='sandwich'.*'post', 'pre'"),
    (lambda: ModelConfig(arch="lstm", n_layers=1, d_hidden=8, ln_mode="pre"),
     r"model\.ln_mode='pre'.*arch='lstm'"),
    (lambda: parse_model("lstm-h8-l1-pre"), "BERT shapes only"),
    (lambda: parse_model("d16-h2-l1-i32-prel"), "neither a preset nor a shape"),
])
def test_bad_ln_mode_names_the_field(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# --- the model ---------------------------------------------------------------------------------

def test_build_forward_and_helpers():
    cfg = parse_model(SHAPE)
    model = build_model(cfg, V, T, seed=0)
    assert isinstance(model, RobertaPreLayerNormForMaskedLM) and model.training
    assert model.config._attn_implementation == "sdpa"
    assert count_parameters(model) == parameter_count(cfg, V, T)  # tied decoder counted once
    assert model_layout(model) == token_layout(V, T)
    head = model.lm_head
    assert head.decoder.weight is model.roberta_prelayernorm.embeddings.word_embeddings.weight
    assert head.decoder.bias is head.bias
    model.eval()
    ids, mask = _batch(0)
    n = len(ids)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits
        logits = word_logits(model, ids, mask)
        positions = torch.zeros(n, dtype=torch.int64)
        at = word_logits(model, ids, mask, positions)
        states = encoder_features(model, ids, mask)
    assert logits.shape == (n, T + 2, V) and torch.equal(logits, full[..., 4:])
    torch.testing.assert_close(at, full[:, 1, 4:])
    assert states.shape == (n, T + 2, 16)
    assert torch.equal(cls_features(model, ids, mask), states[:, 0])
    flat = sentence_features(model, ids, mask).view(n, T + 2, 16)
    assert bool((flat[mask == 0] == 0).all()) and torch.equal(flat[mask == 1], states[mask == 1])
    # same parameters as post-LN except one final LayerNorm and one more (padding) position row
    post = build_model(parse_model(SHAPE.removesuffix("-pre")), V, T, seed=0)
    assert isinstance(post, BertForMaskedLM)
    assert count_parameters(model) - count_parameters(post) == 2 * 16 + 16


def test_model_is_pre_ln():
    model = _moved()
    base = model.roberta_prelayernorm
    for layer in base.encoder.layer:
        assert isinstance(layer.attention.LayerNorm, nn.LayerNorm)
        assert isinstance(layer.intermediate.LayerNorm, nn.LayerNorm)
        assert not hasattr(layer.attention.output, "LayerNorm")
        assert not hasattr(layer.output, "LayerNorm")
    assert isinstance(base.LayerNorm, nn.LayerNorm)  # the final one
    ids, mask = _batch(1)
    # the query reads LN_a(block input) and the MLP reads LN_b(stream after attention)
    seen = {}
    layer = base.encoder.layer[1]
    hooks = [layer.register_forward_hook(lambda m, a, o: seen.update(h=a[0]), with_kwargs=False),
             layer.attention.self.query.register_forward_hook(lambda m, a, o: seen.update(q=a[0])),
             layer.attention.register_forward_hook(lambda m, a, o: seen.update(v=o[0])),
             layer.intermediate.dense.register_forward_hook(lambda m, a, o: seen.update(u=a[0]))]
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    for h in hooks:
        h.remove()
    torch.testing.assert_close(seen["q"], layer.attention.LayerNorm(seen["h"]), rtol=0, atol=1e-12)
    torch.testing.assert_close(seen["u"], layer.intermediate.LayerNorm(seen["v"]), rtol=0,
                               atol=1e-12)
    # zero sublayer outputs make every block the identity on the residual stream: the encoder
    # returns the final LayerNorm of the embeddings (a post-LN BERT would re-normalise twice)
    with torch.no_grad():
        for block in base.encoder.layer:
            for linear in (block.attention.output.dense, block.output.dense):
                linear.weight.zero_()
                linear.bias.zero_()
        embedded = base.embeddings(input_ids=ids)
        torch.testing.assert_close(encoder_features(model, ids, mask), base.LayerNorm(embedded),
                                   rtol=0, atol=1e-12)


def test_a_few_steps_lower_the_loss_and_dropout_is_configured():
    cfg = dataclasses.replace(parse_model("d32-h2-l1-i64-pre"), dropout=0.0)
    model = build_model(cfg, V, T, seed=0)
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, nn.Dropout))
    ids, mask = _batch(2, n=16)
    labels = ids.masked_fill(mask == 0, -100)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    noisy = build_model(dataclasses.replace(cfg, dropout=0.3), V, T, seed=0)
    assert {m.p for m in noisy.modules() if isinstance(m, nn.Dropout)} == {0.3}


# --- checkpoints -------------------------------------------------------------------------------

def test_checkpoint_round_trip(tmp_path):
    cfg = dataclasses.replace(parse_model(SHAPE), dropout=0.0, attention="eager")
    model = _moved(seed=3, dtype=torch.float32, attention="eager")
    save_checkpoint(model, tmp_path, source_spec=SOURCE, model_cfg=cfg, extra={"step": 3})
    info = json.loads((tmp_path / "flatlm.json").read_text())
    assert info["model"]["ln_mode"] == "pre" and info["shape"] == SHAPE
    assert "RobertaPreLayerNormForMaskedLM" in info["load"]
    assert info["n_parameters"] == count_parameters(model)
    loaded, info2 = load_checkpoint(tmp_path)
    assert isinstance(loaded, RobertaPreLayerNormForMaskedLM) and not loaded.training
    assert loaded.config._attn_implementation == "eager" and ModelConfig(**info2["model"]) == cfg
    alone = RobertaPreLayerNormForMaskedLM.from_pretrained(
        tmp_path, local_files_only=True, attn_implementation="eager").eval()
    for other in (loaded, alone):
        base = other.roberta_prelayernorm
        assert other.lm_head.decoder.weight is base.embeddings.word_embeddings.weight
        assert other.lm_head.decoder.bias is other.lm_head.bias
    ids, mask = _batch(4)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
        for other in (loaded, alone):
            assert torch.equal(other(input_ids=ids, attention_mask=mask).logits, expected)
    with pytest.raises(ValueError, match="ln_mode='post'"):
        save_checkpoint(model, tmp_path / "x", source_spec=SOURCE,
                        model_cfg=dataclasses.replace(cfg, ln_mode="post"))


# --- growth ------------------------------------------------------------------------------------

@pytest.mark.parametrize("construction", ["paper", "head-norm"])
@pytest.mark.parametrize("target", ["d16-h2-l4-i32-pre", "d48-h6-l2-i64-pre",
                                    "d32-h4-l5-i96-pre"])
def test_grown_pre_ln_logits_equal_exactly(target, construction):
    small = _moved(seed=5)
    big = grow(small, parse_model(target), seed=1, construction=construction)
    assert isinstance(big, RobertaPreLayerNormForMaskedLM)
    assert shape_string(bert_shape(big)) == target
    assert big.lm_head.decoder.weight is big.roberta_prelayernorm.embeddings.word_embeddings.weight
    # pre-LN added blocks are identities (all-zero ones too); "head-norm" width replication is
    # exact, "paper"'s embedding LayerNorm sees x / m (eps acts as m^2 eps)
    tol = 1e-9 if construction == "paper" else 1e-12
    assert max_logit_difference(small, big, n=16) < tol


def test_growth_keeps_ln_mode(tmp_path):
    with pytest.raises(ValueError, match=r"model\.ln_mode='post'.*'pre'"):
        growth(parse_model(SHAPE), parse_model("d32-h4-l2-i64"))
    with pytest.raises(ValueError, match=r"model\.ln_mode='pre'.*'post'"):
        grow(_moved("d16-h2-l1-i32"), parse_model("d32-h4-l2-i64-pre"))
    cfg = dataclasses.replace(parse_model(SHAPE), dropout=0.0)
    save_checkpoint(_moved(seed=6), tmp_path / "a", source_spec=SOURCE, model_cfg=cfg)
    grow_checkpoint(tmp_path / "a", "d32-h4-l3-i64", tmp_path / "b")  # unsuffixed: the ckpt's
    big, info = load_checkpoint(tmp_path / "b")
    assert isinstance(big, RobertaPreLayerNormForMaskedLM) and info["shape"] == "d32-h4-l3-i64-pre"
    small, _ = load_checkpoint(tmp_path / "a")
    assert max_logit_difference(small, big) < 1e-10


# --- the training loop -------------------------------------------------------------------------

def test_training_loop_trains_checkpoints_and_resumes_pre_ln(tmp_path):
    from flatlm.measure.loss import kl_to_truth
    from flatlm.sources import load
    from flatlm.train import TrainConfig, train

    src = load({"kind": "pcfg", "random": {"vocab": 12, "depth": 2, "nonterminals_per_level": 3,
                                           "roots": 2}, "seed": 0})
    held_out = src.sample(128, seed=10_000)
    cfg = TrainConfig(steps=30, batch_size=64, lr=3e-3, warmup_steps=5, checkpoint_steps=(15, 30),
                      dropout=0.05, seed=1)
    kl = {0: kl_to_truth(build_model(parse_model("d32-h2-l1-i64-pre"), src.V, src.max_length,
                                     seed=cfg.seed), src, *held_out)}

    def stop_at_15(step, model, ckpt_dir):
        kl[step] = kl_to_truth(model, src, *held_out)
        if step == 15:
            raise KeyboardInterrupt

    straight = train(cfg, src, "d32-h2-l1-i64-pre", tmp_path / "a", progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, src, "d32-h2-l1-i64-pre", tmp_path / "b", progress=False,
              on_checkpoint=stop_at_15)
    resumed = train(cfg, src, "d32-h2-l1-i64-pre", tmp_path / "b", progress=False, resume=True)
    assert isinstance(resumed.model, RobertaPreLayerNormForMaskedLM)
    assert {m.p for m in resumed.model.modules() if isinstance(m, nn.Dropout)} == {0.05}
    for (k, a), b in zip(straight.model.state_dict().items(),
                         resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), k  # bit for bit through a pre-LN checkpoint
    assert kl_to_truth(straight.model, src, *held_out) < 0.7 * kl[0], kl
    info = json.loads((straight.checkpoints[30] / "flatlm.json").read_text())
    assert info["shape"] == "d32-h2-l1-i64-pre" and info["model"]["dropout"] == 0.05
