"""GLUE tasks of the LM source (``lm:MODEL,...,glue=DIR``): the rows against tokenising by hand
with the LM's own tokenizer, the out-of-vocabulary drop and its reported share, the pair rule,
the errors, and GLUE fine-tuning beside the mask-k probes in one ``measure_model`` call. A tiny
random GPT-2 with a WordPiece tokenizer of its own, no download."""

import csv
import logging
from pathlib import Path

import pytest
import torch

from flatlm.measure.probes.finetune import FinetuneConfig  # noqa: E402
from flatlm.measure.probes.probe import ProbeConfig  # noqa: E402
from flatlm.measure.run import MeasureConfig, downstream_of, eval_data, measure_model  # noqa: E402
from flatlm.models.masked_lm import build_model  # noqa: E402
from flatlm.models.presets import parse_model  # noqa: E402
from flatlm.sources import SourceError, load  # noqa: E402
from tests.assets.lm_assets import lm_glue_spec, make_lm_assets  # noqa: E402


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_lm_assets(tmp_path_factory.mktemp("lm_glue"))


@pytest.fixture(scope="module")
def src(assets):
    return load(lm_glue_spec(assets))


@pytest.fixture(scope="module")
def tokenizer(assets):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(assets["lm"])


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def _by_hand(src, tokenizer, text: str) -> tuple[list[int], int]:
    """(the text's words, uncut, and how many of its tokens are not words): one tokenizer call,
    each token id looked up in the source's word list."""
    token_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    word_ids = src.ids.tolist()
    words = [word_ids.index(t) for t in token_ids if t in word_ids]
    return words, len(token_ids) - len(words)


@pytest.mark.parametrize("vocab", [40, 140])  # most tokens dropped; nearly none (rows cut to T)
def test_glue_rows_are_the_lm_tokenizers_tokens_in_the_sources_words(assets, tokenizer, vocab,
                                                                     caplog):
    src = load(lm_glue_spec(assets, vocab=vocab))
    assert src.glue_tasks == ("mrpc", "sst2")
    T, cut = src.max_length, False
    with caplog.at_level(logging.WARNING):
        for task, folder, fields in (("sst2", "SST-2", ["sentence"]),
                                     ("mrpc", "MRPC", ["sentence1", "sentence2"])):
            kept = dropped = 0
            for split in ("train", "dev"):
                tokens, lengths, labels = src.glue_split(task, split)
                rows = _rows(assets["glue"] / folder / f"{split}.tsv")
                assert labels.tolist() == [int(r["label"]) for r in rows]
                for i, row in enumerate(rows):
                    words, n_dropped = _by_hand(src, tokenizer, "\n".join(row[f] for f in fields))
                    assert tokens[i, : lengths[i]].tolist() == words[:T]
                    assert (tokens[i, lengths[i] :] == -1).all()
                    kept, dropped = kept + len(words), dropped + n_dropped
                    cut |= len(words) > T
            assert src.glue_oov_fraction(task) == pytest.approx(dropped / (kept + dropped))
        src.glue_split("sst2", "train")  # encoded once: no second warning
    assert caplog.text.count("GLUE task sst2") == 1
    oov = src.glue_oov_fraction("sst2")
    assert (0.5 < oov < 0.95) if vocab == 40 else (oov < 0.1 and cut)


def test_a_word_outside_the_vocabulary_is_dropped_and_a_pair_joins_at_a_line_break(src,
                                                                                   tokenizer):
    known = [w for w in src.vocab if w.isalpha()][:2]
    unknown = next(w for w in tokenizer.get_vocab() if w.isalpha() and w not in src.vocab)
    tokens, lengths, dropped, total = src._glue.encode(
        [(f"{known[0]} {unknown} {known[1]}",), (known[1], f"{unknown} {known[0]}")])
    first, second = src.vocab.index(known[0]), src.vocab.index(known[1])
    assert tokens[:, :2].tolist() == [[first, second], [second, first]]
    assert lengths.tolist() == [2, 2] and (dropped, total) == (2, 6)


def test_mask_tasks_stay_the_probe_tasks(src):
    assert src.tasks == tuple(f"mask-{k}" for k in range(1, 13))
    assert src.num_classes("sst2") == 2 and src.num_classes("mask-1") == 4
    _, _, labels = src.sample_downstream(4, seed=0, tasks=("mask-1",))
    assert set(labels) == {"mask-1"} and labels["mask-1"].min() >= 0
    with pytest.raises(ValueError, match="'mask-1' is not one of its GLUE tasks"):
        src.glue_split("mask-1", "train")


def test_glue_without_the_lms_tokenizer_is_an_error_naming_glue_and_the_fix(tmp_path):
    assets = make_lm_assets(tmp_path, n_glue=10, tokenizer=False)
    with pytest.raises(SourceError, match=r"lm spec 'glue': the model .* has no tokenizer.*"
                                          r"tokenizer\.save_pretrained\(DIR\)\) or drop 'glue'"):
        load(lm_glue_spec(assets))
    with pytest.raises(SourceError, match="lm spec: 'glue' .* is not a directory"):
        load(lm_glue_spec(assets).replace("glue=", "glue=/no/such/"))
    no_glue = load(f"lm:{assets['lm']},vocab=40,length=12,rule=bos")
    assert "glue" not in no_glue.spec and no_glue.glue_tasks == ()
    with pytest.raises(ValueError, match="measure.what: 'glue' needs .* lm:MODEL,...,glue=DIR"):
        downstream_of(no_glue, MeasureConfig(what=("glue",)))


def test_measure_model_fine_tunes_on_glue_beside_the_mask_probe(src):
    cfg = MeasureConfig(what=("probe", "glue"), tasks=("mask-1",), n_eval=2, n_downstream=20,
                        sections=dict(probe=ProbeConfig(epochs=2, seeds=1),
                                      finetune=FinetuneConfig(epochs=1, seeds=1,
                                                              warmup_steps=1)))
    data = eval_data(src, cfg)
    model = build_model(parse_model("d16-h1-l1-i32"), src.V, src.max_length, seed=0).eval()
    torch.manual_seed(0)
    out = measure_model(model, src, data, cfg, "cpu")
    assert 0.0 <= out["probe/mask-1/acc_mean"] <= 1.0
    for task in ("sst2", "mrpc"):
        assert 0.0 <= out[f"glue/{task}/accuracy"] <= 1.0
        assert out[f"glue/{task}/oov_fraction"] == src.glue_oov_fraction(task)
    assert 0.0 <= out["glue/mrpc/f1"] <= 1.0
