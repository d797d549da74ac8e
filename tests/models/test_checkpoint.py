"""Checkpoints: transformers can load a BERT alone; flatlm.json rebuilds inputs without flatlm."""

import dataclasses
import json

import pytest
import torch
from transformers import BertForMaskedLM

from flatlm.models import (
    ModelConfig,
    build_model,
    encode,
    load_checkpoint,
    parse_model,
    save_checkpoint,
    word_logits,
)
from tests.models.conftest import random_sentences

V, T = 9, 6
SOURCE = {"kind": "dyck", "length": T}


def _batch(seed: int, n: int = 5):
    return random_sentences(seed, n, V, T)


def _train_a_step(model, seed: int):
    # Move the weights off their initialisation so a round trip is not trivially equal.
    ids, mask = encode(*_batch(seed))
    loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad


def test_bert_loads_with_transformers_alone(tmp_path):
    cfg = parse_model("d32-h2-l2-i64")
    model = build_model(cfg, V, T, seed=0)
    _train_a_step(model, seed=1)
    model.eval()
    save_checkpoint(model, tmp_path, source_spec=SOURCE, model_cfg=cfg, extra={"step": 1})
    loaded = BertForMaskedLM.from_pretrained(tmp_path, local_files_only=True).eval()
    emb = loaded.bert.embeddings.word_embeddings.weight
    assert loaded.cls.predictions.decoder.weight.data_ptr() == emb.data_ptr()  # still tied
    ids, mask = encode(*_batch(2))
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
        got = loaded(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(got, expected)  # bit for bit


def test_flatlm_json_rebuilds_inputs_without_flatlm(tmp_path):
    cfg = parse_model("d32-h2-l1-i64")
    save_checkpoint(build_model(cfg, V, T, seed=3), tmp_path, source_spec=SOURCE, model_cfg=cfg,
                    extra={"words": [f"w{c}" for c in range(V)]})
    info = json.loads((tmp_path / "flatlm.json").read_text())
    assert info["source"] == SOURCE and info["model"] == dataclasses.asdict(cfg)
    assert info["extra"]["words"][0] == "w0" and info["shape"] == "d32-h2-l1-i64"
    tok = info["tokens"]
    assert tok["special_tokens"] == {"[PAD]": 0, "[MASK]": 1, "[CLS]": 2, "[SEP]": 3}
    assert (tok["word_offset"], tok["n_words"], tok["vocab_size"]) == (4, V, V + 4)
    assert (tok["max_length"], tok["n_positions"]) == (T, T + 2)
    assert tok["input_layout"] == "[CLS] x_1 .. x_T [SEP], padding [PAD]"
    # A reader with only the json: words [3, 0] -> [CLS] 7 4 [SEP] [PAD]..
    special = tok["special_tokens"]
    by_hand = ([special["[CLS]"]] + [c + tok["word_offset"] for c in (3, 0)] + [special["[SEP]"]]
               + [special["[PAD]"]] * (tok["n_positions"] - 4))
    ids, _ = encode(torch.tensor([[3, 0] + [-1] * (T - 2)]), torch.tensor([2]))
    assert ids[0].tolist() == by_hand


@pytest.mark.parametrize("shape", ["d32-h2-l2-i64", "lstm-h16-l2"])
def test_load_checkpoint_round_trip(tmp_path, shape):
    cfg = dataclasses.replace(parse_model(shape), dropout=0.0, attention="eager")
    model = build_model(cfg, V, T, seed=4)
    _train_a_step(model, seed=5)
    model.eval()
    save_checkpoint(model, tmp_path, source_spec=SOURCE, model_cfg=cfg)
    loaded, info = load_checkpoint(tmp_path)
    assert ModelConfig(**info["model"]) == cfg and not loaded.training
    assert info["n_parameters"] == sum(p.numel() for p in model.parameters())
    if cfg.arch == "bert":
        assert loaded.config._attn_implementation == "eager"
    ids, mask = encode(*_batch(6))
    with torch.no_grad():
        assert torch.equal(word_logits(loaded, ids, mask), word_logits(model, ids, mask))


def test_save_refuses_a_config_of_another_arch(tmp_path):
    model = build_model(parse_model("lstm-h8-l1"), V, T, seed=7)
    with pytest.raises(ValueError, match="model_cfg.arch='bert'"):
        save_checkpoint(model, tmp_path, source_spec=SOURCE, model_cfg=parse_model("bert-2m"))


def test_load_refuses_a_directory_without_flatlm_json(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path)


def test_saving_draws_no_shard_progress_bar_and_keeps_the_callers_setting(tmp_path, capsys):
    from transformers.utils import logging as hf_logging

    cfg = parse_model("d32-h2-l2-i64")
    hf_logging.enable_progress_bar()
    save_checkpoint(build_model(cfg, V, T, seed=0), tmp_path, source_spec=SOURCE, model_cfg=cfg)
    captured = capsys.readouterr()
    assert "Writing model shards" not in captured.err + captured.out
    assert hf_logging.is_progress_bar_enabled()


def test_a_damaged_flatlm_json_is_named(tmp_path):
    cfg = parse_model("d32-h2-l2-i64")
    save_checkpoint(build_model(cfg, V, T, seed=0), tmp_path, source_spec=SOURCE, model_cfg=cfg)
    (tmp_path / "flatlm.json").write_text('{"format": "flatlm.checkpoint')
    with pytest.raises(ValueError, match=r"flatlm\.json is not valid JSON"):
        load_checkpoint(tmp_path)
