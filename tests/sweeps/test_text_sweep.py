"""Real text sweeps: ``python sweeps/scaling.py --set source=text:...`` on a tiny local corpus,
tokenizer and GLUE-shaped SST-2, one trial, end to end through real Ray and an MLflow sqlite store;
its GLUE metric and one-hot loss reach MLflow, the summary uses --loss-tolerance (no truth, no
KL), and analysis/report.py reads the runs back."""


import pytest

pytest.importorskip("ray")
pytest.importorskip("mlflow")

from tests.assets.text_assets import make_text_assets, text_spec  # noqa: E402
from tests.sweeps.sweeptools import TINY, Sweep, one_trial_script, script_env, set_args  # noqa: E402

ONE_TRIAL = one_trial_script("One tiny trial of the tiny preset, on whatever source --set gives.",
                             "text", "d16-h1-l1-i32")


@pytest.mark.slow
def test_a_tiny_text_sweep_reaches_mlflow_and_the_report(tmp_path, ray_tmpdir):
    from mlflow import MlflowClient

    spec = text_spec(make_text_assets(tmp_path / "assets"), length=16)
    script = tmp_path / "one_trial.py"
    script.write_text(ONE_TRIAL)
    env = script_env(ray_tmpdir)
    overrides = {**TINY, "source": spec, "measure.tasks": '["sst2"]', "train.mask": "0.15",
                 "measure.what": '["loss","fisher","probe","glue"]',
                 "measure.finetune.epochs": "1", "measure.finetune.seeds": "1"}
    sweep = Sweep([*set_args(overrides), "--loss-tolerance", "10"], tmp_path, env, script=script)
    rc = sweep.wait_then_clean(300, ray_tmpdir)
    assert rc == 0, sweep.tail()

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("text").experiment_id])
    for key in ("pretrain/loss", "pretrain/loss_data", "flat/trace_fisher",
                "probe/sst2/acc_mean", "glue/sst2/accuracy"):
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == \
            [10, 20], key
    assert "pretrain/kl" not in run.data.metrics
    out = sweep.stdout
    assert "pretrain/loss - min pretrain/loss (no truth) <= 10" in out, sweep.tail()
    assert "--loss-tolerance 10 " in out

    from analysis.report import main
    from tests.inprocess import run_main

    report = run_main(main, ["--experiment", "text", "--tracking-uri", uri, "--task", "sst2",
                             "--loss-tolerance", "10", "--out", tmp_path / "report",
                             "--n-boot", "50"], cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-3000:]
    assert "glue/sst2/accuracy" in (tmp_path / "report" / "runs.csv").read_text().splitlines()[0]
