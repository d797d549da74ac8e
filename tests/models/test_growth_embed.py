"""Growing a BERT (B.4) keeps its function: the same logits and MLM loss on random inputs, under
both constructions ("paper": B.4.2 / enlarge.py, input embeddings / m; "head-norm": the MLM
head's LayerNorm / m).

Every small model has its parameters moved off their initialisation (LayerNorm gamma != 1,
beta != 0, non-zero biases), since at initialisation the depth construction's subtlety (post-LN
blocks are not identities) is invisible. Exactness is checked in float64: "head-norm" width growth
alone to rounding (1e-13), added blocks to 1e-10 (the LayerNorm eps = 1e-12 re-normalises; with
eps = 0 they are exact too); "paper" to 1e-9 (its embedding LayerNorm sees x / m, so eps acts as
m^2 eps; with eps = 0 exact to rounding). One float32 case holds to 1e-5 relative to the largest
logit.
"""

import dataclasses
import itertools
import json

import pytest
import torch
from torch import nn
from transformers import BertForMaskedLM

from flatlm.cli import main
from flatlm.models import (
    TABLE4,
    build_model,
    encoder_features,
    load_checkpoint,
    parse_model,
    save_checkpoint,
)
from flatlm.models.constructions import CONSTRUCTIONS
from flatlm.models.growth import (
    grow,
    grow_checkpoint,
    growth,
    max_logit_difference,
    random_inputs,
)

V, T = 11, 6
SOURCE = {"kind": "dyck", "length": T}
SMALL = "d16-h2-l2-i32"  # head size 8


def _trained_like(cfg, seed: int, dtype=torch.float64) -> nn.Module:
    """A small BERT in eval mode with every parameter perturbed away from its initialisation."""
    model = build_model(parse_model(cfg), V, T, seed=seed).to(dtype).eval()
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _logits(model, seed: int, n: int = 6):
    ids, mask = random_inputs(model, n, seed=seed)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def _shape(d: int, h: int, n: int, i: int) -> str:
    return f"d{d}-h{h}-l{n}-i{i}"


def _tolerance(construction: str, added: int, width: int = 3) -> float:
    if construction == "paper":  # the embedding LayerNorm's eps acts as m^2 eps (growth.py)
        return 1e-10 * width**2
    return 1e-13 if added == 0 else 1e-10


@pytest.mark.parametrize("construction", CONSTRUCTIONS)
@pytest.mark.parametrize("width, added", list(itertools.product((1, 2, 3), (0, 1, 2))),
                         ids=lambda v: str(v))
def test_grown_logits_equal_small_logits_float64(width, added, construction):
    small = _trained_like(SMALL, seed=10 * width + added)
    big = grow(small, parse_model(_shape(16 * width, 2 * width, 2 + added, 32 * width)),
               construction=construction)
    assert sum(p.numel() for p in big.parameters()) > sum(p.numel() for p in small.parameters()) \
        or (width, added) == (1, 0)
    expected, got = _logits(small, seed=1), _logits(big, seed=1)
    if width == 1 and added == 0:
        assert torch.equal(got, expected)  # a copy
    torch.testing.assert_close(got, expected, rtol=0,
                               atol=_tolerance(construction, added, width))


@pytest.mark.parametrize("width", [2, 3])
def test_paper_width_growth_is_exact_without_eps(width):
    small = _trained_like(SMALL, seed=20 + width)
    _set_eps(small, 0.0)
    big = grow(small, parse_model(_shape(16 * width, 2 * width, 2, 32 * width)),
               construction="paper")
    torch.testing.assert_close(_logits(big, seed=2), _logits(small, seed=2), rtol=0, atol=1e-13)


@pytest.mark.parametrize("construction", CONSTRUCTIONS)
def test_intermediate_factor_may_differ_from_width(construction):
    # Table 4 as printed: d320-h5-l6-i1024 -> d1920-h30-l20-i5120 (width x6, d_inter x5); here
    # with head size 4 and fewer layers
    small = _trained_like("d20-h5-l2-i64", seed=3)
    big = grow(small, parse_model("d120-h30-l3-i320"), construction=construction)
    torch.testing.assert_close(_logits(big, seed=2), _logits(small, seed=2), rtol=0,
                               atol=_tolerance(construction, 1, width=6))


