"""Real text (paper A.1: OpenWebText / BookCorpus, bert-large-uncased tokens, length 128).

The corpus is read with ``datasets`` (local ``.txt`` files, one document per line, or a hub
dataset's ``text`` column), tokenised with a ``transformers`` tokenizer, the documents joined with
the tokenizer's [SEP] and packed into blocks of exactly T = ``length`` words (the remainder is
dropped). A fixed fraction of the blocks, chosen by ``seed``, is the validation split: ``sample``
draws training blocks (uniformly, with replacement), ``sample_validation`` held-out ones.

**No truth.** Nobody knows Pr(x_t = c | x_{-t}) of real text: ``has_truth`` is False and
``conditionals`` raises. The measurements say what they skip (``flatlm.measure.run``): the
pre-training loss is the one-hot validation loss, and there is no entropy, KL, true-label Hessian
or lookup table.

Words are the tokenizer's tokens except [PAD], [CLS] and [MASK] (flatlm's layout adds those);
[SEP] and [UNK] stay words, so a sentence pair reads ``s1 [SEP] s2``. Downstream tasks are
GLUE's (``glue``: a directory of GLUE-shaped task folders, ``flatlm.sources.glue_files``):
``sample_downstream`` gives the rows of every task's train and dev files, each labelled for its
own task and -1 for the others, cut to T words; ``glue_split`` gives one task's train or dev
split for GLUE fine-tuning (``flatlm.measure.probes.glue``).

Spec fields (``text:FILES,tokenizer=...``): ``files`` (a ``.txt`` file, a directory of them, or
a hub dataset id), ``tokenizer`` (a ``save_pretrained`` directory or a hub id, e.g.
``bert-large-uncased``), ``length`` (T words, default 128; the model reads T + 2 positions with
[CLS] and [SEP], so ``length=126`` is BERT's 128 positions), ``validation`` (held-out share of
blocks, default 0.05), ``seed`` (the split, default 0), ``glue`` (optional directory),
``max_documents`` (read at most this many documents, streamed from the hub; default all).

Limits: the corpus is tokenised and packed in memory once per process (fine for millions of
tokens, not for all of OpenWebText: cap it with ``max_documents``); STS-B (regression) is not a
task.
"""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path

import numpy as np
import torch

from flatlm.core.seeds import generator
from flatlm.sources.base import PAD, Source, SourceError
from flatlm.sources.glue_files import read_glue

DEFAULTS = {"tokenizer": None, "length": 128, "validation": 0.05, "seed": 0, "glue": None,
            "max_documents": None}
NOT_WORDS = ("pad_token", "cls_token", "mask_token")  # flatlm's layout has its own


def _checked_spec(spec: dict) -> dict:
    unknown = [k for k in spec if k not in ("kind", "files", *DEFAULTS)]
    if unknown:
        raise SourceError(f"text spec: unknown key(s) {unknown}; allowed keys are files, "
                          f"{', '.join(DEFAULTS)}")
    spec = {"kind": "text", "files": spec.get("files"), **DEFAULTS, **spec}
    for key in ("files", "tokenizer"):
        if not isinstance(spec[key], str) or not spec[key]:
            raise SourceError(f"text spec: {key!r} is required, e.g. text:corpus.txt,"
                              "tokenizer=bert-large-uncased")
    for key, lo in (("length", 1), ("seed", 0), ("max_documents", 1)):
        value = spec[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < lo):
            raise SourceError(f"text spec: {key!r} must be an integer >= {lo}, got {value!r}")
    if not isinstance(spec["validation"], float | int) or not 0 < spec["validation"] < 1:
        raise SourceError(f"text spec: 'validation' must lie in (0, 1), got "
                          f"{spec['validation']!r}")
    for key in ("files", "tokenizer", "glue"):
        if spec[key] is not None and os.path.exists(os.path.expanduser(spec[key])):
            spec[key] = os.path.abspath(os.path.expanduser(spec[key]))
    if spec["glue"] is not None and not os.path.isdir(spec["glue"]):
        raise SourceError(f"text spec: 'glue' {spec['glue']!r} is not a directory")
    return spec


