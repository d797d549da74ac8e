"""``sweeps/replicate.py`` through real Ray and MLflow, packed and not.

* ``--pack 2``: the steps experiment's two seeds (one shape) as one Ray trial, reported as one
  MLflow run per member, each with the same params and every metric but the timings equal
  (every step, bit for bit on the CPU) to the unpacked sweep's runs;
* ``--pack 1`` (the unpacked sweep, also the replicate sweep's own test): the experiment of a
  protocol as a sweep named replicate.<protocol>.<experiment>, the trial configs of
  ``flatlm replicate``, and the replication report read back from MLflow and logged to it.
"""

import math

import pytest

pytest.importorskip("ray")
pytest.importorskip("mlflow")

from tests.experiments.fastcfg import fast_set_flags  # noqa: E402
from tests.sweeps.sweeptools import REPO, Sweep, sweep_env  # noqa: E402

ARGS = ["--experiment", "steps", "--protocol", "paper", "--seeds", "2", *fast_set_flags()]


def _runs_by_seed(workdir):
    """seed -> (run name, params, {metric: [(step, value)]}) of the sweep's MLflow runs."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("replicate.paper.steps")
    out = {}
    for run in client.search_runs([exp.experiment_id]):
        # NaN (a standard error of one Hutchinson batch) as a word: NaN != NaN, yet both sweeps
        # logged the same NaN
        history = {key: sorted((m.step, "nan" if math.isnan(m.value) else m.value)
                               for m in client.get_metric_history(run.info.run_id, key))
                   for key in run.data.metrics if not key.startswith("time/")}
        out[run.data.params["train.seed"]] = (run.info.run_name, run.data.params, history,
                                              run.info.status)
    return out


def _assert_replicate_sweep(workdir):
    """The sweep ran ``flatlm replicate``'s trials of the steps experiment under the paper
    protocol (its model and label rule, each seed once) and logged the replication report."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("replicate.paper.steps")
                               .experiment_id])
    assert sorted(r.data.params["train.seed"] for r in runs) == ["0", "1"]
    assert {r.data.params["model"] for r in runs} == {"d64-h4-l2-i256"}
    assert {r.data.params["measure.label_rule"] for r in runs} == {"span"}
    md = (workdir / "report" / "replication" / "replication.md").read_text()
    assert "## Protocol `paper`" in md
    assert "after the loss converges, accuracy keeps rising" in md
    logged = client.get_experiment_by_name("replication")
    assert logged is not None and client.search_runs([logged.experiment_id])


@pytest.mark.slow
def test_a_packed_sweep_logs_one_run_per_member_equal_to_the_unpacked_sweep(tmp_path,
                                                                            ray_tmpdir):
    runs = {}
    for pack in ("2", "1"):
        workdir = tmp_path / f"pack{pack}"
        workdir.mkdir()
        sweep = Sweep([*ARGS, "--pack", pack], workdir, sweep_env(ray_tmpdir),
                      script=REPO / "sweeps" / "replicate.py")
        rc = sweep.wait_then_clean(500, ray_tmpdir)
        assert rc == 0, sweep.tail()
        runs[pack] = _runs_by_seed(workdir)
        if pack == "2":
            assert "pack2_" in sweep.stdout  # one Ray trial for both seeds
        else:
            _assert_replicate_sweep(workdir)
    packed, alone = runs["2"], runs["1"]
    assert sorted(packed) == sorted(alone) == ["0", "1"]
    for seed in ("0", "1"):
        name, params, history, status = packed[seed]
        assert name.startswith(f"seed{seed}_") and name.endswith(f"-{seed}"), name
        assert status == alone[seed][3] == "FINISHED"
        assert params == alone[seed][1]
        assert history == alone[seed][2] and "pretrain/kl" in history
        assert [s for s, _ in history["pretrain/kl"]] == [0, 3, 6]