@pytest.mark.parametrize("source, target", [("bert-4.8m", "bert-25m"), ("bert-17m", "bert-79m")])
def test_table4_pairs_scaled_down(source, target):
    # Table 4 shapes with head size 64 -> 4 (d_model and d_inter / 16), layers and heads as given
    def scaled(name):
        c = parse_model(name)
        return _shape(c.d_model // 16, c.n_heads, c.n_layers, c.d_inter // 16)

    small = _trained_like(scaled(source), seed=4)
    big = grow(small, parse_model(scaled(target)))
    torch.testing.assert_close(_logits(big, seed=3), _logits(small, seed=3), rtol=0, atol=1e-10)


def test_table4_growth_factors():
    # Which Figure 5 shapes embed into which: the head counts must divide (B.3's "multiple").
    ok = {}
    for a, b in itertools.combinations(TABLE4, 2):
        try:
            ok[a, b] = growth(parse_model(a), parse_model(b))
        except ValueError as e:
            assert "d_model" in str(e)
    assert len(ok) == 12
    assert all(b == "bert-950m" for a, b in ok if a in ("bert-25m", "bert-79m", "bert-208m"))
    g = ok["bert-4.8m", "bert-950m"]
    assert (g.width, g.inter, g.added_layers) == (15, 15, 16)


def test_float32_within_1e_5():
    small = _trained_like("d24-h3-l2-i96", seed=5, dtype=torch.float32)
    big = grow(small, parse_model("d72-h9-l4-i288"))
    assert big.bert.embeddings.word_embeddings.weight.dtype == torch.float32
    expected, got = _logits(small, seed=4), _logits(big, seed=4)
    assert (got - expected).abs().max() <= 1e-5 * max(1.0, expected.abs().max())


def test_same_mlm_loss():
    small = _trained_like(SMALL, seed=6)
    big = grow(small, parse_model("d48-h6-l4-i96"))
    ids, mask = random_inputs(small, 8, seed=5)
    g = torch.Generator().manual_seed(6)
    labels = torch.where(torch.rand(ids.shape, generator=g) < 0.3, ids, -100)
    labels[:, 1] = ids[:, 1]  # at least one word per sentence
    with torch.no_grad():
        expected = small(input_ids=ids, attention_mask=mask, labels=labels).loss
        got = big(input_ids=ids, attention_mask=mask, labels=labels).loss
    assert float(got) == pytest.approx(float(expected), rel=1e-12)


@pytest.mark.parametrize("construction", CONSTRUCTIONS)
def test_final_hidden_states_are_replicated(construction):
    small = _trained_like(SMALL, seed=7)
    big = grow(small, parse_model("d48-h6-l3-i96"), construction=construction)
    ids, mask = random_inputs(small, 4, seed=6)
    with torch.no_grad():
        h = encoder_features(small, ids, mask)  # (n, T+2, 16)
        h_big = encoder_features(big, ids, mask)  # (n, T+2, 48)
    torch.testing.assert_close(h_big, h.repeat(1, 1, 3), rtol=0,
                               atol=_tolerance(construction, 1))


def _set_eps(model, eps: float):
    model.config.layer_norm_eps = eps
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            module.eps = eps


def test_depth_is_exact_without_eps_and_the_literal_b42_blocks_are_not():
    small = _trained_like(SMALL, seed=8)
    _set_eps(small, 0.0)
    big = grow(small, parse_model("d16-h2-l4-i32"))
    expected = _logits(small, seed=7)
    torch.testing.assert_close(_logits(big, seed=7), expected, rtol=0, atol=1e-13)
    # B.4.2 as written: keep the last block's (gamma, beta) and append blocks whose output
    # projections are zero (LayerNorms gamma = 1, beta = 0, or copies of the last block's).
    for copy_last in (False, True):
        literal = grow(small, parse_model("d16-h2-l2-i32"))
        last = literal.bert.encoder.layer[-1].output.LayerNorm.state_dict()
        literal.bert.encoder.layer.extend(big.bert.encoder.layer[2:])
        literal.config.num_hidden_layers = 4
        if copy_last:
            for block in literal.bert.encoder.layer[2:]:
                block.attention.output.LayerNorm.load_state_dict(last)
                block.output.LayerNorm.load_state_dict(last)
        else:
            literal.bert.encoder.layer[-1].output.LayerNorm.weight.data.fill_(1.0)
            literal.bert.encoder.layer[-1].output.LayerNorm.bias.data.zero_()
        assert (_logits(literal, seed=7) - expected).abs().max() > 1e-2


def test_seed_sets_only_the_free_parameters_of_added_blocks():
    small = _trained_like(SMALL, seed=9)
    target = parse_model("d32-h4-l3-i64")
    a = dict(grow(small, target, seed=0, construction="head-norm").named_parameters())
    b = dict(grow(small, target, seed=1, construction="head-norm").named_parameters())
    differ = {name for name in a if not torch.equal(a[name], b[name])}
    free = {f"bert.encoder.layer.2.{m}.weight"  # fresh biases are zero whatever the seed
            for m in ("attention.self.query", "attention.self.key", "attention.self.value",
                      "intermediate.dense")}
    assert differ == free
    # the paper's fills them with zeros: the seed changes nothing
    c = dict(grow(small, target, seed=0, construction="paper").named_parameters())
    d = dict(grow(small, target, seed=1, construction="paper").named_parameters())
    assert all(torch.equal(c[name], d[name]) for name in c)
    assert all(not c[name].any() for name in free)


def test_keeps_tying_mode_and_dtype():
    small = _trained_like(SMALL, seed=11).train()
    big = grow(small, parse_model("d32-h4-l3-i64"))
    assert big.training and big.bert.embeddings.word_embeddings.weight.dtype == torch.float64
    assert big.cls.predictions.decoder.weight is big.bert.embeddings.word_embeddings.weight
    assert big.config.hidden_dropout_prob == parse_model("d32-h4-l3-i64").dropout


def test_grown_checkpoint_loads_with_transformers_and_flatlm(tmp_path):
    small = _trained_like(SMALL, seed=12, dtype=torch.float32)
    cfg = dataclasses.replace(parse_model(SMALL), dropout=0.05, attention="eager")
    save_checkpoint(small, tmp_path / "small", source_spec=SOURCE, model_cfg=cfg,
                    extra={"step": 7})
    out = grow_checkpoint(tmp_path / "small", "d32-h4-l4-i64", tmp_path / "big", seed=3,
                          construction="head-norm")
    expected = _logits(small, seed=8)
    loaded = BertForMaskedLM.from_pretrained(out, local_files_only=True).eval()
    assert loaded.cls.predictions.decoder.weight is loaded.bert.embeddings.word_embeddings.weight
    model, info = load_checkpoint(out)
    for big in (loaded, model):
        got = _logits(big, seed=8)
        assert (got - expected).abs().max() <= 1e-5 * max(1.0, expected.abs().max())
    assert info["shape"] == "d32-h4-l4-i64" and info["source"] == SOURCE
    assert (info["model"]["dropout"], info["model"]["attention"]) == (0.05, "eager")
    assert info["extra"]["step"] == 7
    grown = info["extra"]["grown_from"]
    assert (grown["shape"], grown["width"], grown["inter"], grown["added_layers"],
            grown["seed"], grown["construction"]) == (SMALL, 2, 2, 2, 3, "head-norm")


@pytest.mark.parametrize("construction", [None, *CONSTRUCTIONS])
def test_cli_grow(tmp_path, capsys, construction):
    small = _trained_like(SMALL, seed=13, dtype=torch.float32)
    save_checkpoint(small, tmp_path / "small", source_spec=SOURCE, model_cfg=parse_model(SMALL))
    chosen = [] if construction is None else ["--construction", construction]
    assert main(["grow", str(tmp_path / "small"), "--to", "d48-h6-l3-i96", "--out",
                 str(tmp_path / "big"), "--check", "4", *chosen]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"grew {SMALL} -> d48-h6-l3-i96 (width x3, d_inter x3, +1 layers")
    assert f"construction {construction or 'paper'})" in lines[0]  # the paper's by default
    assert float(lines[1].rsplit(": ", 1)[1]) < 1e-5
    info = json.loads((tmp_path / "big" / "flatlm.json").read_text())
    assert info["shape"] == "d48-h6-l3-i96"
    assert info["extra"]["grown_from"]["construction"] == (construction or "paper")
    big, _ = load_checkpoint(tmp_path / "big")
    assert max_logit_difference(small, big, n=3, seed=1) < 1e-5
    scale = 1 / 3 if construction in (None, "paper") else 1.0  # where the factor 1/m went
    torch.testing.assert_close(big.bert.embeddings.word_embeddings.weight,
                               small.bert.embeddings.word_embeddings.weight.repeat(1, 3) * scale)


def test_cli_grow_refuses_an_unknown_construction(tmp_path, capsys):
    save_checkpoint(_trained_like(SMALL, seed=14, dtype=torch.float32), tmp_path / "small",
                    source_spec=SOURCE, model_cfg=parse_model(SMALL))
    with pytest.raises(SystemExit, match="2"):
        main(["grow", str(tmp_path / "small"), "--to", "d32-h4-l2-i64", "--out",
              str(tmp_path / "big"), "--construction", "flatlm"])
    assert "invalid choice: 'flatlm'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--construction='flatlm': use one of 'paper'"):
        grow_checkpoint(tmp_path / "small", "d32-h4-l2-i64", tmp_path / "big",
                        construction="flatlm")
    with pytest.raises(ValueError, match="^construction='x': use one of"):
        grow(_trained_like(SMALL, seed=1), parse_model("d32-h4-l2-i64"), construction="x")


