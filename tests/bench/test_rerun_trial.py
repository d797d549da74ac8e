"""bench/rerun_trial.py: a trial rerun from its config.json matches its records bit for bit, and
a record changed by hand is named."""

import json

import pytest

from flatlm.core.config import apply_overrides
from flatlm.runs.trial import TrialConfig, run_trial
from flatlm.storage.metrics_log import METRICS_FILE
from tests.bench.conftest import bench_script


def load():
    return bench_script("rerun_trial")


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


def test_a_cut_keeps_the_runs_rates_a_warmup_share_pinned_and_a_decay_refused():
    rerun = load()
    cfg = apply_overrides(TrialConfig(), {
        "train.algorithm": "sgd", "train.steps": 3500, "train.warmup_steps": None,
        "train.warmup_proportion": 0.12, "train.checkpoint_steps": [500, 3500]})
    cut = rerun.cut_at(cfg, 1)
    assert cut.train.steps == 500 and cut.train.warmup_steps == 420  # 12% of 3500, not of 500
    assert cut.train.warmup_proportion is None
    assert rerun.cut_at(cfg, 2) == cfg  # every checkpoint: the config as it is
    decay = apply_overrides(cfg, {"train.schedule": "linear"})
    with pytest.raises(SystemExit, match="--checkpoints 2"):
        rerun.cut_at(decay, 1)
