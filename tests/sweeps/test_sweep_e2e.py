"""``python sweeps/scaling.py`` end to end: real Ray, a real MLflow sqlite store, the closing table.

The sweep runs as a subprocess in an empty directory, shrunk with ``--set`` (3 trials of 20 steps,
checkpoints at 10 and 20). Bad configurations must fail with exit code 2 and a message naming the
fix before any trial starts: those refused before Ray starts are run in this process (a
subprocess costs about 5 CPU-s of importing torch; the script's own start is tested by
tests/test_readme.py), the one Ray must answer (no node has a GPU) as a subprocess.
"""

import json
import re

import pytest

pytest.importorskip("ray")
pytest.importorskip("mlflow")

from mlflow import MlflowClient  # noqa: E402

from flatlm.experiments.scales import TESTBED_MODELS  # noqa: E402
from flatlm.runs.headline import display_columns  # noqa: E402
from tests.sweeps.sweeptools import (  # noqa: E402
    LOOSE_RULE,
    TINY,
    Sweep,
    assert_exactly_once,
    results_of,
    scaling_here,
    set_args,
    sweep_env,
)

STEPS = [10, 20]


@pytest.mark.slow
def test_scaling_sweep_end_to_end(tmp_path, ray_tmpdir):
    sweep = Sweep([*set_args(TINY), *LOOSE_RULE], tmp_path, sweep_env(ray_tmpdir))
    rc = sweep.wait_then_clean(600, ray_tmpdir)
    assert rc == 0, sweep.tail()

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    runs = assert_exactly_once(uri, "scaling", tmp_path / "trials" / "scaling", STEPS, n_trials=3)
    assert sorted(r.data.tags["model"] for r in runs) == sorted(
        TESTBED_MODELS)  # the testbed's three: one head size, they grow
    assert all((r.data.tags["scale"], r.data.tags["protocol"]) == ("sweep", "paper")
               and r.data.tags["algorithm"] == "adamw" for r in runs)
    # the parameter count is a number; every param a value the trial used (none 'None')
    assert len({r.data.metrics["n_params"] for r in runs}) == 3
    assert all("None" not in r.data.params.values() for r in runs)
    assert not [k for r in runs for k in r.data.params if k.startswith("measure.finetune.")]
    # every size's flatness is also measured in the common grown shape (the largest here)
    assert all("flat/trace_fisher_grown" in r.data.metrics for r in runs)
    assert all(r.data.tags["sweep"] == "scaling" for r in runs)
    assert all(r.data.params["train.steps"] == "20" for r in runs)
    assert sorted(sweep.results()) == sorted((r.info.run_name, s) for r in runs for s in STEPS)
    # issue 42: each trial says where it is between its checkpoints (sweeps.progress_board)
    for r in runs:
        said = [line for line in sweep.lines if line.startswith(f"[{r.info.run_name}] trial ")]
        assert said and re.fullmatch(r"\[.+\] trial [123] of 3 started\n", said[0]), sweep.stdout
        assert any(" measuring step 10: " in line for line in said), said
    # runs and console lines say what the trial is: its model, then Ray's id
    assert all(r.info.run_name.startswith(r.data.tags["model"] + "_") for r in runs)
    client = MlflowClient(uri)
    for r in runs:  # the training curve, every log_every steps (set_args(TINY): 5)
        assert [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")] == [
            5, 10, 15, 20]
    for r in runs:  # the trial's curves and its measurements are artifacts of its run
        names = {a.path for a in client.list_artifacts(r.info.run_id)}
        assert {"curves.png", "metrics.jsonl", "trial_config.json"} <= names, names
        # each checkpoint's measurements in a folder named for them; no weights in MLflow
        assert "checkpoints" not in names
        assert [a.path for a in client.list_artifacts(r.info.run_id, "measurements")] == [
            f"measurements/step-{s}" for s in STEPS]
        # a standard error charted apart from its estimate; the tracker's own tag hidden
        assert "se/flat/trace_fisher" in r.data.metrics
        assert not [k for k in r.data.metrics if k.endswith("_se")]
        assert "mlflow.flatlm.outbox" in r.data.tags and "flatlm.outbox" not in r.data.tags
    out = sweep.stdout
    # the per-run table with its reference rows, the runs left out, the conclusion; the
    # correlations and the model-selection verdict only with --verbose (and in the report)
    for line in ("Per run, final checkpoint", "| random-init", "| lookup table ",
                 "| majority class ", "At matched loss", "Left out", "What this sweep shows"):
        assert line in out, (line, out[-3000:])
    assert "Correlations with downstream accuracy" not in out and "Model selection" not in out
    assert "\x1b" not in out[-2000:]  # no colour codes after the summary
    for chatter in ("Checkpoint successfully created", "Writing model shards"):  # quiet
        assert chatter not in out + sweep.stderr, chatter
    assert f"cd {tmp_path} && mlflow ui --backend-store-uri {uri}" in out
    # the address of the sweep's runs table in the model-training view, through its saved view
    eid = client.get_experiment_by_name("scaling").experiment_id
    assert (f"then open http://127.0.0.1:5000/#/experiments/{eid}/runs?"
            "workflowType=machine_learning&viewStateShareKey=flatlm") in out
    view = json.loads(client.get_experiment(eid).tags["mlflow.sharedViewState.flatlm"])
    # the view's rounded columns are the tags every trial's tracker set: each the latest value
    # of its exact metric to 4 significant digits
    rounded = [c[len("tags.`"):-1] for c in json.loads(view["state"])["selectedColumns"]
               if c.startswith("tags.")]
    columns = display_columns(("B",))  # TINY's measure.tasks
    assert rounded == list(columns.values())
    for r in runs:
        assert {"loss", "KL", "acc B", "Tr F"} <= set(r.data.tags)
        for key, name in columns.items():
            if key in r.data.metrics:
                assert float(r.data.tags[name]) == float(f"{r.data.metrics[key]:.4g}"), name
            else:  # not measured: no value shown
                assert name not in r.data.tags, name