@pytest.mark.parametrize("target, message", [
    ("d8-h1-l2-i32", "target model.d_model=8 is not a multiple of the checkpoint's d_model=16"),
    ("d24-h3-l2-i48", "target model.d_model=24 is not a multiple"),
    ("d32-h2-l2-i64", "target model.n_heads=2: width x2 duplicates"),
    ("d32-h4-l2-i48", "target model.d_inter=48 is not a multiple of the checkpoint's d_inter=32"),
    ("d32-h4-l2-i16", "target model.d_inter=16"),
    ("d32-h4-l1-i64", "target model.n_layers=1 is fewer than the checkpoint's n_layers=2"),
    ("lstm-h16-l2", "target model.arch='lstm'"),
    ("bert-nope", "model 'bert-nope' is neither a preset nor a shape"),
])
def test_bad_targets_name_the_field(target, message, tmp_path, capsys):
    cfg = parse_model(SMALL)
    save_checkpoint(build_model(cfg, V, T, seed=0), tmp_path / "small", source_spec=SOURCE,
                    model_cfg=cfg)
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        grow_checkpoint(tmp_path / "small", target, tmp_path / "big")
    assert main(["grow", str(tmp_path / "small"), "--to", target, "--out",
                 str(tmp_path / "big")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "big").exists()


def test_bad_checkpoints_and_outputs(tmp_path):
    lstm = parse_model("lstm-h16-l1")
    save_checkpoint(build_model(lstm, V, T, seed=0), tmp_path / "lstm", source_spec=SOURCE,
                    model_cfg=lstm)
    with pytest.raises(ValueError, match="checkpoint model.arch='lstm'"):
        grow_checkpoint(tmp_path / "lstm", "d32-h4-l2-i64", tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ValueError, match="--out .* is not an empty directory"):
        grow_checkpoint(tmp_path / "lstm", "d32-h4-l2-i64", tmp_path / "full")
    with pytest.raises(ValueError, match="model.arch: only a BertForMaskedLM"):
        grow(nn.Linear(2, 2), parse_model("d32-h4-l2-i64"))
