"""Presets, shape strings, config validation and the analytic parameter counts."""

import dataclasses

import pytest

from flatlm.models.presets import (
    LSTM_GRID,
    PAPER_POSITIONS,
    PAPER_TOKEN_TYPES,
    PAPER_VOCAB,
    PRESETS,
    TABLE3,
    TABLE4,
    ModelConfig,
    describe,
    paper_parameter_count,
    parse_model,
    shape_string,
)

# Table 3 row -> (size the paper quotes, our paper-convention count). The convention is
# BertForMaskedLM in the BERT-base layout, tied decoder counted once, no pooler.
PAPER_SIZES = {
    "bert-2m": (2.1e6, 2_071_226),
    "bert-4.8m": (4.8e6, 4_813_242),
    "bert-8.3m": (8.3e6, 8_251_578),
    "bert-12.8m": (12.8e6, 12_781_114),
    "bert-41m": (41e6, 41_404_730),
    "bert-110m": (110e6, 109_514_298),
    "bert-234m": (234e6, 234_404_666),
    "bert-435m": (435e6, 434_950_202),
    "bert-730m": (730e6, 730_025_274),
}


@pytest.mark.parametrize("name", list(PAPER_SIZES))
def test_table3_reproduces_paper_sizes(name):
    quoted, exact = PAPER_SIZES[name]
    count = paper_parameter_count(PRESETS[name])
    assert count == exact
    assert abs(count / quoted - 1) < 0.03


def test_table3_shapes_match_the_paper():
    rows = [(c.d_model, c.n_heads, c.n_layers, c.d_inter) for c in TABLE3.values()]
    assert rows == [
        (64, 1, 1, 256), (128, 2, 4, 512), (192, 3, 5, 768), (256, 4, 6, 1024),
        (512, 8, 8, 2048), (768, 12, 12, 3072), (1024, 16, 16, 4096), (1280, 20, 20, 5120),
        (1536, 24, 24, 6144),
    ]
    assert all(c.d_model == 64 * c.n_heads for c in TABLE3.values())  # head size 64


@pytest.mark.parametrize("n_types", [1, PAPER_TOKEN_TYPES])
@pytest.mark.parametrize("name", ["bert-2m", "bert-4.8m"])
def test_paper_count_equals_instantiated_model(name, n_types):
    from transformers import BertForMaskedLM

    from flatlm.models.bert import bert_config
    from flatlm.models.presets import _bert_count

    cfg = PRESETS[name]
    config = bert_config(cfg, PAPER_VOCAB - 4, PAPER_POSITIONS - 2)
    config.type_vocab_size = n_types
    model = BertForMaskedLM(config)
    count = sum(p.numel() for p in model.parameters())
    assert count == _bert_count(cfg, PAPER_VOCAB, PAPER_POSITIONS, n_types)
    if n_types == PAPER_TOKEN_TYPES:
        assert count == paper_parameter_count(cfg)


def test_figure5_presets_follow_table4_with_4x_mlp():
    shapes = [(PRESETS[n].d_model, PRESETS[n].n_heads, PRESETS[n].n_layers) for n in TABLE4]
    assert shapes == [(128, 2, 4), (192, 3, 5), (320, 5, 6), (384, 6, 7), (640, 10, 12),
                      (960, 15, 16), (1920, 30, 20)]
    widths = [PRESETS[n].d_model for n in TABLE4]
    assert all(widths[-1] % w == 0 for w in widths)  # B.4 embeds each into the largest
    assert all(PRESETS[n].d_inter == 4 * PRESETS[n].d_model for n in TABLE4)
    assert abs(paper_parameter_count(PRESETS["bert-950m"]) / 950e6 - 1) < 0.01  # "2M to 950M"


def test_lstm_grid_is_a4():
    assert len(LSTM_GRID) == 25
    assert parse_model("lstm-h512-l8") == ModelConfig(arch="lstm", d_hidden=512, n_layers=8)
    assert {c.d_hidden for c in LSTM_GRID.values()} == {128, 256, 512, 768, 1024}
    assert {c.n_layers for c in LSTM_GRID.values()} == {4, 6, 8, 12, 16}


