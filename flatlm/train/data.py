"""Batches for pre-training: where sentences come from, how they are masked, what goes on device.

Every random choice at update i is a pure function of ``(seed, i)`` (``derive_seed``), so the
whole data position is one integer, and a resumed run draws exactly the batches an uninterrupted
run would have:

- ``FreshSamples``: ``source.sample(batch_size, derive_seed(seed, "data", i))`` at update i, new
  sentences every step (the population-loss setting of the paper's theory, Section 3).
- ``CorpusBatches``: a corpus read in a fresh permutation each epoch; update i takes the sentences
  ``i * batch_size .. (i + 1) * batch_size - 1`` of the concatenated epochs.
- ``mask_batch``: one masked word per sentence, uniform over its words, or at a rate: exactly
  ``fixed_mask_count`` words of each sentence (BERT's and the released code's rule) or each word
  independently ("bernoulli"), at most ``max_predictions`` per sentence; replaced by BERT's
  80/10/10 rule by default.
- ``DownstreamPool``: labelled sentences D for the adversarial algorithm, with disjoint D1, D2
  (``adversarial_pool``).
- ``BatchPipeline``: update i -> ``StepInputs`` on the device, optionally prepared a few steps
  ahead in background threads or processes (``train.prefetch``, by default on CUDA only), which
  changes nothing but the timing; laid out as
  ``train.sequence_packing`` says: padded, unpadded (each pass's sentences sorted by length, so
  that micro-batches are cut to their longest sentence; ``train.unpad``, on for CUDA) or in rows
  (``flatlm.train.rows``: each micro-batch's sentences end to end in fixed-length rows).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from flatlm.core.seeds import derive_seed, generator
from flatlm.core.tokens import MASK_ID, WORD_OFFSET, encode, uniform_positions
from flatlm.core.workers import WorkerDied
from flatlm.sources.base import Source
from flatlm.train.config import TrainConfig, sequence_packing_for
from flatlm.train.registry import algorithm_named
from flatlm.train.rows import RowBatch, into_rows

# ------------------------------------------------------------------------------ sentence streams


class FreshSamples:
    """New sentences from ``source`` at every update: batch i is a pure function of (seed, i)."""

    kind = "fresh"

    def __init__(self, source: Source, batch_size: int, seed: int):
        self.source, self.batch_size, self.seed = source, batch_size, seed
        self.n_words = source.V

    def batch_at(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [B, T], lengths [B]) for update i, on the CPU."""
        return self.source.sample(self.batch_size, derive_seed(self.seed, "data", i))


