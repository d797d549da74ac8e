"""bench/selection_v2.py: a committed trial trained again measures the selection measures at its
checkpoints, is checked to be the same model, lands in the records, and merges with the
committed trial into one run of the leaderboard; a record that another model made is refused."""

import json
import math
import shutil
from pathlib import Path

import pandas as pd

from analysis.same_training import merge_same_training
from analysis.trials import load_trials
from flatlm.core.config import apply_overrides
from flatlm.measure import KL, SHARPNESS_AVG, TRACE_FISHER, se_key
from flatlm.runs.trial import TrialConfig, run_trial
from flatlm.storage.metrics_log import METRICS_FILE
from tests.bench.conftest import bench_script

TINY = {
    "source": "pcfg:seed=0,random.vocab=12,random.roots=2,random.nonterminals_per_level=2,"
              "random.depth=2,random.binary_per_nonterminal=2,random.words_per_nonterminal=3",
    "model": "d16-h1-l1-i64", "train.steps": 8, "train.batch_size": 16,
    "train.warmup_steps": 2, "train.checkpoint_steps": [4, 8],
    "measure.what": ["loss", "fisher"], "measure.n_eval": 64,
    "measure.flatness.n_inputs": 32, "measure.sharpness.n_inputs": 32,
    "measure.sharpness.samples": 2, "measure.sharpness.steps": 2,
    "measure.precond.n_inputs": 32, "measure.critical.n_inputs": 32,
    "measure.spectrum.n_inputs": 32}


def load():
    return bench_script("selection_v2")


def committed(root: Path) -> Path:
    trial = root / "paper" / "algorithms" / "adamw_seed0"
    run_trial(apply_overrides(TrialConfig(), TINY), trial)
    return trial


def test_the_same_training_measured_again_joins_the_committed_run_and_another_is_refused(
        tmp_path):
    bench = load()
    trial = committed(tmp_path / "trials")
    records = tmp_path / "records"
    args = ["--trials", str(tmp_path / "trials"), "--runs", str(tmp_path / "runs"),
            "--records", str(records)]
    assert bench.main(args) == 0
    shutil.rmtree(tmp_path / "runs")
    assert bench.main(args) == 0  # recorded already and the same model: skipped, not trained
    assert not (tmp_path / "runs" / "paper").exists()
    again = records / "paper" / "algorithms-selection" / "adamw_seed0"
    config = json.loads((again / "config.json").read_text())
    assert config["measure"]["what"] == list(bench.SELECTION_WHAT)
    assert {k: v for k, v in config.items() if k != "measure"} == {
        k: v for k, v in json.loads((trial / "config.json").read_text()).items()
        if k != "measure"}
    df = pd.concat([load_trials(tmp_path / "trials"), load_trials(records)], ignore_index=True)
    merged, label = merge_same_training(df)
    assert len(set(label.values())) == 1  # one training, one run
    rows = merged.set_index("step")
    # Tr(F) from the committed trial, the sharpness from the second, at one checkpoint
    assert rows.loc[8, TRACE_FISHER] > 0 and math.isfinite(rows.loc[8, SHARPNESS_AVG])
    # a record rounded otherwise (its KL 1e-4 s.e. off: float32 on another machine) is the same
    # model; one 2e-3 s.e. off (a model trained otherwise) is refused, not copied
    rows = [json.loads(line) for line in (trial / METRICS_FILE).read_text().splitlines()]
    for share, landed in ((1e-4, True), (2e-3, False)):
        moved = [{**r, KL: r[KL] + share * r[se_key(KL)]} if r is rows[-1] else r for r in rows]
        (trial / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in moved))
        shutil.rmtree(records)
        assert bench.main(args) == (0 if landed else 1)  # trained again; the check decides
        assert records.exists() == landed
