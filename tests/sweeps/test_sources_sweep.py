"""Every source sweeps, by ``--source``: the scaling sweep's two tiny BiLSTMs on an HMM, and a
one-trial sweep on Dyck and on the text of a tiny causal LM (then the analysis report on each
MLflow store), end to end through the real
command line (``sweeps.cli.main``), real Ray and a real MLflow sqlite store.

The task the sweep shows, searches on and summarises comes from the source's defaults
(``flatlm/experiments/presets.py``: task-6 of an HMM, g_star of Dyck), never a hard-coded PCFG task.
"""

import csv
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("mlflow")

from flatlm.sources import SourceSpec  # noqa: E402
from tests.sweeps.sweeptools import (  # noqa: E402
    LOOSE_RULE,
    SCALING,
    TINY,
    Sweep,
    one_trial_script,
    script_env,
    set_args,
)

STEPS = [10, 20]
ONE_TRIAL = one_trial_script(
    "One tiny trial of the tiny preset, on whatever source --source gives.", "sources",
    "d16-h1-l1-i32")


@pytest.mark.slow
@pytest.mark.parametrize(("source", "task", "models"), [
    pytest.param("hmm:seed=0,vocab=20,states=6,length=6,blocks=2", "task-6",
                 ["lstm-h16-l1", "lstm-h32-l2"], id="hmm-scaling-lstms"),
    pytest.param("dyck:6", "g_star", ["d16-h1-l1-i32"], id="dyck"),
    pytest.param("lm", "mask-1", ["d16-h1-l1-i32"], id="lm-text"),  # a tiny GPT-2, built here
])
def test_a_tiny_sweep_of_any_source_finishes_with_its_task_measured(tmp_path, ray_tmpdir,
                                                                      source, task, models):
    from mlflow import MlflowClient

    if source == "lm":
        source = f"lm:{tiny_lm(tmp_path / 'lm')},vocab=4,length=4,rule=bos"
    script = tmp_path / "one_trial.py"
    script.write_text(ONE_TRIAL)
    env = script_env(ray_tmpdir)
    tiny = {k: v for k, v in TINY.items() if k != "measure.tasks"}  # the source's defaults
    args = ["--source", source, "--name", "sources", *set_args(tiny), *LOOSE_RULE]
    sweep = Sweep(args, tmp_path, env, script=SCALING if len(models) > 1 else script)
    rc = sweep.wait_then_clean(300, ray_tmpdir)
    assert rc == 0, sweep.tail()

    accuracy = f"probe/{task}/acc_mean"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("sources").experiment_id])
    assert sorted(run.data.tags["model"] for run in runs) == models
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.tags["source"] == str(SourceSpec(source))  # its canonical form
        for key in ("pretrain/loss", "pretrain/kl", "flat/trace_fisher", accuracy):
            history = client.get_metric_history(run.info.run_id, key)
            assert sorted(m.step for m in history) == STEPS, key
        assert 0.0 <= run.data.metrics[accuracy] <= 1.0
        names = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"curves.png", "metrics.jsonl", "trial_config.json"} <= names, names
    out = sweep.stdout
    assert f" {task}/acc_mean=" in out  # the result lines show the source's task
    assert f"What this sweep shows ({accuracy})" in out, sweep.tail()
    assert "Per run, final checkpoint" in out and "| majority class " in out
    assert f"--task {task} " in out
    assert "Measuring took " in out  # time/measure_share reached MLflow and the summary
    assert_the_report_reads_the_sweep(tmp_path, uri, task, models)


def tiny_lm(path: Path) -> str:
    """A random 1-layer GPT-2 (9 tokens, id 8 its BOS), saved: the LM-text source's model."""
    from transformers import AutoModelForCausalLM, GPT2Config

    config = GPT2Config(vocab_size=9, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                        bos_token_id=8, eos_token_id=8, pad_token_id=8, initializer_range=1.0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return str(path)


def assert_the_report_reads_the_sweep(tmp_path, uri: str, task: str, models: list[str]) -> None:
    """``analysis/report.py`` on the sweep's store: every model's checkpoints in its table."""
    from analysis.report import main
    from tests.inprocess import run_main

    report = tmp_path / "report"
    done = run_main(main, ["--experiment", "sources", "--task", task, "--out", report,
                           "--kl-threshold", "100", "--tracking-uri", uri, "--n-boot", "50",
                           "--no-log"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(report / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted({row["model"] for row in rows}) == models
    assert sorted(int(float(row["step"])) for row in rows) == sorted(STEPS * len(models))
    assert all(0.0 <= float(row[f"probe/{task}/acc_mean"]) <= 1.0 for row in rows)
    assert (report / "conclusion.md").read_text().strip()
