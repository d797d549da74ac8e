"""Source -> corpus on disk: train / validation / downstream splits as Hugging Face Arrow datasets
plus ``metadata.json``.

Layout written by ``make_corpus(src, cfg, out_dir)`` (``datasets.load_from_disk(out_dir)`` reads
it as a ``DatasetDict``; ``load_corpus`` also checks it)::

    out_dir/dataset_dict.json
    out_dir/{train,validation,downstream}/data-0000i-of-0000k.arrow, dataset_info.json, state.json
    out_dir/metadata.json          written last: a directory without it is an unfinished corpus

Columns (one row per sentence):

- ``tokens``: fixed-size list of T int32 word ids (0..V-1), padded with -1 past ``length``; the
  same layout as ``Source.sample`` (T = ``max_length``), so ``corpus_tensors`` gives back exactly
  what the source sampled.
- ``length``: int32, the sentence length in words.
- downstream only, one per task: ``label_<task>`` int64 class index in 0..num_classes-1, -1 where
  the task is undefined for that sentence. Dyck's g* (which can be negative) is stored as the class
  index g* + ``label_offset[task]`` (metadata), like ``Dyck.num_classes`` counts it.

What each split holds: train and validation are ``src.sample`` (the pre-training distribution).
Downstream is the paper's downstream data: PCFG sentences with parse-tree labels (rule ``inside``
or ``posterior``); HMM sentences labelled by the hidden state the sampler drew (rule ``sampled``,
the default: the paper classifies the hidden variable) or by its posterior argmax; Dyck strings of
i.i.d. brackets (``sample_downstream``) labelled by g*.

Seeds: split i (0 train, 1 validation, 2 downstream) is generated in chunks of ``chunk_size``
sentences; chunk k is ``src.sample(m, seed=SeedSequence(seed, spawn_key=(i, k)).generate_state(1))``
(a uint32), so splits are independent streams, and each chunk can be regenerated on its own from
the seeds listed in the metadata. The same config gives byte-identical files: the data are
integers, ``state.json`` carries a fingerprint we derive from the metadata (not ``datasets``'
own), and nothing written holds a time or path. The entropy in the metadata is a float64 sum
computed on the given device; it is rounded to 1e-10 so that summation-order noise across machines
does not change the bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import torch
from tqdm.auto import tqdm

import flatlm
from flatlm.core import tokens as token_layout
from flatlm.core.safe_io import check_output_dir, write_atomic
from flatlm.core.stats import ratio_mean_se
from flatlm.sources.base import PAD, Source

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "downstream")
FORMAT = "flatlm.corpus/1"
METADATA = "metadata.json"


@dataclass(frozen=True, kw_only=True)
class CorpusConfig:
    """How many sentences of each split, from which seed, labelled by which rule.

    ``n_validation`` and ``n_downstream`` default to n_train // 10 (at least 1); ``__post_init__``
    fills them in, so ``asdict(cfg)`` (written to the metadata) always holds the numbers used.
    """

    n_train: int  # pre-training sentences, >= 1 (the paper: 1M-ish)
    n_validation: int | None = None  # held-out pre-training sentences; None = n_train // 10
    n_downstream: int | None = None  # labelled sentences; None = n_train // 10 (paper: 0.1M/task)
    seed: int = 0  # >= 0; the split and chunk seeds derive from it (module docstring)
    label_rule: str | None = None  # None = the source's default (src.label_rules[0])
    tasks: tuple[str, ...] | None = None  # downstream tasks to label; None = all of src.tasks
    n_entropy: int | None = 20_000  # first validation sentences whose exact conditionals give
    #   the metadata's entropy; None = all; capped at n_validation (20k: se ~ 0.004 nats, minutes
    #   on a CPU for the paper's PCFG)
    chunk_size: int = 65_536  # sentences per generation chunk; part of the data's definition

    def __post_init__(self):
        default = max(1, self.n_train // 10)
        for name in ("n_validation", "n_downstream"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)  # frozen: resolve the default once
        if self.tasks is not None:
            object.__setattr__(self, "tasks", tuple(self.tasks))
        for name in ("n_train", "n_validation", "n_downstream", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"CorpusConfig.{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"CorpusConfig.seed must be an int >= 0, got {self.seed!r}")
        if self.n_entropy is not None and self.n_entropy < 0:
            raise ValueError(f"CorpusConfig.n_entropy must be >= 0 or None, got {self.n_entropy}")

    @property
    def sizes(self) -> dict[str, int]:
        return {"train": self.n_train, "validation": self.n_validation,
                "downstream": self.n_downstream}


def chunk_seeds(seed: int, split: str, n: int, chunk_size: int) -> list[int]:
    """The uint32 seed of each chunk of ``split`` (see the module docstring).

    >>> seeds = chunk_seeds(0, "train", 5, 2)  # 3 chunks: 2 + 2 + 1 sentences
    >>> len(seeds), seeds == chunk_seeds(0, "train", 5, 2)
    (3, True)
    >>> chunk_seeds(0, "train", 5, 2) == chunk_seeds(0, "validation", 5, 2)
    False
    """
    i = SPLITS.index(split)
    count = -(-n // chunk_size)
    return [int(np.random.SeedSequence(seed, spawn_key=(i, k)).generate_state(1)[0])
            for k in range(count)]


def _generate_split(src, split, seeds, cfg, rule, tasks, device, bar) -> dict[str, np.ndarray]:
    """All rows of one split (``cfg.sizes[split]`` of them) as numpy columns, chunk by chunk
    (``bar`` counts sentences)."""
    n = cfg.sizes[split]
    parts: dict[str, list[np.ndarray]] = {}
    for k, seed in enumerate(seeds):
        m = min(cfg.chunk_size, n - k * cfg.chunk_size)
        if split == "downstream":
            tokens, lengths, labels = src.sample_downstream(m, seed, rule=rule, tasks=tasks,
                                                            device=device)
        else:
            (tokens, lengths), labels = src.sample(m, seed), {}
        cols = {"tokens": tokens.numpy().astype(np.int32),
                "length": lengths.numpy().astype(np.int32),
                **{f"label_{t}": y.numpy().astype(np.int64) for t, y in labels.items()}}
        for name, col in cols.items():
            parts.setdefault(name, []).append(col)
        bar.update(m)
    return {name: np.concatenate(p) for name, p in parts.items()}


def _dataset(columns: dict[str, np.ndarray], split: str, T: int, fingerprint: str,
             description: str):
    """An in-memory ``datasets.Dataset`` with a fixed-size ``tokens`` column and our fingerprint."""
    features = datasets.Features({
        name: datasets.List(datasets.Value("int32"), length=T) if name == "tokens"
        else datasets.Value(str(col.dtype)) for name, col in columns.items()})
    arrays = {name: pa.FixedSizeListArray.from_arrays(pa.array(col.ravel()), T)
              if name == "tokens" else pa.array(col) for name, col in columns.items()}
    table = pa.table(arrays, schema=features.arrow_schema)
    info = datasets.DatasetInfo(features=features, description=description)
    # An explicit fingerprint: state.json stores it, and ours depends only on the metadata.
    return datasets.Dataset(datasets.table.InMemoryTable(table), info=info,
                            split=datasets.NamedSplit(split), fingerprint=fingerprint)


def _validation_entropy(src, columns, n_entropy, device, progress) -> dict:
    n = len(columns["length"]) if n_entropy is None else min(n_entropy, len(columns["length"]))
    if n == 0:
        return {"entropy": None, "entropy_se": None, "entropy_n_sentences": 0,
                "entropy_n_tokens": 0}
    tokens = torch.from_numpy(columns["tokens"][:n].astype(np.int64))
    lengths = torch.from_numpy(columns["length"][:n].astype(np.int64))
    sums = src.sentence_entropies(tokens, lengths, batch_size=8192, device=device,
                                  progress=progress)
    mean, se = ratio_mean_se(sums, lengths.numpy().astype(np.float64))
    return {"entropy": round(mean, 10), "entropy_se": round(se, 10) if se == se else None,
            "entropy_n_sentences": n, "entropy_n_tokens": int(lengths.sum())}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _file_hashes(out_dir: Path) -> dict[str, str]:
    """sha256 of every file ``datasets`` wrote, keyed by its posix path under ``out_dir``."""
    files = sorted(p for p in out_dir.rglob("*") if p.is_file() and p.name != METADATA)
    return {p.relative_to(out_dir).as_posix(): _sha256(p) for p in files}


@contextlib.contextmanager
def _datasets_progress(enabled: bool):
    """Turns ``datasets``' own bars (save_to_disk) off when we are quiet, then restores them."""
    was_disabled = datasets.are_progress_bars_disabled()
    if not enabled:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def _resolve(src: Source, cfg: CorpusConfig) -> tuple[str, tuple[str, ...]]:
    try:
        return src.check_downstream(cfg.label_rule, cfg.tasks)
    except ValueError as e:
        raise ValueError(f"corpus: {e}") from None


