"""bench/rerun_trial.py: a trial rerun from its config.json matches its records bit for bit, and
a record changed by hand is named."""

import importlib.util
import json
from pathlib import Path

from flatlm.core.config import apply_overrides
from flatlm.runs.trial import TrialConfig, run_trial
from flatlm.storage.metrics_log import METRICS_FILE

SCRIPT = Path(__file__).parents[2] / "bench" / "rerun_trial.py"


def load():
    spec = importlib.util.spec_from_file_location("rerun_trial", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_rerun_matches_the_records_and_a_changed_one_is_named(tmp_path):
    cfg = apply_overrides(TrialConfig(), {
        "source": "pcfg:seed=0,random.vocab=12,random.roots=2,random.nonterminals_per_level=2,"
                  "random.depth=2,random.binary_per_nonterminal=2,random.words_per_nonterminal=3",
        "model": "d16-h1-l1-i64", "train.steps": 12, "train.batch_size": 16,
        "train.warmup_steps": 2, "train.checkpoint_steps": [6, 12],
        "measure.what": ["loss"], "measure.n_eval": 64})
    trial = tmp_path / "trial"
    run_trial(cfg, trial)
    rerun = load()
    compared, differ = rerun.rerun(trial, checkpoints=1)
    assert compared > 5 and differ == []
    rows = [json.loads(line) for line in (trial / METRICS_FILE).read_text().splitlines()]
    rows[0]["pretrain/kl"] += 1e-12
    (trial / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, differ = rerun.rerun(trial, checkpoints=1)
    assert len(differ) == 1 and "step 6 pretrain/kl" in differ[0]