class CorpusBatches:
    """A fixed set of sentences, in a new permutation each epoch (epoch e: seed (seed, e))."""

    kind = "corpus"

    def __init__(self, tokens: torch.Tensor, lengths: torch.Tensor, batch_size: int, seed: int,
                 *, n_words: int | None = None):
        if len(tokens) == 0:
            raise ValueError("train.data: the corpus has no sentences")
        self.tokens, self.lengths, self.n_words = tokens, lengths, n_words
        self.batch_size, self.seed = batch_size, seed
        self._perm: tuple[int, torch.Tensor] | None = None  # cache: (epoch, permutation)

    def _permutation(self, epoch: int) -> torch.Tensor:
        cached = self._perm  # one read: prefetch threads may replace the cache meanwhile
        if cached is None or cached[0] != epoch:
            n = len(self.tokens)
            cached = (epoch, torch.randperm(n, generator=generator(self.seed, "epoch", epoch)))
            self._perm = cached
        return cached[1]

    def indices_at(self, i: int) -> torch.Tensor:
        """Corpus rows of update i: positions i B .. (i+1) B - 1 of the concatenated epochs."""
        n = len(self.tokens)
        start, stop = i * self.batch_size, (i + 1) * self.batch_size
        parts = []
        for epoch in range(start // n, (stop - 1) // n + 1):
            lo, hi = max(start, epoch * n) - epoch * n, min(stop, (epoch + 1) * n) - epoch * n
            parts.append(self._permutation(epoch)[lo:hi])
        return torch.cat(parts)

    def batch_at(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.indices_at(i)
        return self.tokens[rows], self.lengths[rows]


def read_corpus(path: str | Path, source: Source | None = None,
                split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, lengths) of a corpus directory's split: the one place train reads corpora.

    With ``source``, the corpus must have been made from that language (its fingerprint).
    """
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"train.data={str(path)!r}: not a directory; use 'fresh' or a corpus "
                         "directory written by `flatlm data make`")
    from flatlm.corpus import corpus_tensors, load_corpus  # here: it pulls in datasets

    splits, _ = load_corpus(path, source=source)
    return corpus_tensors(splits[split])


def corpus_source_spec(path: str | Path) -> dict:
    """The spec of the source a corpus directory was made from (its ``metadata.json``)."""
    from flatlm.corpus import load_corpus

    return load_corpus(path, verify=False)[1]["source"]["spec"]


# ------------------------------------------------------------------------------ masked batches


def _map(obj, fn):
    """A copy of the dataclass ``obj`` with ``fn`` applied to every tensor field."""
    values = {f.name: getattr(obj, f.name) for f in fields(obj)}
    return type(obj)(**{k: fn(v) if isinstance(v, torch.Tensor) else v
                        for k, v in values.items()})


def _to(obj, device: torch.device):
    """``obj`` on ``device``; copies from pinned memory do not block the host."""
    return _map(obj, lambda t: t.to(device, non_blocking=t.is_pinned()))


@dataclass(frozen=True)
class MLMBatch:
    """Masked sentences and the words to predict.

    With one masked word per sentence ``positions`` [n] holds the 0-based word position and
    ``targets`` [n] the word there; at a rate, ``positions`` [n, T] is a bool mask of the masked
    words and ``targets`` [n, T] the words there (-1 elsewhere). Under ``train.targets="truth"``
    ``soft_targets`` holds the true conditionals the loss is taken against instead
    (``true_targets``): [n, V] at the masked word, or [n, T, V] at every word at a rate.
    """

    input_ids: torch.Tensor  # (n, T+2) with [MASK] at the masked words
    attention_mask: torch.Tensor  # (n, T+2)
    positions: torch.Tensor  # (n,) int64 or (n, T) bool
    targets: torch.Tensor  # (n,) or (n, T) int64 word ids
    lengths: tuple[int, ...] | None = None  # words per sentence, kept on the host so that
    #   ``trimmed`` needs no device sync; None = not known (``trimmed`` keeps every column)
    soft_targets: torch.Tensor | None = None  # float32 Pr(. | x_{-t}); None = the targets

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def n_targets(self) -> torch.Tensor | int:
        """Masked words in the batch (a tensor at a rate, to avoid a host sync)."""
        return len(self) if self.positions.dtype != torch.bool else self.positions.sum()

    def split(self, size: int) -> list[MLMBatch]:
        """Consecutive sub-batches of ``size`` sentences."""
        parts = [t.split(size) for t in (self.input_ids, self.attention_mask, self.positions,
                                         self.targets)]
        lengths = ([self.lengths[i:i + size] for i in range(0, len(self), size)]
                   if self.lengths is not None else [None] * len(parts[0]))
        soft = (self.soft_targets.split(size) if self.soft_targets is not None
                else [None] * len(parts[0]))
        return [MLMBatch(*p, lengths=n, soft_targets=q)
                for *p, n, q in zip(*parts, lengths, soft, strict=True)]

    def trimmed(self) -> MLMBatch:
        """The batch cut to its longest sentence (+ [CLS], [SEP]); itself if ``lengths`` is None.

        Exact: sentences are right-padded, padding is masked out of attention and position ids
        count from the left, so each kept position's output is unchanged.
        """
        if self.lengths is None or not self.lengths:
            return self
        words = max(self.lengths)
        if words + 2 >= self.input_ids.shape[1]:
            return self
        cut = self.positions.dtype == torch.bool  # (n, T) masks lose their padding columns too
        soft = self.soft_targets
        return MLMBatch(self.input_ids[:, :words + 2], self.attention_mask[:, :words + 2],
                        self.positions[:, :words] if cut else self.positions,
                        self.targets[:, :words] if cut else self.targets, lengths=self.lengths,
                        soft_targets=soft[:, :words] if cut and soft is not None else soft)

    def grouped_by_length(self, lengths: torch.Tensor, pass_size: int) -> MLMBatch:
        """The rows sorted by ``lengths`` (longest first, stable) within each consecutive pass of
        ``pass_size`` sentences, with ``lengths`` attached: consecutive micro-batches of a pass
        then hold sentences of similar length and ``trimmed`` cuts each tightly. A pass's loss is
        a sum over its masked words, so this changes only the order of that sum (and which
        dropout draw meets which word). On the CPU, before the batch goes to the device.
        """
        order = torch.cat([
            start + lengths[start:start + pass_size].argsort(descending=True, stable=True)
            for start in range(0, len(self), pass_size)])
        rows = (self.input_ids, self.attention_mask, self.positions, self.targets)
        soft = self.soft_targets
        return MLMBatch(*(t[order] for t in rows), lengths=tuple(lengths[order].tolist()),
                        soft_targets=soft[order] if soft is not None else None)

    def to(self, device: torch.device) -> MLMBatch:
        return _to(self, device)


def fixed_mask_count(words: int, rate: float, max_predictions: int | None = None) -> int:
    """Words masked in a sentence of ``words`` words at ``rate`` under ``mask_count="fixed"``:
    ``min(max_predictions, max(1, round(rate * (words + 2))))``, the +2 counting [CLS] and
    [SEP], Python's round (half to even), as the released create_pretraining_data.py
    (create_masked_lm_predictions: ``num_to_predict``) computes it; never more than ``words``.

    >>> [fixed_mask_count(n, 0.15) for n in (1, 4, 8, 16, 28, 30)]
    [1, 1, 2, 3, 4, 5]
    >>> fixed_mask_count(30, 0.15, max_predictions=5), fixed_mask_count(126, 0.15, 20)
    (5, 19)
    """
    count = max(1, int(round((words + 2) * rate)))
    count = count if max_predictions is None else min(max_predictions, count)
    return min(count, words)


def mask_batch(tokens: torch.Tensor, lengths: torch.Tensor, mask: str | float,
               gen: torch.Generator, *, n_words: int | None = None,
               replace: tuple[float, float, float] = (1.0, 0.0, 0.0),
               max_predictions: int | None = None, count: str = "fixed") -> MLMBatch:
    """Masks sentences (tokens [n, T], lengths [n] >= 1) with ``mask`` ("one" or a rate).

    At a rate, ``count`` says how many words of a sentence are chosen: "fixed" exactly
    ``fixed_mask_count(words, rate, max_predictions)``, a uniformly random subset of its words
    (the released code's rule, ``train.mask_count``); "bernoulli" each word independently with
    probability ``rate``, then ``max_predictions`` caps them (a uniformly random subset of them is
    kept). The chosen words are predicted; each chosen word's input becomes [MASK], a uniformly
    random word of the ``n_words`` (needed unless ``replace[1] == 0``) or stays itself, with the
    probabilities ``replace`` (BERT's rule: (0.8, 0.1, 0.1)). Random draws come from ``gen`` in a
    fixed order (positions, cap, replacement), and a draw the settings do not need is not made,
    so (1, 0, 0) without a cap gives the batches of plain [MASK] masking.
    """
    input_ids, attention_mask = encode(tokens, lengths)
    n, T = tokens.shape
    if mask == "one":
        positions = uniform_positions(lengths, gen)  # (n,)
        chosen = torch.zeros(n, T, dtype=torch.bool)
        chosen[torch.arange(n), positions] = True
        targets = tokens.gather(1, positions[:, None]).squeeze(1)
    else:
        real = torch.arange(T)[None, :] < lengths[:, None]  # (n, T)
        if count == "fixed":
            table = torch.tensor([fixed_mask_count(w, mask, max_predictions)
                                  for w in range(T + 1)])  # words -> how many to mask
            chosen = _first_k_per_row(real, table[lengths], gen)
        elif count == "bernoulli":
            chosen = (torch.rand(n, T, generator=gen) < mask) & real  # (n, T)
            if max_predictions is not None:
                chosen = _first_k_per_row(chosen, max_predictions, gen)
        else:
            raise ValueError(f"mask_batch: count={count!r}: use 'fixed' or 'bernoulli'")
        positions, targets = chosen, torch.where(chosen, tokens, -1)
    words = input_ids[:, 1:-1]  # (n, T) view: word position t is input position t + 1
    words[_replaced(chosen, replace, gen, n_words, words)] = MASK_ID
    return MLMBatch(input_ids, attention_mask, positions, targets)


def _first_k_per_row(chosen: torch.Tensor, k: int | torch.Tensor,
                     gen: torch.Generator) -> torch.Tensor:
    """``chosen`` (n, T) with at most k (an int, or one per row: [n]) True per row: a uniformly
    random subset, those of the k smallest random keys (the released code shuffles its
    candidate positions and takes the first k)."""
    keys = torch.where(chosen, torch.rand(chosen.shape, generator=gen), 2.0)  # (n, T)
    rank = keys.argsort(1).argsort(1)  # (n, T): each position's rank in its row
    k = k[:, None] if isinstance(k, torch.Tensor) else k
    return chosen & (rank < k)


def _replaced(chosen, replace, gen, n_words, words) -> torch.Tensor:
    """BERT's rule on the chosen words: writes the random-word replacements into ``words`` in
    place and returns the (n, T) mask of those that become [MASK]."""
    p_mask, p_random, _ = replace
    if p_mask == 1.0:
        return chosen
    u = torch.rand(chosen.shape, generator=gen, dtype=torch.float64)  # (n, T)
    to_random = chosen & (u >= p_mask) & (u < p_mask + p_random)
    if p_random > 0:
        if n_words is None:
            raise ValueError("mask_batch: random replacement needs n_words (the vocabulary)")
        random_words = torch.randint(0, n_words, chosen.shape, generator=gen)  # (n, T)
        words[to_random] = random_words[to_random] + WORD_OFFSET
    return chosen & (u < p_mask)


TRUTH_CHUNK = 1024  # sentences whose exact conditionals (float64, [c, T, V]) are computed at once


def true_targets(source: Source, tokens: torch.Tensor, lengths: torch.Tensor,
                 positions: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """The soft targets of ``train.targets="truth"``: the source's true conditional
    Pr(x_t = . | x_{-t}) of the sentences ``tokens`` [n, T], ``lengths`` [n], float32 on the CPU:
    at each sentence's masked word ([n, V], ``positions`` [n]) or, at a rate (``positions`` a
    bool [n, T]), at every word ([n, T, V]; the loss reads the masked ones). Computed in float64
    on ``device``, ``TRUTH_CHUNK`` sentences at a time, as ``Source.conditionals`` gives them to
    ``flatlm.measure.loss`` (the KL to the truth)."""
    parts = []
    for i in range(0, len(tokens), TRUTH_CHUNK):
        probs = source.conditionals(tokens[i:i + TRUTH_CHUNK], lengths[i:i + TRUTH_CHUNK],
                                    device=device, dtype=torch.float64)  # (c, T, V)
        if positions.dtype != torch.bool:
            at = positions[i:i + TRUTH_CHUNK].to(probs.device)
            probs = probs[torch.arange(len(at), device=probs.device), at]  # (c, V)
        parts.append(probs.float().cpu())
    return torch.cat(parts) if parts else torch.zeros(0, source.V)


# ------------------------------------------------------------------------------ downstream data


@dataclass(frozen=True)
class ProbeBatch:
    """Unmasked labelled sentences: the first ``n1`` rows are D1, the rest D2."""

    input_ids: torch.Tensor  # (n1 + n2, T+2)
    attention_mask: torch.Tensor  # (n1 + n2, T+2)
    labels: torch.Tensor  # (n1 + n2,) class ids
    n1: int

    def to(self, device: torch.device) -> ProbeBatch:
        return _to(self, device)


class DownstreamPool:
    """The downstream training set D of the adversarial algorithm (A.5), drawn once from the source
    (sentences whose label is defined), and a fresh disjoint D1, D2 from it at every update."""

    def __init__(self, source: Source, task: str, *, size: int, d1: int, d2: int, seed: int,
                 device: str | torch.device = "cpu"):
        """``size`` sentences from the source, labelled on ``device`` (the truth's algorithms run
        there; a GPU labels a large pool of the paper's grammar in seconds)."""
        if task not in source.tasks:
            raise ValueError(f"train.adversarial.task={task!r}: the source's tasks are "
                             f"{list(source.tasks)}")
        # the source's downstream data and default label rule: what the probe is measured on
        tokens, lengths, classes = source.sample_downstream(
            size, derive_seed(seed, "pool", 0), tasks=(task,), device=device)
        labels = classes[task]
        self.n_classes = source.num_classes(task)
        keep = labels >= 0  # -1 = undefined for that sentence
        if int(keep.sum()) < d1 + d2:
            raise ValueError(f"train.adversarial.pool={size}: only {int(keep.sum())} sentences "
                             f"have a task-{task} label, fewer than d1 + d2 = {d1 + d2}")
        self.input_ids, self.attention_mask = encode(tokens[keep], lengths[keep])
        self.labels = labels[keep]
        self.d1, self.d2, self.seed = d1, d2, seed

    def draw(self, i: int, *, stream: str = "draw") -> ProbeBatch:
        """Disjoint D1, D2 for update i (a pure function of (seed, i))."""
        rows = torch.randperm(len(self.labels), generator=generator(self.seed, stream, i))
        rows = rows[: self.d1 + self.d2]
        return ProbeBatch(self.input_ids[rows], self.attention_mask[rows], self.labels[rows],
                          self.d1)


def adversarial_pool(cfg: TrainConfig, source: Source, device) -> DownstreamPool:
    """The pool D of ``train.adversarial`` (its task: the source's first if None)."""
    adv = cfg.adversarial
    task = adv.task or source.tasks[0]
    if task not in source.tasks:
        raise ValueError(f"train.adversarial.task={task!r}: the source's tasks are "
                         f"{list(source.tasks)}")
    return DownstreamPool(source, task, size=adv.pool, d1=adv.d1, d2=adv.d2, seed=cfg.seed,
                          device=device)


# ------------------------------------------------------------------------------ the pipeline


@dataclass(frozen=True)
class StepInputs:
    """Everything one update reads: the MLM batch and, for the adversarial algorithm, D1 + D2."""

    mlm: MLMBatch | RowBatch  # RowBatch under train.sequence_packing="rows"
    probe: ProbeBatch | None = None

    def to(self, device: torch.device) -> StepInputs:
        return StepInputs(self.mlm.to(device), self.probe.to(device) if self.probe else None)

    def pin_memory(self) -> StepInputs:
        pin = torch.Tensor.pin_memory
        mlm = self.mlm.pin_memory() if isinstance(self.mlm, RowBatch) else _map(self.mlm, pin)
        return StepInputs(mlm, _map(self.probe, pin) if self.probe else None)


def prefetch_depth(cfg: TrainConfig, device: torch.device) -> int:
    """Updates to prepare ahead on ``device`` (``train.prefetch``): the number given, or under
    "auto" none on the CPU (the cores train), else up to 4 on half the host's cores. A
    4096-sentence batch of the paper's grammar takes about 0.1 s of one core to sample and mask,
    longer than a GPU update of a small model."""
    if cfg.prefetch != "auto":
        return cfg.prefetch
    if device.type != "cuda":
        return 0
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def _start_worker(pipeline: BatchPipeline) -> None:
    """A prefetch process's initializer: it keeps its copy of the pipeline (a worker's only
    state, read by ``_worker_inputs``) and one torch thread (it shares the host's cores)."""
    global _WORKER_PIPELINE
    torch.set_num_threads(1)
    _WORKER_PIPELINE = pipeline


_WORKER_PIPELINE: BatchPipeline | None = None  # set in a prefetch process only


def _worker_inputs(i: int) -> StepInputs:
    return _WORKER_PIPELINE.host_inputs(i)


class BatchPipeline:
    """Update index -> ``StepInputs`` on ``device``, the masked batch changed by the algorithm's
    batch transform if it has one (label_noise) and given the true conditionals of ``truth``
    as soft targets under ``train.targets="truth"``. ``prefetch`` = k > 0 prepares updates
    i + 1 .. i + k on the CPU in k background workers while update i runs (``workers``:
    "threads" in this process, or "processes", each spawned with a copy of the pipeline); the
    inputs are the same either way (each is a pure function of its index)."""

    def __init__(self, cfg: TrainConfig, sentences: FreshSamples | CorpusBatches,
                 device: torch.device, *, pool: DownstreamPool | None = None,
                 prefetch: int = 0, workers: str = "threads", truth: Source | None = None):
        self.cfg, self.sentences, self.device, self.pool = cfg, sentences, device, pool
        self.transform = algorithm_named(cfg.algorithm).transform()  # None for most
        self.depth, self.workers = int(prefetch), workers
        self.truth = truth  # the source whose conditionals are the targets; None: sampled
        # the truth's inference runs on the training device (a GPU computes the paper grammar's
        # in a fraction of the ~9 s a CPU core takes for 4096 sentences), except in spawned
        # prefetch processes, which stay off the GPU
        processes = workers == "processes" and self.depth > 0
        self.truth_device = torch.device("cpu") if processes else torch.device(device)
        self._executor: Executor | None = None  # started at the first update (processes: spawn)
        self._ahead: dict[int, Future] = {}  # update index -> its inputs being prepared

    def __getstate__(self) -> dict:  # a prefetch process's copy: no executor, nothing ahead
        return {**self.__dict__, "_executor": None, "_ahead": {}, "depth": 0}

    def host_inputs(self, i: int) -> StepInputs:
        """Update i's inputs on the CPU, laid out for ``device`` (not pinned)."""
        tokens, lengths = self.sentences.batch_at(i)
        mlm = mask_batch(tokens, lengths, self.cfg.mask, generator(self.cfg.seed, "mask", i),
                         n_words=self.sentences.n_words, replace=self.cfg.mask_replace,
                         max_predictions=self.cfg.max_predictions, count=self.cfg.mask_count)
        if self.transform is not None:  # label_noise: its own random stream, the rest as sgd
            mlm = self.transform(mlm, self.cfg, self.sentences.n_words, i)
        if self.truth is not None:  # train.targets="truth"
            mlm = dataclasses.replace(mlm, soft_targets=true_targets(
                self.truth, tokens, lengths, mlm.positions, self.truth_device))
        layout = sequence_packing_for(self.cfg, self.device.type)
        if layout == "unpadded":
            mlm = mlm.grouped_by_length(lengths, self.cfg.sentences_per_pass)
        elif layout == "rows":  # one micro-batch's sentences share rows, never two
            mlm = into_rows(mlm, self.cfg.row_length,
                            self.cfg.micro_batch_size or self.cfg.sentences_per_pass)
        return StepInputs(mlm, self.pool.draw(i) if self.pool is not None else None)

    def _pinned(self, inputs: StepInputs) -> StepInputs:
        return inputs.pin_memory() if self.device.type == "cuda" else inputs

    def cpu_inputs(self, i: int) -> StepInputs:
        """Update i's inputs on the CPU, in pinned memory when bound for CUDA."""
        return self._pinned(self.host_inputs(i))

    def _submit(self, j: int) -> Future:
        if self._executor is None:
            if self.workers == "processes":
                self._executor = ProcessPoolExecutor(
                    self.depth, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_worker, initargs=(self,))
            else:
                self._executor = ThreadPoolExecutor(self.depth)
        if self.workers == "processes":  # pinned here: pages pinned there do not travel
            return self._executor.submit(_worker_inputs, j)
        return self._executor.submit(self.cpu_inputs, j)

    def inputs_at(self, i: int) -> StepInputs:
        """Update i's inputs on ``device``; a prefetch process that died (killed, out of
        memory) is a ``WorkerDied``, which the CLI ends with the resume command."""
        try:
            return self._inputs_at(i)
        except BrokenProcessPool:
            raise WorkerDied("a batch-building process (train.prefetch_workers=processes)"
                             ) from None

    def _inputs_at(self, i: int) -> StepInputs:
        if not self.depth:
            return self.cpu_inputs(i).to(self.device)
        ahead = self._ahead.pop(i, None)
        if ahead is None:
            inputs = self.cpu_inputs(i)
        elif self.workers == "processes":
            inputs = self._pinned(ahead.result())
        else:
            inputs = ahead.result()
        for j in [j for j in self._ahead if not i < j <= i + self.depth]:
            self._ahead.pop(j).cancel()  # a jump (resume, evaluation): not needed any more
        for j in range(i + 1, i + self.depth + 1):
            if j not in self._ahead:
                self._ahead[j] = self._submit(j)
        return inputs.to(self.device)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)

    def state_dict(self, i: int) -> dict:
        """The data position before update i, as plain data."""
        return {"kind": self.sentences.kind, "position": i, "batch_size": self.cfg.batch_size}

    def check_state(self, state: dict, i: int) -> None:
        """Raises if a saved data position does not continue this pipeline at update i."""
        if state != self.state_dict(i):
            raise ValueError(f"resume: the checkpoint's data position {state} does not match "
                             f"this run's {self.state_dict(i)} (train.data or batch_size changed)")