@pytest.mark.parametrize(("args", "expected"), [
    pytest.param(["--set", "model=bert-3m"],
                 ["model 'bert-3m' is neither a preset nor a shape", "Presets: bert-2m"],
                 id="unknown-preset"),
    pytest.param(["--set", "model=d16-h1-l1-i64"],
                 ["--set model: this sweep (its search space) varies model", "drop the --set"],
                 id="swept-key"),
    pytest.param(["--set", "train.lrr=1"],
                 ["unknown config key 'train.lrr'", "TrainConfig has", " lr,"],
                 id="unknown-key"),
    pytest.param(["--gpus-per-trial", "1"],
                 ["each trial asks for 1.0 CPU and 1.0 GPU", "lower --cpus-per-trial / "
                  "--gpus-per-trial"],
                 id="no-node-has-a-gpu", marks=pytest.mark.slow),
])
def test_bad_configurations_fail_before_any_trial(tmp_path, ray_tmpdir, monkeypatch, args,
                                                 expected):
    argv = [*set_args(TINY), *args]
    if "--gpus-per-trial" in args:  # Ray's resources answer: its own process and Ray
        sweep = Sweep(argv, tmp_path, sweep_env(ray_tmpdir))
        rc = sweep.wait_then_clean(300, ray_tmpdir)
        err, results = sweep.stderr, sweep.results()
    else:
        done = scaling_here(monkeypatch, argv, tmp_path)
        rc, err = done.returncode, done.stderr
        results = results_of(done.stdout.splitlines())
    assert rc == 2, err[-4000:]
    assert err.startswith("error: ") or "\nerror: " in err, err
    for text in expected:
        assert text in err, err
    assert "Traceback" not in err
    assert not [p for p in tmp_path.glob("trials/*/*") if p.is_dir()]  # no trial directory
    assert not (tmp_path / "ray_results").exists()
    assert results == []
    if (tmp_path / "mlflow.db").exists():  # the store is reached; no experiment is left
        client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
        assert client.get_experiment_by_name("scaling") is None
