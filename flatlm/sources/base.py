"""The interface every source language shares, and the code they share.

A source is a generative language whose masked-LM conditionals Pr(x_t = c | x_{-t}) are known
exactly. Every source gives, with word ids 0..V-1 and padding -1:

- ``sample(n, seed)`` -> ``(tokens [n, T] int64, lengths [n] int64)``, T = ``max_length``;
- ``conditionals(tokens, lengths)`` -> ``[n, T, V]``: row (i, t) is Pr(x_t = . | x_{-t}) for a real
  position t (sums to 1), zero on padding;
- ``labels(tokens, lengths, task, rule=...)`` -> ``[n]`` int64 raw downstream labels of given
  sentences (-1: not defined for that sentence, e.g. a span longer than the sentence);
- ``sample_downstream(n, seed, rule=, tasks=, device=)`` -> ``(tokens, lengths, {task: ids})``:
  the one way every stage (corpus, measurements, the adversarial pool) gets labelled data. It draws
  from the source's downstream distribution, labels by ``rule`` (default ``label_rules[0]``) and
  returns class ids 0..num_classes-1 (raw label + ``label_offset``; -1 stays -1);
- ``tasks``, ``label_rules`` (default first), ``num_classes(task)``, ``label_offset``;
- ``entropy(n, seed)`` -> (mean per-token conditional entropy in nats, its standard error);
- ``vocab`` (list of V words), ``tasks`` (task names), ``spec`` (the dict that rebuilds it),
  ``fingerprint()`` (a hash of the parameters that define the language);
- ``glue_tasks`` (GLUE tasks for ``measure.glue``, default none) with ``glue_split(task, split)``
  -> ``(tokens, lengths, labels)``: the text and LM sources given ``glue=DIR``.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod

import numpy as np
import torch
from tqdm.auto import tqdm

from flatlm.core.stats import ratio_mean_se

PAD = -1


class SourceError(ValueError):
    """A source spec, grammar or matrix file that cannot define a language."""


def as_tokens(tokens, lengths) -> tuple[torch.Tensor, torch.Tensor]:
    """Checks and converts a (tokens, lengths) pair to int64 tensors on their current device."""
    tokens = torch.as_tensor(tokens, dtype=torch.int64)
    lengths = torch.as_tensor(lengths, dtype=torch.int64, device=tokens.device)
    if tokens.ndim != 2 or lengths.ndim != 1 or lengths.shape[0] != tokens.shape[0]:
        raise ValueError(
            f"tokens must be [n, T] and lengths [n]; got {tuple(tokens.shape)} and "
            f"{tuple(lengths.shape)}"
        )
    return tokens, lengths


def padding_mask(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """[n, T] bool, True on real positions."""
    return torch.arange(T, device=lengths.device)[None, :] < lengths[:, None]


def entropy_rows(probs: torch.Tensor) -> torch.Tensor:
    """-sum_c p log p over the last axis, with 0 log 0 = 0."""
    logp = torch.where(probs > 0, probs.log(), torch.zeros_like(probs))
    return -(probs * logp).sum(-1)


class Source(ABC):
    """Base class: subclasses implement ``sample``, ``_conditionals_batch``, ``labels``,
    ``num_classes``, ``label_rules`` and ``_fingerprint_arrays``; ``_labelled_sample`` where the
    downstream distribution or labelling needs more than ``sample`` + ``labels``."""

    spec: dict
    vocab: list[str]
    max_length: int
    tasks: tuple[str, ...]
    label_offset: int = 0  # added to a raw label to give its class id (Dyck's signed g*: T)
    has_truth: bool = True  # exact conditionals known; False for real text (sources.text)
    glue_tasks: tuple[str, ...] = ()  # GLUE tasks with a glue_split (text, lm with glue=DIR)

    @property
    @abstractmethod
    def label_rules(self) -> tuple[str, ...]:
        """The downstream label rules this source supports, its default first."""

    @property
    def V(self) -> int:
        return len(self.vocab)

    @abstractmethod
    def sample(self, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """n sentences: tokens [n, T] int64 (padding -1) and lengths [n] int64, on the CPU."""

    def sample_validation(self, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Validation sentences, as ``sample``: fresh draws are held out already; a finite
        corpus (``sources.text``) gives its held-out split (perhaps fewer than n)."""
        return self.sample(n, seed)

    @abstractmethod
    def _conditionals_batch(
        self, tokens: torch.Tensor, lengths: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """Exact conditionals for one batch already on its device: [n, T, V], padded rows 0."""

    @abstractmethod
    def labels(self, tokens, lengths, task: str, **options) -> torch.Tensor:
        """Downstream labels [n] int64 for ``task`` (one of ``self.tasks``); -1 = undefined."""

    def sample_downstream(
        self,
        n: int,
        seed: int,
        *,
        rule: str | None = None,
        tasks: tuple[str, ...] | None = None,
        device: str | torch.device | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """n labelled sentences: tokens [n, T], lengths [n] and {task: class ids [n]} (int64,
        CPU; -1 where the task is undefined for a sentence).

        ``rule`` None is the source's default (``label_rules[0]``), ``tasks`` None all of
        ``self.tasks``; ``device`` runs the labelling (the exact inference), not the sampling.
        """
        rule, tasks = self.check_downstream(rule, tasks)
        tokens, lengths, raw = self._labelled_sample(n, seed, rule, tasks, device)
        classes = {task: torch.where(y == PAD, y, y + self.label_offset).cpu()
                   for task, y in raw.items()}
        return tokens, lengths, classes

    def check_downstream(self, rule: str | None, tasks) -> tuple[str, tuple[str, ...]]:
        """(rule, tasks) resolved to the defaults and checked against this source's."""
        rule = rule or self.label_rules[0]
        if rule not in self.label_rules:
            raise ValueError(f"label rule {rule!r} is not one of this {type(self).__name__} "
                             f"source's; use one of {', '.join(self.label_rules)}")
        tasks = tuple(self.tasks if tasks is None or not len(tasks) else tasks)
        unknown = [t for t in tasks if t not in self.tasks]
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}: this {type(self).__name__} source's "
                             f"tasks are {', '.join(self.tasks)}")
        return rule, tasks

    def bayes_accuracies(self, tokens, lengths, rule: str, tasks, *,
                         device=None) -> dict[str, torch.Tensor]:
        """Per task whose labels under ``rule`` are not a function of the sentence: the chance
        max_y Pr(label = y | x) that the best possible classifier labels each sentence right,
        [n] float64 on the CPU (its mean over a test set is the probe's Bayes ceiling,
        ``<stage>/<task>/bayes_ceiling``). By default {}: every rule labels by the sentence
        alone, so the ceiling is 1. Sources that label by what the sampler drew override this."""
        return {}

    def _labelled_sample(self, n, seed, rule, tasks, device):
        """(tokens, lengths, {task: raw labels}) of n downstream sentences: by default ``sample``
        labelled by ``labels``. Sources whose downstream distribution differs override this."""
        tokens, lengths = self.sample(n, seed)
        tok, ln = tokens.to(device or "cpu"), lengths.to(device or "cpu")
        return tokens, lengths, {task: self.labels(tok, ln, task, rule=rule) for task in tasks}

    @abstractmethod
    def _fingerprint_arrays(self) -> list[np.ndarray]:
        """The arrays that define the language, hashed by ``fingerprint``."""

    @abstractmethod
    def num_classes(self, task: str) -> int:
        """Number of label classes of ``task`` (labels are 0..num_classes-1, or -1)."""

    def conditionals(
        self,
        tokens,
        lengths,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float32,
        batch_size: int = 1024,
    ) -> torch.Tensor:
        """Pr(x_t = c | x_{-t}) for every real position of every sentence: [n, T, V].

        Work runs on ``device`` (default: the tokens' device) in chunks of ``batch_size``
        sentences; the result stays on that device.
        """
        tokens, lengths = self._prepare(tokens, lengths, device)
        parts = [
            self._conditionals_batch(tokens[i : i + batch_size], lengths[i : i + batch_size], dtype)
            for i in range(0, tokens.shape[0], batch_size)
        ]
        if not parts:
            return torch.zeros(0, tokens.shape[1], self.V, device=tokens.device, dtype=dtype)
        return torch.cat(parts)

    def _prepare(self, tokens, lengths, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Checked int64 tokens and lengths on ``device`` (default: the tokens' own)."""
        tokens, lengths = as_tokens(tokens, lengths)
        device = torch.device(device) if device is not None else tokens.device
        tokens, lengths = tokens.to(device), lengths.to(device)
        if tokens.shape[0] and (int(lengths.min()) < 1 or int(lengths.max()) > tokens.shape[1]):
            raise ValueError("lengths must lie in 1..T (the tokens' second dimension)")
        real = padding_mask(lengths, tokens.shape[1])
        if tokens.shape[0] and (int(tokens.max()) >= self.V or bool((tokens[real] < 0).any())):
            raise ValueError(f"token ids must lie in 0..{self.V - 1} at real positions (padding "
                             "-1 only past a sentence's length)")
        return tokens, lengths

    def entropy(
        self,
        n: int,
        seed: int,
        *,
        batch_size: int = 2048,
        device: str | torch.device | None = None,
        progress: bool = False,
    ) -> tuple[float, float]:
        """Mean per-token conditional entropy H(x_t | x_{-t}) in nats over n fresh sentences.

        Every position of every sentence weighs the same; the standard error is clustered by
        sentence (see ``ratio_mean_se``). Computed in float64.
        """
        sums, counts = self.entropy_terms(n, seed, batch_size=batch_size, device=device,
                                          progress=progress)
        return ratio_mean_se(sums, counts)

    def entropy_terms(self, n, seed, *, batch_size=2048, device=None, progress=False):
        """Per-sentence (sum of token entropies, length) arrays over n sentences from ``seed``."""
        tokens, lengths = self.sample(n, seed)
        sums = self.sentence_entropies(tokens, lengths, batch_size=batch_size, device=device,
                                       progress=progress)
        return sums, lengths.numpy().astype(np.float64)

    def sentence_entropies(self, tokens, lengths, *, batch_size=2048, device=None,
                           progress=False) -> np.ndarray:
        """sum_t H(x_t | x_{-t}) of each given sentence: [n] float64 (computed in float64)."""
        n = len(tokens)
        sums = np.zeros(n)
        with tqdm(total=n, desc="entropy", unit="sent", disable=not progress) as bar:
            for i in range(0, n, batch_size):
                tok, ln = tokens[i : i + batch_size], lengths[i : i + batch_size]
                probs = self.conditionals(tok, ln, device=device, dtype=torch.float64,
                                          batch_size=batch_size)
                sums[i : i + len(tok)] = entropy_rows(probs).sum(-1).cpu().numpy()
                bar.update(len(tok))
        return sums

    def fingerprint(self) -> str:
        """sha256 of the defining arrays (grammar rules or matrices), in a fixed byte layout."""
        h = hashlib.sha256()
        for a in self._fingerprint_arrays():
            a = np.ascontiguousarray(a)
            h.update(str(a.dtype).encode() + str(a.shape).encode())
            h.update(a.tobytes())
        h.update("\n".join(self.vocab).encode())
        return h.hexdigest()
