"""Corpora on disk: byte-identical repeats, independent splits, metadata, round trips, tampering."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from flatlm.core.stats import ratio_mean_se
from flatlm.core.tokens import SPECIAL_TOKENS, WORD_OFFSET
from flatlm.corpus import (
    SPLITS,
    CorpusConfig,
    chunk_seeds,
    corpus_tensors,
    load_corpus,
    make_corpus,
)
from flatlm.sources import load
from flatlm.sources.base import entropy_rows

TINY_PCFG = {"kind": "pcfg", "random": {"vocab": 10, "depth": 2, "nonterminals_per_level": 3},
             "seed": 1}
TINY_HMM = "hmm:seed=0,states=8,vocab=12,blocks=2,length=6"
SOURCES = {"dyck": "dyck:6", "pcfg": TINY_PCFG, "hmm": TINY_HMM}


def files_of(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def make(spec, out, **cfg):
    cfg = {"n_train": 60, "n_validation": 20, "n_downstream": 30, "seed": 3, **cfg}
    return make_corpus(load(spec), CorpusConfig(**cfg), out, progress=False)


@pytest.mark.parametrize("kind", SOURCES)
def test_same_seed_gives_byte_identical_files(kind, tmp_path):
    a = files_of(make(SOURCES[kind], tmp_path / "a", chunk_size=16))
    b = files_of(make(SOURCES[kind], tmp_path / "b", chunk_size=16))
    assert a.keys() == b.keys()
    assert {"metadata.json", "dataset_dict.json", "train/state.json",
            "downstream/data-00000-of-00001.arrow"} <= a.keys()
    for name in a:
        assert a[name] == b[name], name


def test_other_seed_gives_other_data(tmp_path):
    a = files_of(make("dyck:6", tmp_path / "a", seed=3))
    b = files_of(make("dyck:6", tmp_path / "b", seed=4))
    for split in SPLITS:
        arrow = f"{split}/data-00000-of-00001.arrow"
        assert a[arrow] != b[arrow], split


def test_splits_have_distinct_seeds_and_data(tmp_path):
    splits, meta = load_corpus(make(TINY_HMM, tmp_path / "c", n_validation=60))
    seeds = [s for split in SPLITS for s in meta["splits"][split]["chunk_seeds"]]
    assert len(set(seeds)) == len(seeds)
    train, _ = corpus_tensors(splits["train"])
    validation, _ = corpus_tensors(splits["validation"])
    assert not torch.equal(train, validation)


def test_chunk_seeds_depend_on_split_and_chunk_only():
    assert chunk_seeds(5, "train", 10, 4) == chunk_seeds(5, "train", 9, 4)  # 3 chunks each
    assert chunk_seeds(5, "train", 12, 4)[:2] == chunk_seeds(5, "train", 8, 4)
    assert chunk_seeds(5, "train", 4, 4) != chunk_seeds(6, "train", 4, 4)


def test_metadata_records_the_source_and_layout(tmp_path):
    src = load(TINY_PCFG)
    _, meta = load_corpus(make(TINY_PCFG, tmp_path / "c"))
    assert meta["source"] == {"spec": src.spec, "kind": "pcfg", "fingerprint": src.fingerprint()}
    assert meta["vocab"] == src.vocab and meta["max_length"] == src.max_length
    assert meta["special_tokens"] == SPECIAL_TOKENS and meta["word_offset"] == WORD_OFFSET
    assert meta["padding"] == -1 and meta["seed"] == 3
    assert {s: v["n"] for s, v in meta["splits"].items()} == {
        "train": 60, "validation": 20, "downstream": 30}
    assert meta["label_rule"] == "posterior" and meta["tasks"] == ["A", "B", "C"]
    assert meta["num_classes"] == {t: src.num_classes(t) for t in src.tasks}
    assert meta["config"]["n_entropy"] == 20_000 and meta["entropy_n_sentences"] == 20
    arrows = [name for name in meta["files"] if name.endswith(".arrow")]
    assert len(arrows) == 3 and all(len(h) == 64 for h in meta["files"].values())


def test_metadata_entropy_is_the_validation_splits(tmp_path):
    src = load(TINY_HMM)
    splits, meta = load_corpus(make(TINY_HMM, tmp_path / "c", n_validation=50, n_entropy=40))
    tokens, lengths = corpus_tensors(splits["validation"])
    probs = src.conditionals(tokens[:40], lengths[:40], dtype=torch.float64)
    mean, se = ratio_mean_se(entropy_rows(probs).sum(-1).numpy(), lengths[:40].numpy())
    assert meta["entropy"] == pytest.approx(mean, abs=1e-9)
    assert meta["entropy_se"] == pytest.approx(se, abs=1e-9)
    assert (meta["entropy_n_sentences"], meta["entropy_n_tokens"]) == (40, 240)


def test_default_split_sizes():
    cfg = CorpusConfig(n_train=95)
    assert (cfg.n_validation, cfg.n_downstream) == (9, 9)
    assert CorpusConfig(n_train=3).n_validation == 1
    with pytest.raises(ValueError, match="n_train"):
        CorpusConfig(n_train=0)
    with pytest.raises(ValueError, match="seed"):
        CorpusConfig(n_train=5, seed=-1)


def regenerate(src, split, n, seeds, chunk):
    """What the module docstring promises: chunk k is src's sampler at seed k."""
    sampler = {"downstream": getattr(src, "sample_downstream", src.sample)}.get(split, src.sample)
    parts = [sampler(min(chunk, n - k * chunk), s) for k, s in enumerate(seeds)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


@pytest.mark.parametrize("kind", SOURCES)
def test_round_trip_equals_the_sources_samples(kind, tmp_path):
    src = load(SOURCES[kind])
    splits, meta = load_corpus(make(SOURCES[kind], tmp_path / "c", chunk_size=16), source=src)
    for split in SPLITS:
        tokens, lengths = corpus_tensors(splits[split])
        info = meta["splits"][split]
        want_tokens, want_lengths = regenerate(src, split, info["n"], info["chunk_seeds"], 16)
        assert tokens.dtype == lengths.dtype == torch.int64
        assert torch.equal(tokens, want_tokens) and torch.equal(lengths, want_lengths), split


def test_pcfg_labels_equal_the_sources(tmp_path):
    src = load(TINY_PCFG)
    splits, meta = load_corpus(make(TINY_PCFG, tmp_path / "c", label_rule="posterior"))
    tokens, lengths = corpus_tensors(splits["downstream"])
    assert meta["label_rule"] == "posterior"
    for task in src.tasks:
        want = src.labels(tokens, lengths, task, rule="posterior")
        assert splits["downstream"][f"label_{task}"] == want.tolist(), task


def test_hmm_labels_are_the_sampled_states_by_default(tmp_path):
    src = load(TINY_HMM)
    splits, meta = load_corpus(make(TINY_HMM, tmp_path / "c"))
    seed = meta["splits"]["downstream"]["chunk_seeds"][0]
    _, _, states = src.sample_with_states(30, seed)
    assert meta["label_rule"] == "sampled" and meta["num_classes"]["task-6"] == 8
    for k in range(1, 7):
        assert splits["downstream"][f"label_task-{k}"] == states[:, k - 1].tolist()


def test_hmm_posterior_labels_and_task_selection(tmp_path):
    src = load(TINY_HMM)
    splits, meta = load_corpus(make(TINY_HMM, tmp_path / "c", label_rule="posterior",
                                    tasks=("task-2", "task-5")))
    tokens, lengths = corpus_tensors(splits["downstream"])
    assert meta["tasks"] == ["task-2", "task-5"]
    assert set(splits["downstream"].column_names) == {"tokens", "length", "label_task-2",
                                                      "label_task-5"}
    want = src.labels(tokens, lengths, "task-5", rule="posterior")
    assert splits["downstream"]["label_task-5"] == want.tolist()


def test_dyck_downstream_is_iid_with_offset_gstar_labels(tmp_path):
    src = load("dyck:6")
    splits, meta = load_corpus(make("dyck:6", tmp_path / "c", n_downstream=200))
    tokens, lengths = corpus_tensors(splits["downstream"])
    assert (tokens == 0).sum(1).ne(3).any()  # i.i.d. brackets, not only balanced strings
    labels = np.array(splits["downstream"]["label_g_star"])
    assert meta["label_offset"] == {"g_star": 6} and meta["num_classes"] == {"g_star": 13}
    np.testing.assert_array_equal(labels - 6, src.labels(tokens, lengths).numpy())
    assert labels.min() >= 0 and labels.max() < 13


def test_tampered_split_is_refused(tmp_path):
    out = make("dyck:6", tmp_path / "c")
    arrow = out / "train" / "data-00000-of-00001.arrow"
    data = bytearray(arrow.read_bytes())
    data[-100] ^= 1
    arrow.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="train/data-00000-of-00001.arrow"):
        load_corpus(out)
    load_corpus(out, verify=False)  # the check, not datasets, refused it


