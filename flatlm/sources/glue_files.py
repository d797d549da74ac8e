"""GLUE-shaped task files, read with ``datasets``: the downstream data of the text source.

A GLUE directory holds one folder per task, named as GLUE names it (``SST-2``, ``sst2``, ``CoLA``,
``MRPC`` ...), with a ``train`` and a ``dev`` (or ``validation``) file each, ``.tsv`` (GLUE's own
layout: tab-separated, a header row, no quoting) or ``.jsonl``. The columns are those of the
Hugging Face ``glue`` dataset: the task's text field(s) (``TEXT_FIELDS``) and an integer
``label`` 0..C-1. STS-B (a regression) is not supported.

>>> task_name("SST-2"), task_name("CoLA"), task_name("mnli")
('sst2', 'cola', 'mnli')
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

# task -> its text column(s), as in the Hugging Face ``glue`` dataset
TEXT_FIELDS = {
    "cola": ("sentence",),
    "sst2": ("sentence",),
    "mrpc": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"),
    "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"),
}
SPLITS = {"train": ("train",), "dev": ("dev", "validation")}
SUFFIXES = (".tsv", ".jsonl")


def task_name(folder: str) -> str:
    """GLUE's folder name (``SST-2``) -> the task's key (``sst2``)."""
    return folder.lower().replace("-", "").replace("_", "")


@dataclass(frozen=True)
class GlueTask:
    """One task's rows: per split a list of text tuples and a list of integer labels."""

    name: str
    texts: dict[str, list[tuple[str, ...]]]  # split -> rows of the task's text fields
    labels: dict[str, list[int]]  # split -> labels 0..num_classes-1
    num_classes: int


def _split_file(folder: Path, split: str) -> Path:
    for stem in SPLITS[split]:
        for suffix in SUFFIXES:
            if (folder / f"{stem}{suffix}").is_file():
                return folder / f"{stem}{suffix}"
    names = " or ".join(f"{s}{x}" for s in SPLITS[split] for x in SUFFIXES)
    raise ValueError(f"text spec 'glue': {folder} has no {split} file; add {names}")


def _rows(path: Path):
    """The file's rows as a ``datasets.Dataset`` (GLUE's tsv: no quoting)."""
    from datasets import load_dataset

    if path.suffix == ".tsv":
        return load_dataset("csv", data_files=str(path), delimiter="\t",
                            quoting=csv.QUOTE_NONE, split="train", keep_default_na=False)
    return load_dataset("json", data_files=str(path), split="train")


def _read_split(task: str, path: Path) -> tuple[list[tuple[str, ...]], list[int]]:
    rows = _rows(path)
    missing = [c for c in (*TEXT_FIELDS[task], "label") if c not in rows.column_names]
    if missing:
        raise ValueError(f"text spec 'glue': {path} lacks column(s) {missing}; GLUE's {task} "
                         f"needs {', '.join((*TEXT_FIELDS[task], 'label'))}")
    labels = list(rows["label"])
    if not all(isinstance(y, int) and not isinstance(y, bool) and y >= 0 for y in labels):
        raise ValueError(f"text spec 'glue': {path}: 'label' must hold integers >= 0 (class ids)")
    texts = list(zip(*(map(str, rows[c]) for c in TEXT_FIELDS[task]), strict=True))
    return texts, labels


def read_glue(directory: str | Path) -> dict[str, GlueTask]:
    """Every task folder under ``directory`` (sorted by key); a ValueError naming the folder or
    file for an unknown task, a missing split, a missing column or a non-integer label."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"text spec 'glue': {directory} is not a directory of GLUE task folders")
    tasks = {}
    for folder in sorted(p for p in directory.iterdir() if p.is_dir()):
        name = task_name(folder.name)
        if name not in TEXT_FIELDS:
            raise ValueError(f"text spec 'glue': folder {folder.name!r} is not a GLUE "
                             f"classification task; use one of {', '.join(TEXT_FIELDS)}")
        texts, labels = {}, {}
        for split in SPLITS:
            texts[split], labels[split] = _read_split(name, _split_file(folder, split))
        tasks[name] = GlueTask(name, texts, labels, 1 + max(labels["train"] + labels["dev"]))
    if not tasks:
        raise ValueError(f"text spec 'glue': {directory} holds no task folder (e.g. SST-2/)")
    return dict(sorted(tasks.items()))