def _documents(files: str, max_documents: int | None) -> list[str]:
    """The corpus's non-empty documents (lines of local files, or a hub dataset's ``text``)."""
    from datasets import load_dataset

    path = Path(files)
    if path.is_dir():
        data_files = sorted(str(p) for p in path.glob("*.txt"))
        if not data_files:
            raise SourceError(f"text spec: 'files' {files} holds no .txt file")
        ds = load_dataset("text", data_files=data_files, split="train")
    elif path.is_file():
        ds = load_dataset("text", data_files=str(path), split="train")
    else:
        ds = load_dataset(files, split="train", streaming=max_documents is not None)
    if max_documents is not None:
        ds = ds.take(max_documents)
    return [d for d in (row["text"].strip() for row in ds) if d]


def _words(tokenizer) -> tuple[np.ndarray, list[str]]:
    """(tokenizer ids of the words [V], their strings): every token but [PAD], [CLS], [MASK]."""
    drop = {getattr(tokenizer, f"{name}_id", None) for name in NOT_WORDS}
    ids = np.array([i for i in range(len(tokenizer)) if i not in drop], dtype=np.int64)
    return ids, tokenizer.convert_ids_to_tokens(ids.tolist())


def _to_words(token_ids: np.ndarray, word_of: np.ndarray) -> np.ndarray:
    words = word_of[token_ids]
    return words[words >= 0]  # a stray [CLS] / [MASK] in the text is not a word


def _blocks(documents: list[str], tokenizer, word_of: np.ndarray, T: int) -> np.ndarray:
    """The documents' word ids joined by [SEP], cut into [n, T] blocks."""
    encoded = tokenizer(documents, add_special_tokens=False)["input_ids"]
    sep = [tokenizer.sep_token_id] if tokenizer.sep_token_id is not None else []
    stream = np.fromiter((t for ids in encoded for t in (*ids, *sep)), dtype=np.int64)
    words = _to_words(stream, word_of)
    n = len(words) // T
    return words[: n * T].reshape(n, T)


@functools.lru_cache(maxsize=4)
def _corpus(spec_json: str):
    """(tokenizer, word ids [V], words, train blocks, validation blocks), once per process."""
    from transformers import AutoTokenizer

    spec = json.loads(spec_json)
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec["tokenizer"])
    except (OSError, ValueError) as e:
        raise SourceError(f"text spec: 'tokenizer' {spec['tokenizer']!r} cannot be loaded: "
                          f"{e}") from None
    ids, words = _words(tokenizer)
    word_of = np.full(len(tokenizer), -1, dtype=np.int64)
    word_of[ids] = np.arange(len(ids))
    blocks = _blocks(_documents(spec["files"], spec["max_documents"]), tokenizer, word_of,
                     spec["length"])
    n_val = math.ceil(spec["validation"] * len(blocks))
    if len(blocks) - n_val < 1:
        raise SourceError(f"text spec: {spec['files']} gives {len(blocks)} block(s) of "
                          f"{spec['length']} words, too few to hold out {n_val}; lower 'length' "
                          "or add text")
    order = torch.randperm(len(blocks), generator=generator(spec["seed"], "text-split")).numpy()
    train, val = blocks[order[n_val:]], blocks[order[:n_val]]
    return tokenizer, word_of, words, torch.from_numpy(train), torch.from_numpy(val)