def test_load_refuses_other_sources_and_unfinished_dirs(tmp_path):
    out = make("dyck:6", tmp_path / "c")
    with pytest.raises(ValueError, match="another language"):
        load_corpus(out, source=load("dyck:8"))
    (out / "metadata.json").unlink()
    with pytest.raises(ValueError, match="metadata.json"):
        load_corpus(out)


def test_make_refuses_bad_rules_tasks_and_full_dirs(tmp_path):
    with pytest.raises(ValueError, match="label rule 'viterbi'"):
        make(TINY_HMM, tmp_path / "a", label_rule="viterbi")
    with pytest.raises(ValueError, match="unknown task"):
        make("dyck:6", tmp_path / "b", tasks=("task-1",))
    make("dyck:6", tmp_path / "c")
    with pytest.raises(ValueError, match="not empty"):
        make("dyck:6", tmp_path / "c")


def test_corpus_tensors_follow_row_selection(tmp_path):
    splits, _ = load_corpus(make(TINY_PCFG, tmp_path / "c"))
    tokens, lengths = corpus_tensors(splits["train"])
    picked = splits["train"].select([5, 1, 7])
    sel_tokens, sel_lengths = corpus_tensors(picked)
    assert torch.equal(sel_tokens, tokens[[5, 1, 7]])
    assert torch.equal(sel_lengths, lengths[[5, 1, 7]])
    real = torch.arange(tokens.shape[1])[None, :] < lengths[:, None]
    assert (tokens[~real] == -1).all() and (tokens[real] >= 0).all()


def test_metadata_json_is_plain(tmp_path):
    out = make("dyck:6", tmp_path / "c")
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["format"] == "flatlm.corpus/1" and meta["flatlm_version"]
