"""GLUE tasks for the LM-text source (paper A.1: its OPT-text models are fine-tuned on QNLI and
SST-2): GLUE-shaped task files (``flatlm.sources.glue_files``) read in the source's words.

A row's text is tokenised by the LM's own tokenizer (``AutoTokenizer.from_pretrained(model)``,
no special tokens added) and each token mapped to its word id. Rules, stated because the LM
source is a restricted language:

- **Tokens outside the V words are dropped** (the rest of the row is kept in order): real GLUE
  text is mostly outside a top-2000 vocabulary. The share dropped, over a task's train and dev
  text, is logged once per task and reported as ``glue/<task>/oov_fraction``
  (``oov_fraction``).
- **A sentence pair is one text, its two sentences joined by a line break** (``s1\\ns2``,
  tokenised once): the LM source has no [SEP] word (the text source's separator), and a line
  break is how the LM's own text separates them. Its token is a word only if it is among the V
  words; otherwise it is dropped like any other and the sentences run on.
- Rows are cut to the source's T words after dropping; a row with no word left has length 0
  (the model still reads [CLS] [SEP]).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from flatlm.sources.base import PAD, SourceError
from flatlm.sources.glue_files import GlueTask, read_glue

log = logging.getLogger(__name__)
PAIR_SEPARATOR = "\n"  # joins a pair's sentences into one text (module docstring)


def load_tokenizer(model: str, ids: torch.Tensor, n_model_tokens: int):
    """The LM's tokenizer, checked to be the model's: it loads, has a vocabulary holding every
    word id ``ids`` and no token beyond the model's ``n_model_tokens``; else a SourceError
    naming ``glue`` and the fix (transformers builds an empty tokenizer for a directory without
    one, so loading alone proves nothing)."""
    from transformers import AutoTokenizer

    fix = (f"save the LM's tokenizer into {model} (tokenizer.save_pretrained(DIR)) or drop "
           "'glue'")
    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise SourceError(f"lm spec 'glue': the model {model!r} has no tokenizer to read the GLUE "
                          f"text ({str(e).splitlines()[0]}); {fix}") from None
    n = len(tokenizer)
    if not tokenizer.vocab_size or int(ids.max()) >= n:
        raise SourceError(f"lm spec 'glue': the model {model!r} has no tokenizer for its words "
                          f"(the one found has {n} token(s), the words go up to token id "
                          f"{int(ids.max())}); {fix}")
    if n > n_model_tokens:
        raise SourceError(f"lm spec 'glue': the tokenizer in {model!r} has {n} tokens, more than "
                          f"the model's {n_model_tokens}: not this model's tokenizer; {fix}")
    return tokenizer


class LMGlue:
    """The GLUE tasks of ``directory`` in the words ``ids`` (LM token ids, word c = ids[c]) of
    sentences of at most ``length`` words; rows are encoded once per task, on first use."""

    def __init__(self, directory: str, tokenizer, ids: torch.Tensor, length: int):
        try:
            self.tasks: dict[str, GlueTask] = read_glue(directory)
        except ValueError as e:
            raise SourceError(str(e).replace("text spec 'glue'", "lm spec 'glue'")) from None
        self.tokenizer = tokenizer
        self.word_of = np.full(len(tokenizer), PAD, dtype=np.int64)  # token id -> word id, -1
        self.word_of[ids.numpy()] = np.arange(len(ids))
        self.length = length
        self._encoded: dict[str, dict] = {}  # task -> split -> (tokens, lengths); "oov": float

    def split(self, task: str, split: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(word ids [n, T] padded -1, lengths [n], labels [n]) of ``task``'s ``split``."""
        tokens, lengths = self._task(task)[split]
        return tokens, lengths, torch.tensor(self.tasks[task].labels[split], dtype=torch.int64)

    def oov_fraction(self, task: str) -> float:
        """Share of the tokenizer's tokens of ``task``'s train and dev text that are not words."""
        return self._task(task)["oov"]

    def _task(self, task: str) -> dict:
        if task not in self._encoded:
            out, dropped, total = {}, 0, 0
            for split, rows in self.tasks[task].texts.items():
                tokens, lengths, n_dropped, n_total = self.encode(rows)
                out[split] = (tokens, lengths)
                dropped, total = dropped + n_dropped, total + n_total
            out["oov"] = dropped / max(total, 1)
            log.warning("lm source, GLUE task %s: %.1f%% of its %d tokens are outside the "
                        "source's %d words and dropped", task, 100 * out["oov"], total,
                        int((self.word_of >= 0).sum()))
            self._encoded[task] = out
        return self._encoded[task]

    def encode(self, rows: list[tuple[str, ...]]):
        """(tokens [n, T] padded -1, lengths [n], tokens dropped, tokens in all) of text rows (a
        pair joined by PAIR_SEPARATOR), in-vocabulary tokens kept in order, cut to T."""
        texts = [PAIR_SEPARATOR.join(row) for row in rows]
        encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        tokens = torch.full((len(texts), self.length), PAD, dtype=torch.int64)
        lengths = torch.zeros(len(texts), dtype=torch.int64)
        dropped = total = 0
        for i, token_ids in enumerate(encoded):
            words = self.word_of[np.asarray(token_ids, dtype=np.int64)]
            kept = words[words >= 0][: self.length]
            dropped, total = dropped + int((words < 0).sum()), total + len(words)
            tokens[i, : len(kept)] = torch.from_numpy(kept)
            lengths[i] = len(kept)
        return tokens, lengths, dropped, total
