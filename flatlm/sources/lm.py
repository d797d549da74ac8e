"""Text from an autoregressive LM (paper A.1: OPT-125M, top-2000 tokens, length 24).

The language: a transformers causal LM restricted to V of its tokens (the source's words, chosen
by a stated rule, ``flatlm.sources.lm_model``). A sentence has exactly T words, drawn from BOS by

    x_t ~ p_r(. | BOS, x_<t),   p_r(c | h) = p_LM(c | h) / sum_{c' in words} p_LM(c' | h),

so its joint is the chain rule, log p(x) = sum_t log p_r(x_t | x_<t), and the masked-LM truth is

    Pr(x_t = c | x_{-t}) = p(x_<t, c, x_>t) / sum_{c'} p(x_<t, c', x_>t),

where the terms of positions before t are common to every c and cancel: each candidate needs
sum_{s >= t} log p_r(x_s | x_<s) of its own sentence. ``conditionals`` builds all V candidate
sentences of all T positions of a batch as one tensor and scores them with batched forwards of
``batch`` candidate sentences each (no loop over positions or words): **V T LM forward passes of
length T + 1 per sentence** (OPT setting: 2000 * 24 = 48,000). The truth is exact for this
language up to the arithmetic of ``dtype`` (``float64`` for the tests' 1e-6 agreement with
enumeration; ``float32`` / ``bfloat16`` on a GPU by option).

Spec fields (``lm:MODEL,key=value``): ``model`` (a save_pretrained directory or a hub id, e.g.
``lm:facebook/opt-125m``), ``vocab`` (V = k, default 2000), ``length`` (T, default 24), ``rule``
(``unigram`` default, or ``bos``; run on the CPU, so every machine picks the same words),
``rule_samples`` (sentences the unigram rule averages, default 256), ``seed`` (of those samples),
``classes`` (C, default 4, or V if smaller), ``dtype`` (float32), ``device`` (where ``sample``
runs: auto, the default, is a GPU where there is one; ``conditionals`` runs where the caller
asks), ``batch`` (sentences per forward, default 256), ``glue`` (optional: a directory of
GLUE-shaped task folders, as the text source reads them). Building the source loads the model
(memoised per process), so a bad model, a ``vocab`` above the model's tokens or a ``length``
above its positions is an error before any work.

Downstream tasks. The paper probes its OPT-trained models on QNLI and SST-2 (real GLUE text,
mostly outside the restricted vocabulary; a download), which this source does not provide.
Instead, task ``mask-k`` (k = 1..T) labels a sentence by the word class that the true
conditional at position k favours:

    y = argmax_g sum_{c : rank(c) mod C = g} Pr(x_k = c | x_{-k}),

with rank(c) the word's place in the rule's order (so each class holds frequent and rare
words). It is a function of the truth only, like the HMM's posterior state; one rule,
``"conditional"``. Labelling costs V LM forwards per sentence.

GLUE tasks (``glue=DIR``, e.g. the paper's QNLI and SST-2): the task folders of DIR, their text
read with the LM's own tokenizer in the source's words (out-of-vocabulary tokens dropped, a pair
joined by a line break: ``flatlm.sources.lm_glue``), for ``measure.what`` ``glue`` only
(``glue_tasks``, ``glue_split``); ``tasks`` (probes, fine-tuning, the lookup table) stay the
``mask-k``.
"""

from __future__ import annotations

import functools
import json
import os
import re

import numpy as np
import torch

from flatlm.core.devices import resolve_device
from flatlm.sources.base import PAD, Source, SourceError, as_tokens, padding_mask
from flatlm.sources.lm_glue import LMGlue, load_tokenizer
from flatlm.sources.lm_model import (
    DTYPES,
    RULES,
    RestrictedLM,
    load_causal_lm,
    max_positions,
    special_ids,
    top_ids,
    weights_digest,
)

DEFAULTS = {"vocab": 2000, "length": 24, "rule": "unigram", "rule_samples": 256, "seed": 0,
            "classes": 4, "dtype": "float32", "device": "auto", "batch": 256}
