"""Trials that train one model, found and merged into one run.

Experiments repeat trainings: the replication's sizes trial of the base shape is the steps trial of
its seed, checkpointed elsewhere, and the algorithms experiment's AdamW trial is the same again.
An analysis over runs (a cluster bootstrap, a count of runs) must count such a training once, with
the union of its checkpoints; otherwise its intervals are too narrow and its n too large.
"""

from __future__ import annotations

import pandas as pd

from analysis.correlate import RUN
from flatlm.measure import KL, LOSS
from flatlm.train.config import SCHEDULING_KEYS

MODEL = "model"  # config.json's model, a column of analysis.trials.load_trials
# when checkpoints are taken and logged changes the records, not the model trained
NOT_TRAINING = tuple(f"train.{key}" for key in SCHEDULING_KEYS)


def same_training(df: pd.DataFrame) -> dict[str, str]:
    """{run_id: the label of its training}. Trials with the same model, source and training
    settings (but when checkpoints are taken), or sharing a checkpoint (the same step, loss and
    KL to the last digit), train one model: one run, labelled ``a = b``. The replication's
    sizes trial of the base shape repeats the steps trial of its seed, for example."""
    runs = list(dict.fromkeys(df[RUN]))
    parent = {r: r for r in runs}

    def root(r: str) -> str:
        while parent[r] != r:
            r = parent[r]
        return r

    for rows, key in _identities(df):
        for members in rows.groupby(key)[RUN].unique():
            for other in members[1:]:
                parent[root(other)] = root(members[0])
    groups: dict[str, list[str]] = {}
    for r in runs:
        groups.setdefault(root(r), []).append(r)
    return {r: " = ".join(sorted(groups[root(r)])) for r in runs}


def _identities(df: pd.DataFrame) -> list[tuple[pd.DataFrame, object]]:
    """(rows, key): the keys two trials of one training share: their settings, or a measured
    checkpoint after step 0 (at step 0, runs of one seed hold one initialisation whatever they
    go on to train)."""
    cols = [c for c in df.columns if (c == MODEL or c.startswith(("train.", "source.")))
            and c not in NOT_TRAINING]
    keys = []
    if "train.seed" in cols:  # without the seed, the settings cannot tell replicates apart
        # repr: the settings include lists and NaN, which neither hash nor compare equal; an
        # unset setting is None or NaN as the frames concatenated happened to hold it
        settings = df[cols].astype(object)
        settings = settings.where(settings.notna(), None)
        keys.append((df, pd.Series([repr(r) for r in settings.itertuples(index=False)],
                                   index=df.index)))
    if {LOSS, KL}.issubset(df.columns):
        keys.append((df[df["step"] > 0], ["step", LOSS, KL]))
    return keys


def merge_same_training(df: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """``df`` with the trials of one training as one run (``same_training``) and their
    checkpoints at one step as one row (each value from the first trial that has it), and the
    map of trial to run."""
    label = same_training(df)
    if all(k == v for k, v in label.items()):
        return df, label
    merged = (df.assign(**{RUN: df[RUN].map(label)})
              .groupby([RUN, "step"], sort=False, as_index=False).first())
    return merged, label