def make_corpus(src: Source, cfg: CorpusConfig, out_dir, *, device=None,
                progress: bool = True) -> Path:
    """Writes the corpus ``cfg`` describes for ``src`` under ``out_dir``; returns its path.

    ``out_dir`` must not exist or be empty. ``device`` runs the exact conditionals (entropy) and the
    labels; it does not change the data. Raises ``ValueError`` for a bad rule, task or directory.
    """
    out_dir = Path(out_dir).absolute()
    if out_dir.exists() and not out_dir.is_symlink() and any(out_dir.iterdir()):
        raise ValueError(f"{out_dir} exists and is not empty; choose a new directory")
    if src.spec is None:
        raise ValueError("the source has no spec (built from arrays?); save it to a file first")
    if not src.has_truth and cfg.n_entropy:
        raise ValueError(f"n_entropy={cfg.n_entropy}: the {type(src).__name__} source has no "
                         "truth, so no entropy; use n_entropy=0 (--n-entropy 0)")
    rule, tasks = _resolve(src, cfg)
    out_dir = check_output_dir(out_dir)  # a link or a file: refused before any work (created
    #   only once the settings are checked)
    seeds = {s: chunk_seeds(cfg.seed, s, n, cfg.chunk_size) for s, n in cfg.sizes.items()}
    meta = _metadata(src, cfg, rule, tasks, seeds)
    # The datasets' fingerprints (state.json) come from what defines the data, not the entropy.
    digest = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()
    columns = {}
    with tqdm(total=sum(cfg.sizes.values()), desc="sentences", unit="sent",
              disable=not progress) as bar:
        for split in cfg.sizes:
            columns[split] = _generate_split(src, split, seeds[split], cfg, rule, tasks,
                                             device, bar)
    meta.update(_validation_entropy(src, columns["validation"], cfg.n_entropy, device, progress))
    _save(columns, meta, digest, out_dir, src.max_length, progress)
    meta["files"] = _file_hashes(out_dir)
    write_atomic(out_dir / METADATA, json.dumps(meta, indent=2) + "\n")
    return out_dir