INTS = {"vocab": 2, "length": 1, "rule_samples": 1, "seed": 0, "classes": 2, "batch": 1}
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def _checked_spec(spec: dict) -> dict:
    """The spec with defaults filled in and the fields checked (before loading any model)."""
    unknown = [key for key in spec if key not in ("kind", "model", *DEFAULTS, "glue")]
    if unknown:
        raise SourceError(f"lm spec: unknown key(s) {unknown}; allowed keys are model, "
                          f"{', '.join(DEFAULTS)}, glue")
    given = spec
    spec = {"kind": "lm", "model": spec.get("model"), **DEFAULTS, **spec}
    if "classes" not in given and isinstance(spec["vocab"], int):
        spec["classes"] = min(DEFAULTS["classes"], spec["vocab"])  # a tiny vocabulary: fewer
    for key, lo in INTS.items():
        value = spec[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise SourceError(f"lm spec: {key!r} must be an integer >= {lo}, got {value!r}")
    if spec["classes"] > spec["vocab"]:
        raise SourceError(f"lm spec: 'classes' {spec['classes']} exceeds 'vocab' "
                          f"{spec['vocab']} (a class is a set of words); lower 'classes'")
    for key, allowed in (("rule", RULES), ("dtype", tuple(DTYPES))):
        if spec[key] not in allowed:
            raise SourceError(f"lm spec: {key!r} must be one of {', '.join(allowed)}, "
                              f"got {spec[key]!r}")
    if not isinstance(spec["device"], str) or not DEVICE.fullmatch(spec["device"]):
        raise SourceError(f"lm spec: 'device' must be auto, cpu, cuda or cuda:<index>, got "
                          f"{spec['device']!r}")
    spec["model"] = _model_location(spec["model"])
    return _checked_glue(spec)


def _checked_glue(spec: dict) -> dict:
    """``glue`` made absolute if given (a directory), left out of the spec if not."""
    glue = spec.pop("glue", None)
    if glue is None:
        return spec
    path = os.path.abspath(os.path.expanduser(glue)) if isinstance(glue, str) else ""
    if not os.path.isdir(path):
        raise SourceError(f"lm spec: 'glue' {glue!r} is not a directory; give a directory of "
                          "GLUE task folders (e.g. glue/ holding SST-2/train.tsv, dev.tsv)")
    return {**spec, "glue": path}


def device_name(device) -> str:
    """The one name of a device (``cuda`` -> ``cuda:<current>``), so an LM loads once there."""
    device = resolve_device(str(device))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


def _model_location(model) -> str:
    """An existing directory (made absolute) or a hub id (kept as given)."""
    if not isinstance(model, str) or not model:
        raise SourceError("lm spec: 'model' is required: a save_pretrained directory or a hub "
                          "id, e.g. lm:facebook/opt-125m")
    path = os.path.abspath(os.path.expanduser(model))
    if os.path.isdir(path):
        return path
    if model.startswith((".", "/", "~")) or not HUB_ID.fullmatch(model):
        raise SourceError(f"lm spec: 'model' {model!r} is neither a directory nor a hub id "
                          "(owner/name)")
    return model


def _language(spec: dict):
    """(word token ids [V], words) of a checked spec. The model is loaded and the rule run on the
    CPU (so that a sweep's driver and its GPU trials pick the same words), once per process per
    language (``classes``, ``device`` and ``batch`` do not change it)."""
    keys = ("model", "dtype", "vocab", "length", "rule", "rule_samples", "seed")
    return _language_of(json.dumps({k: spec[k] for k in keys}), spec["batch"])


@functools.lru_cache(maxsize=4)
def _language_of(spec_json: str, batch: int):
    spec = json.loads(spec_json)
    lm = load_causal_lm(spec["model"], spec["dtype"], "cpu")
    n_tokens = lm.config.vocab_size - len(special_ids(lm.config) & set(range(lm.config.vocab_size)))
    if spec["vocab"] > n_tokens:
        raise SourceError(f"lm spec: 'vocab' {spec['vocab']} exceeds the {n_tokens} non-special "
                          f"tokens of {spec['model']}; lower 'vocab'")
    longest = max_positions(lm.config)
    if longest is not None and spec["length"] + 1 > longest:
        raise SourceError(f"lm spec: 'length' {spec['length']} + BOS exceeds the model's "
                          f"{longest} positions; lower 'length'")
    ids = top_ids(lm, spec["rule"], spec["vocab"], spec["length"], spec["rule_samples"],
                  spec["seed"], batch)
    return ids, _words(spec["model"], ids)


def _words(model: str, ids: torch.Tensor) -> list[str]:
    """The tokenizer's strings for ``ids`` if the model has a tokenizer, else ``tok<id>``."""
    try:
        from transformers import AutoTokenizer

        tokens = AutoTokenizer.from_pretrained(model).convert_ids_to_tokens(ids.tolist())
    except (OSError, ValueError, TypeError, KeyError, ImportError):
        tokens = None
    if tokens is None or len(set(tokens)) != len(tokens) or None in tokens:
        return [f"tok{i}" for i in ids.tolist()]
    return tokens


class CausalLM(Source):
    """Fixed-length text of a causal LM over V of its tokens; see the module docstring."""

    label_rules = ("conditional",)  # the class the true conditional favours: nothing to choose

    def __init__(self, spec: dict):
        self.spec = _checked_spec(spec)
        self.ids, self.vocab = _language(self.spec)
        self.max_length = self.spec["length"]
        self.classes = self.spec["classes"]
        self.tasks = tuple(f"mask-{k}" for k in range(1, self.max_length + 1))
        self._lms: dict[str, RestrictedLM] = {}
        self._glue = None
        if "glue" in self.spec:
            n_model_tokens = self._lm("cpu").lm.config.vocab_size
            tokenizer = load_tokenizer(self.spec["model"], self.ids, n_model_tokens)
            self._glue = LMGlue(self.spec["glue"], tokenizer, self.ids, self.max_length)
        self.glue_tasks = tuple(self._glue.tasks) if self._glue is not None else ()

    @classmethod
    def from_spec(cls, spec: dict) -> CausalLM:
        return cls(spec)

    def _lm(self, device: torch.device) -> RestrictedLM:
        """The restricted LM on ``device`` (loaded there once per process)."""
        try:
            key = device_name(device)
        except ValueError as e:  # e.g. device=cuda on a machine without one
            raise SourceError(f"lm source, 'device': {e}") from None
        if key not in self._lms:
            lm = load_causal_lm(self.spec["model"], self.spec["dtype"], key)
            self._lms[key] = RestrictedLM(lm, self.ids)
        return self._lms[key]

    @functools.cached_property
    def _weights_digest(self) -> np.ndarray:
        return weights_digest(self._lm("cpu").lm)  # hashed once per instance

    def _fingerprint_arrays(self) -> list[np.ndarray]:
        bos = self._lm("cpu").bos
        setting = f"{self.spec['dtype']} bos={bos} T={self.max_length}"
        return [self.ids.numpy(), self._weights_digest,
                np.frombuffer(setting.encode(), dtype=np.uint8)]

    # ---- sampling and the joint -----------------------------------------------------------------

    def sample(self, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """n sentences of T words by inverse CDF of p_r from ``np.random.default_rng(seed)``
        uniforms (one per word), on the spec's ``device`` (auto: a GPU where there is one):
        tokens [n, T], lengths [n] (all T), on the CPU."""
        u = torch.from_numpy(np.random.default_rng(seed).random((n, self.max_length)))
        words = self._lm(self.spec["device"]).sample(u, self.spec["batch"])
        return words, torch.full((n,), self.max_length, dtype=torch.int64)

    def log_prob(self, tokens, lengths) -> torch.Tensor:
        """log p(x) = sum_t log p_r(x_t | x_<t) of each sentence (its first ``length`` words):
        [n] float64 on the tokens' device. One forward per sentence."""
        tokens, lengths = self._prepare(tokens, lengths, None)
        logp = self._token_log_probs(tokens.clamp_min(0))  # (n, T)
        return (logp * padding_mask(lengths, tokens.shape[1])).sum(1).double()

    def _token_log_probs(self, words: torch.Tensor) -> torch.Tensor:
        """log p_r(x_s | BOS, x_<s) for every s of word sentences [R, T] (no padding): [R, T]
        float32 or wider, on the words' device, forwards of ``batch`` rows."""
        lm = self._lm(words.device)
        parts = []
        for i in range(0, words.shape[0], self.spec["batch"]):
            rows = words[i : i + self.spec["batch"]]
            bos = torch.full((len(rows), 1), lm.bos, device=rows.device)
            logp = lm.log_probs(torch.cat([bos, lm.token_ids(rows)], 1))[0][:, :-1]  # (r, T, V)
            parts.append(logp.gather(-1, rows[..., None])[..., 0])
        return torch.cat(parts)

    # ---- the masked-LM truth --------------------------------------------------------------------

    def _conditionals_batch(self, tokens, lengths, dtype) -> torch.Tensor:
        """Pr(x_t = c | x_{-t}) for every position: [B, T, V], padding rows 0."""
        return self.position_conditionals(tokens, lengths, torch.arange(tokens.shape[1]), dtype)

    def position_conditionals(self, tokens, lengths, positions, dtype=torch.float64):
        """Pr(x_t = c | x_{-t}) at ``positions`` (P,) (0-based): [B, P, V] on the tokens' device;
        zero where t >= length. A sentence of length L < T is one of the LM's first-L-words
        marginal. Sentences go in groups of about ``batch`` candidates (a memory bound)."""
        positions = torch.as_tensor(positions, device=tokens.device)
        group = max(1, self.spec["batch"] // (len(positions) * self.V))
        parts = [self._candidate_conditionals(tokens[i : i + group], lengths[i : i + group],
                                              positions) for i in range(0, len(tokens), group)]
        if not parts:
            return torch.zeros(0, len(positions), self.V, dtype=dtype, device=tokens.device)
        return torch.cat(parts).to(dtype)

    def _candidate_conditionals(self, tokens, lengths, positions) -> torch.Tensor:
        """One group: all B P V candidate sentences (x_t := c) scored by batched forwards,
        sum_{t <= s < L} log p_r(x_s | x_<s) each, normalised over c: [B, P, V] float64."""
        B, T = tokens.shape
        P, V = len(positions), self.V
        cand = tokens.clamp_min(0)[:, None, None, :].expand(B, P, V, T).clone()  # (B, P, V, T)
        words = torch.arange(V, device=tokens.device)[None, None, :, None].expand(B, P, V, 1)
        cand.scatter_(3, positions[None, :, None, None].expand(B, P, V, 1), words)
        logp = self._token_log_probs(cand.reshape(-1, T)).reshape(B, P, V, T).double()
        s = torch.arange(T, device=tokens.device)
        counted = (s >= positions[:, None])[None] & (s < lengths[:, None, None])  # (B, P, T)
        score = torch.where(counted[:, :, None, :], logp, 0.0).sum(-1)  # (B, P, V)
        real = positions[None, :] < lengths[:, None]  # (B, P)
        return score.softmax(-1) * real[..., None]

    # ---- downstream -----------------------------------------------------------------------------

    def _position(self, task: str) -> int:
        if task not in self.tasks:
            raise ValueError(f"unknown lm task {task!r}; use mask-k with k in "
                             f"1..{self.max_length}")
        return int(task.split("-")[1]) - 1

    def num_classes(self, task: str) -> int:
        """C: the label of ``mask-k`` is a word class; a GLUE task's: its files' classes."""
        if task in self.glue_tasks:
            return self._glue.tasks[task].num_classes
        self._position(task)
        return self.classes

    def glue_split(self, task: str, split: str):
        """(tokens, lengths, labels) of GLUE ``task``'s ``split`` ("train" or "dev") in this
        source's words (``flatlm.sources.lm_glue``), for ``flatlm.measure.probes.glue``."""
        return self._glue_of(task).split(task, split)

    def glue_oov_fraction(self, task: str) -> float:
        """Share of GLUE ``task``'s tokens (train and dev) outside the words, hence dropped."""
        return self._glue_of(task).oov_fraction(task)

    def _glue_of(self, task: str) -> LMGlue:
        if task not in self.glue_tasks:
            raise ValueError(f"lm source: {task!r} is not one of its GLUE tasks "
                             f"({', '.join(self.glue_tasks) or 'none: add glue=DIR'})")
        return self._glue

    def word_classes(self) -> torch.Tensor:
        """[V] int64: word c's class, rank(c) mod C (words are in the rule's order)."""
        return torch.arange(self.V) % self.classes

    def labels(self, tokens, lengths, task: str, rule: str = "conditional") -> torch.Tensor:
        """argmax_g Pr(x_k in class g | x_{-k}) for ``mask-k``: [n] int64, -1 where k > length."""
        k = self._position(task)
        self.check_downstream(rule, (task,))
        tokens, lengths = as_tokens(tokens, lengths)
        cond = self.position_conditionals(tokens, lengths, [k])[:, 0]  # (n, V)
        mass = torch.zeros(len(cond), self.classes, dtype=cond.dtype, device=cond.device)
        mass.index_add_(1, self.word_classes().to(cond.device), cond)  # (n, C)
        return torch.where(lengths > k, mass.argmax(-1), PAD)
