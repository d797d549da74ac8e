"""The experiments' names and grids as plain data, importable without torch (a sweep script's
``--help`` reads them), and the one naming rule of a trial; ``paper`` builds the experiments
from them."""

import re

EXPERIMENTS = ("steps", "sizes", "algorithms", "sgd")  # the replication's, one per claim
EXTRA_EXPERIMENTS = ("selection", "search")  # the sweeps' beyond the paper's figures
COMPARED_ALGORITHMS = ("adamw", "adversarial", "noreg", "sam")  # the algorithms experiment's
#   arms (Tables 1-2); every registered algorithm is flatlm.train.config.ALGORITHMS
SELECTION_ALGORITHMS = ("adamw", "sam", "noreg")
SELECTION_WHAT = ("eigen", "sharpness")  # measured beside the base's loss, Tr(F), Tr(H)
# The search's distributions, as data (the sweeps turn them into Ray Tune's): key -> (kind, low,
# high) with kind "uniform" or "loguniform".
SEARCH_SPACE = {"train.lr": ("loguniform", 1e-4, 3e-3), "train.beta2": ("uniform", 0.9, 0.999),
                "train.weight_decay": ("loguniform", 1e-4, 1e-1),
                "train.dropout": ("uniform", 0.0, 0.2)}


def trial_name(point: dict) -> str:
    """The one naming rule of a trial (its directory, MLflow run and console lines): what it
    varies, joined by ``_``; a model, algorithm or source by its value, anything else by the key's
    last part and the value (``d32-h2-l1-i128_seed2_lr0.000316``). A Ray sweep appends its trial
    id (``sweeps.console.trial_label``)."""
    return "_".join(_name_piece(key, value) for key, value in point.items())


def _name_piece(key: str, value) -> str:
    short = key.split(".")[-1]
    if short in ("model", "algorithm", "source"):
        text = str(value)
    else:
        text = f"{short}{value:.3g}" if isinstance(value, float) else f"{short}{value}"
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text)[:40]