def _save(columns, meta, digest: str, out_dir: Path, T: int, progress: bool) -> None:
    splits = datasets.DatasetDict({
        split: _dataset(cols, split, T, fingerprint=f"{digest[:12]}{i:04x}",
                        description=f"flatlm corpus, split {split!r} of source "
                                    f"{json.dumps(meta['source']['spec'], sort_keys=True)}; "
                                    f"see ../{METADATA}")
        for i, (split, cols) in enumerate(columns.items())})
    with _datasets_progress(progress):
        splits.save_to_disk(str(out_dir))


def _metadata(src: Source, cfg, rule, tasks, seeds) -> dict:
    """Everything needed to rebuild or check the corpus without reading the Arrow files."""
    return {
        "format": FORMAT,
        "flatlm_version": flatlm.__version__,
        "datasets_version": datasets.__version__,  # the Arrow files' bytes depend on it
        "source": {"spec": src.spec, "kind": src.spec.get("kind"),
                   "fingerprint": src.fingerprint()},
        "vocab": list(src.vocab),
        "max_length": src.max_length,
        "padding": PAD,
        "special_tokens": dict(token_layout.SPECIAL_TOKENS),
        "word_offset": token_layout.WORD_OFFSET,
        "input_layout": token_layout.INPUT_LAYOUT,
        "seed": cfg.seed,
        "config": dataclasses.asdict(cfg),
        "splits": {s: {"n": n, "chunk_seeds": seeds[s],
                       "sampler": "sample_downstream" if s == "downstream" else "sample"}
                   for s, n in cfg.sizes.items()},
        "label_rule": rule,
        "tasks": list(tasks),
        "num_classes": {t: src.num_classes(t) for t in tasks},
        "label_offset": {t: src.label_offset for t in tasks},
        "label_columns": {t: f"label_{t}" for t in tasks},
    }


def load_corpus(path, *, verify: bool = True, source: Source | None = None):
    """``(DatasetDict of the three splits, metadata dict)`` from a ``make_corpus`` directory.

    With ``verify`` every file's sha256 must match the metadata; with ``source`` its fingerprint
    must match the corpus's. Raises ``ValueError`` naming what does not match. The splits are
    memory-mapped (``datasets.load_from_disk``).
    """
    path = Path(path)
    if not (path / METADATA).is_file():
        raise ValueError(f"{path}: no {METADATA}; not a flatlm corpus (or an unfinished one)")
    meta = json.loads((path / METADATA).read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    if verify:
        for name, digest in meta["files"].items():
            if not (path / name).is_file():
                raise ValueError(f"{path}: file {name} listed in {METADATA} is missing")
            if _sha256(path / name) != digest:
                raise ValueError(f"{path}: file {name} does not match its sha256 in {METADATA} "
                                 "(modified or corrupt)")
    recorded = meta["source"]["fingerprint"]
    if source is not None and source.fingerprint() != recorded:
        raise ValueError(f"{path}: the corpus was made from another language (fingerprint "
                         f"{recorded[:12]}, source {source.fingerprint()[:12]})")
    return datasets.load_from_disk(str(path)), meta


def corpus_tensors(split: datasets.Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [n, T] int64 (padding -1) and lengths [n] int64 of a split, as ``Source.sample``
    returns them. Honours a split's row selection (``select``, ``shuffle``)."""
    table = split.with_format("arrow")[:]  # applies any indices mapping
    tokens = table.column("tokens").combine_chunks()
    T = tokens.type.list_size
    flat = tokens.flatten().to_numpy(zero_copy_only=False)
    lengths = table.column("length").to_numpy()
    return (torch.from_numpy(flat.reshape(-1, T).astype(np.int64)),
            torch.from_numpy(lengths.astype(np.int64)))
