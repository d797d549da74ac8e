"""The text source (real corpora, no truth) and its GLUE-shaped tasks, on tiny local files and a
tokenizer built here: packing against tokenising by hand, the held-out split, the GLUE rows and
labels, and the errors for bad specs."""


import numpy as np
import pytest
import torch

from flatlm.sources import SourceError, SourceSpec, load  # noqa: E402
from tests.assets.text_assets import make_text_assets, text_spec  # noqa: E402


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_text_assets(tmp_path_factory.mktemp("text"))


@pytest.fixture(scope="module")
def src(assets):
    return load(text_spec(assets, length=16))


def test_blocks_are_the_hand_tokenised_corpus_packed_and_split_without_overlap(src, assets):
    tok = src.tokenizer
    stream = []
    for line in assets["corpus"].read_text().splitlines():
        stream += tok(line.strip(), add_special_tokens=False)["input_ids"] + [tok.sep_token_id]
    words = [src.vocab.index(t) for t in tok.convert_ids_to_tokens(stream)]
    n = len(words) // 16
    expected = {tuple(words[i * 16 : (i + 1) * 16]) for i in range(n)}
    train = [tuple(r) for r in src.train_blocks.tolist()]
    val = [tuple(r) for r in src.validation_blocks.tolist()]
    assert len(train) + len(val) == n and len(val) == int(np.ceil(0.05 * n))
    assert set(train) | set(val) == expected
    assert not {"[PAD]", "[CLS]", "[MASK]"} & set(src.vocab) and "[SEP]" in src.vocab


def test_sampling_is_seeded_and_validation_is_held_out(src):
    a, la = src.sample(50, seed=3)
    b, _ = src.sample(50, seed=3)
    assert torch.equal(a, b) and not torch.equal(a, src.sample(50, seed=4)[0])
    assert (la == 16).all()
    val, lv = src.sample_validation(1000, seed=0)  # fewer exist: all of them, once each
    assert len(val) == len(lv) == len(src.validation_blocks)
    assert sorted(map(tuple, val.tolist())) == sorted(map(tuple, src.validation_blocks.tolist()))
    assert not src.has_truth
    with pytest.raises(SourceError, match="no exact conditionals"):
        src.conditionals(a[:2], la[:2])


def test_glue_rows_are_the_files_texts_and_labels(src, assets):
    assert src.tasks == ("mrpc", "sst2") and src.num_classes("sst2") == 2
    rows = (assets["glue"] / "MRPC" / "dev.tsv").read_text().splitlines()[1:]
    s1, s2, label = rows[0].split("\t")
    tokens, lengths, labels = src.glue_split("mrpc", "dev")
    words = [src.vocab[i] for i in tokens[0, : lengths[0]].tolist()]
    tok = src.tokenizer
    by_hand = tok.tokenize(s1) + ["[SEP]"] + tok.tokenize(s2)
    assert words == by_hand[:16] and int(labels[0]) == int(label)
    assert len(labels) == len(rows)
    tok_d, len_d, classes = src.sample_downstream(10_000, seed=0)
    n_rows = sum(len(src.glue_split(t, s)[2]) for t in src.tasks for s in ("train", "dev"))
    assert len(tok_d) == n_rows  # every row once
    both = (classes["mrpc"] >= 0) & (classes["sst2"] >= 0)
    assert not both.any() and ((classes["mrpc"] >= 0) | (classes["sst2"] >= 0)).all()


@pytest.mark.parametrize(("change", "message"), [
    ({"tokenizer": None}, "'tokenizer' is required"),
    ({"validation": 1.5}, "'validation' must lie in"),
    ({"length": 0}, "'length' must be an integer"),
    ({"colour": 1}, "unknown key"),
    ({"length": 100_000}, "too few to hold out"),
])
def test_bad_specs_name_the_field(assets, change, message):
    spec = {"kind": "text", "files": str(assets["corpus"]), "tokenizer": str(assets["tokenizer"]),
            "length": 16, **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    with pytest.raises(SourceError, match=message):
        SourceSpec(spec)


def test_a_glue_file_without_the_tasks_columns_is_named(assets, tmp_path):
    bad = tmp_path / "glue" / "CoLA"
    bad.mkdir(parents=True)
    for split in ("train", "dev"):
        (bad / f"{split}.tsv").write_text("text\tlabel\na b\t1\n")
    with pytest.raises(SourceError, match=r"CoLA/train.tsv lacks column\(s\) \['sentence'\]"):
        load(f"text:{assets['corpus']},tokenizer={assets['tokenizer']},length=16,"
             f"glue={tmp_path / 'glue'}")


def test_a_corpus_of_text_refuses_an_entropy_before_any_work(src, tmp_path):
    from flatlm.corpus import CorpusConfig, make_corpus

    with pytest.raises(ValueError, match=r"no truth, so no entropy; use n_entropy=0"):
        make_corpus(src, CorpusConfig(n_train=10, seed=0), tmp_path / "c", progress=False)
    assert not (tmp_path / "c").exists()