class TextCorpus(Source):
    """Packed blocks of tokenised real text, and GLUE tasks; see the module docstring."""

    label_rules = ("gold",)  # the task files' own labels
    has_truth = False

    def __init__(self, spec: dict):
        self.spec = _checked_spec(spec)
        self.tokenizer, self._word_of, self.vocab, self.train_blocks, self.validation_blocks = \
            _corpus(json.dumps({k: v for k, v in self.spec.items() if k != "glue"}))
        self.max_length = self.spec["length"]
        self.glue = {}
        if self.spec["glue"] is not None:

            try:
                self.glue = read_glue(self.spec["glue"])
            except ValueError as e:
                raise SourceError(str(e)) from None
        self.tasks = self.glue_tasks = tuple(self.glue)
        self._encoded: dict[tuple[str, str], tuple] = {}  # (task, split) -> (tokens, lengths)

    @classmethod
    def from_spec(cls, spec: dict) -> TextCorpus:
        return cls(spec)

    def sample(self, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """n training blocks drawn uniformly with replacement (a pure function of ``seed``)."""
        rows = torch.randint(0, len(self.train_blocks), (n,), generator=generator(seed, "text"))
        return self.train_blocks[rows], torch.full((n,), self.max_length, dtype=torch.int64)

    def sample_validation(self, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """min(n, held-out blocks) validation blocks, without replacement."""
        order = torch.randperm(len(self.validation_blocks), generator=generator(seed, "text"))
        rows = order[:n]
        return self.validation_blocks[rows], torch.full((len(rows),), self.max_length,
                                                        dtype=torch.int64)

    def _conditionals_batch(self, tokens, lengths, dtype):
        raise SourceError("the text source has no exact conditionals (real text has no known "
                          "truth); measure the one-hot loss (pretrain/loss_data) instead")

    # ---- GLUE -----------------------------------------------------------------------------------

    def encode_texts(self, texts: list[tuple[str, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of one or two texts -> (word ids [n, T] padded -1, lengths [n]): a pair is
        ``s1 [SEP] s2``, cut to T words. Each column is tokenised in one batched call."""
        sep = [self.tokenizer.sep_token_id] if self.tokenizer.sep_token_id is not None else []
        T = self.max_length
        tokens = torch.full((len(texts), T), PAD, dtype=torch.int64)
        lengths = torch.zeros(len(texts), dtype=torch.int64)
        columns = [self.tokenizer(list(column), add_special_tokens=False)["input_ids"]
                   for column in zip(*texts, strict=True)] if texts else []
        for i, parts in enumerate(zip(*columns, strict=True)):
            ids = [t for k, p in enumerate(parts) for t in ((*sep, *p) if k else p)]
            words = _to_words(np.asarray(ids, dtype=np.int64), self._word_of)[:T]
            if len(words) == 0:
                words = self._word_of[[self.tokenizer.unk_token_id]]  # an empty text: [UNK]
            tokens[i, : len(words)] = torch.from_numpy(words)
            lengths[i] = len(words)
        return tokens, lengths

    def glue_split(self, task: str, split: str):
        """(tokens, lengths, labels) of ``task``'s ``split`` ("train" or "dev"), encoded once
        (every checkpoint's fine-tuning reads the same rows)."""
        self.check_downstream(None, (task,))
        data = self.glue[task]
        if (task, split) not in self._encoded:
            self._encoded[task, split] = self.encode_texts(data.texts[split])
        tokens, lengths = self._encoded[task, split]
        return tokens, lengths, torch.tensor(data.labels[split], dtype=torch.int64)

    def num_classes(self, task: str) -> int:
        return self.glue[task].num_classes

    def labels(self, tokens, lengths, task: str, **options) -> torch.Tensor:
        raise SourceError("the text source labels only its GLUE rows (sample_downstream); it "
                          "cannot label arbitrary sentences")

    def _labelled_sample(self, n, seed, rule, tasks, device):
        """Every requested task's train + dev rows (each -1 for the other tasks), a seeded
        permutation of them, the first n."""
        parts, labels = [], []
        for task in tasks:
            for split in ("train", "dev"):
                tok, ln, y = self.glue_split(task, split)
                parts.append((tok, ln))
                labels += [(task, y)]
        tokens = torch.cat([p[0] for p in parts])
        lengths = torch.cat([p[1] for p in parts])
        raw, start = {t: torch.full((len(tokens),), PAD, dtype=torch.int64) for t in tasks}, 0
        for task, y in labels:
            raw[task][start : start + len(y)] = y
            start += len(y)
        rows = torch.randperm(len(tokens), generator=generator(seed, "glue"))[:n]
        return tokens[rows], lengths[rows], {t: y[rows] for t, y in raw.items()}

    def _fingerprint_arrays(self) -> list[np.ndarray]:
        arrays = [self.train_blocks.numpy(), self.validation_blocks.numpy()]
        for task in self.tasks:
            for split in ("train", "dev"):
                arrays.append(np.asarray(self.glue[task].labels[split], dtype=np.int64))
                text = "\n".join("\t".join(r) for r in self.glue[task].texts[split])
                arrays.append(np.frombuffer(text.encode(), dtype=np.uint8))
        return arrays