@pytest.mark.parametrize("name", list(PRESETS))
def test_shape_string_round_trips(name):
    cfg = PRESETS[name]
    assert parse_model(shape_string(cfg)) == cfg


def test_custom_shapes_parse():
    assert parse_model("d64-h1-l1-i256") == PRESETS["bert-2m"]
    assert parse_model("bert-d96-h3-l2-i200").d_inter == 200
    assert parse_model("lstm-h100-l3") == ModelConfig(arch="lstm", d_hidden=100, n_layers=3)
    cfg = ModelConfig(n_layers=1, d_model=8, n_heads=2, d_inter=16)
    assert parse_model(cfg) is cfg


def test_unknown_preset_names_the_field_and_lists_presets():
    with pytest.raises(ValueError, match="model 'bert-3m'") as err:
        parse_model("bert-3m")
    assert "bert-2m" in str(err.value) and "lstm-h256-l4" in str(err.value)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        (dict(d_model=100, n_heads=3, n_layers=2, d_inter=64), "d_model"),
        (dict(d_model=64, n_layers=2, d_inter=64), "n_heads"),
        (dict(d_model=64, n_heads=1, n_layers=0, d_inter=64), "n_layers"),
        (dict(d_model=64, n_heads=1, n_layers=1, d_inter=64, dropout=1.0), "dropout"),
        (dict(d_model=64, n_heads=1, n_layers=1, d_inter=64, attention="flash"), "attention"),
        (dict(d_model=64, n_heads=1, n_layers=1, d_inter=64, d_hidden=32), "d_hidden"),
        (dict(arch="gpt", n_layers=1), "arch"),
        (dict(arch="lstm", n_layers=2), "d_hidden"),
        (dict(arch="lstm", n_layers=2, d_hidden=32, d_model=64), "d_model"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_config_names_the_field(fields, field):
    with pytest.raises(ValueError, match=f"model.{field}"):
        ModelConfig(**fields)


def test_divisibility_error_says_the_fix():
    with pytest.raises(ValueError, match="not divisible by model.n_heads=3; pick d_model"):
        parse_model("d100-h3-l1-i64")


def test_config_is_frozen_and_replaceable():
    cfg = PRESETS["bert-2m"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dropout = 0.0
    assert dataclasses.replace(cfg, dropout=0.0, attention="eager").dropout == 0.0
    assert ModelConfig(**cfg.to_dict()) == cfg


def test_describe_every_preset():
    # With our synthetic sizes (V = 200 words -> 204 ids, T = 16 -> 18 positions).
    for name, cfg in PRESETS.items():
        line = describe(cfg, vocab_size=200, max_length=16)
        print(f"{name:14s} {line}")
        assert shape_string(cfg) in line and "parameters" in line
        assert ("paper convention" in line) == (cfg.arch == "bert")
    with pytest.raises(ValueError, match="model.arch='lstm'"):
        paper_parameter_count(PRESETS["lstm-h128-l4"])


@pytest.fixture
def own_presets():
    """The preset table as it is, restored after the test registers its own."""
    saved = dict(PRESETS)
    yield
    PRESETS.clear()
    PRESETS.update(saved)


def test_a_registered_preset_is_a_model_name_like_the_paper_s(own_presets):
    """Issue 51, item 1: the presets are a table plug-ins add to, checked as they are added."""
    from flatlm.models.presets import register_preset

    tiny = parse_model("d16-h1-l1-i32")
    register_preset("toy-tiny", tiny)
    assert parse_model("TOY-tiny") == tiny and parse_model("toy-tiny-pre").ln_mode == "pre"
    for name, needle in (("Toy", "lower-case"), ("toy-pre", "lower-case"),
                         ("d8-h1-l1-i16", "reads as the shape of another model"),
                         ("toy-tiny", "registered already")):
        with pytest.raises(ValueError, match=needle):
            register_preset(name, parse_model("bert-2m"))
    with pytest.raises(ValueError, match="add a preset with flatlm.models.presets.register_preset"):
        parse_model("toy-tinyy")
