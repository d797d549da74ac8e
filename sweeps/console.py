"""What the sweep prints while it runs: a trial's name and one line per reported checkpoint."""

from __future__ import annotations

from flatlm.experiments.grids import trial_name
from flatlm.runs.headline import short_line
from sweeps.rayenv import tune


class OneLinePerResult(tune.Callback):
    """Prints one readable line per reported checkpoint (the default tables are noisy): the
    line ``flatlm trial`` prints (``flatlm.runs.headline``)."""

    def __init__(self, keys: tuple[str, ...]):
        self.keys = keys

    def on_trial_result(self, iteration, trials, trial, result, **info):
        members = result.get("members")  # a pack's result: each member's line (pack_trainable)
        for name, row in (members.items() if members else [(trial, result)]):
            print(f"[{name}] {short_line(row.get('step'), row, self.keys)}", flush=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        print(f"[{trial}] failed; it will retry from its last checkpoint if it can",
              flush=True)


def trial_label(trial) -> str:
    """A trial's name: what it varies (``flatlm.experiments.grids.trial_name``, the rule the
    local runner names its trials by), then Ray's id (unique, stable across retries and
    resumes): ``d32-h2-l1-i128_seed0_1a0e7_00000``. It names the MLflow run, the console lines
    and the trial directory."""
    pack = trial.config.get("pack")
    if pack is not None and len(pack) > 1:
        return f"pack{len(pack)}_{trial.trial_id}"
    varied = trial_name(pack[0] if pack is not None else trial.config.get("overrides", {}))
    return f"{varied}_{trial.trial_id}" if varied else trial.trial_id


def member_label(point: dict, pack_id: str, index: int) -> str:
    """Member ``index`` of a pack (Ray trial ``pack_id``): what it varies, the pack's Ray id and
    its place in it (``seed1_1a0e7_00000-1``): its MLflow run, trial directory and lines."""
    varied = trial_name(point)
    return f"{varied}_{pack_id}-{index}" if varied else f"{pack_id}-{index}"
