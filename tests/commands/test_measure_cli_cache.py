"""`flatlm measure`: the evaluation data and reference rows kept in the run's eval_cache (or
--cache DIR, or none), so the next checkpoint of the run reads them back."""

import json

import pytest

from flatlm.cli import main
from flatlm.models import build_model, parse_model, save_checkpoint
from flatlm.sources import load

ARGS = ["--what", "probe,lookup", "--n-eval", "8", "--n-downstream", "40", "--json",
        "--set", "measure.probe.epochs=2", "--set", "measure.probe.seeds=2"]


@pytest.fixture
def run_dir(tmp_path):
    src = load("dyck:4")
    cfg = parse_model("d16-h2-l1-i32")
    for step, seed in ((1, 0), (2, 1)):
        model = build_model(cfg, src.V, src.max_length, seed=seed)
        save_checkpoint(model, tmp_path / "run" / "checkpoints" / f"step-{step}",
                        source_spec=src.spec, model_cfg=cfg)
    return tmp_path / "run"


def _measure(path, *extra, capsys):
    assert main(["measure", str(path), *ARGS, *extra]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_checkpoints_of_a_run_share_its_eval_cache(run_dir, capsys):
    first = _measure(run_dir / "checkpoints" / "step-1", capsys=capsys)
    cache = run_dir / "eval_cache"
    assert len(list(cache.glob("eval-*.pt"))) == 1
    assert len(list(cache.glob("reference-*.json"))) == 2
    second = _measure(run_dir / "checkpoints" / "step-2", capsys=capsys)
    for key in ("random_init/g_star/acc_mean", "lookup/g_star/acc_mean",
                "probe_ridge/g_star/acc_mean", "random_init_ridge/g_star/acc_mean"):
        assert second[key] == first[key], key
    assert second["time/random_init_s"] < first["time/random_init_s"]


def test_cache_can_be_elsewhere_or_off(run_dir, tmp_path, capsys):
    _measure(run_dir / "checkpoints" / "step-1", "--cache", str(tmp_path / "c"), capsys=capsys)
    assert len(list((tmp_path / "c").glob("reference-*.json"))) == 2
    _measure(run_dir / "checkpoints" / "step-1", "--cache", "none", "--no-progress",
             capsys=capsys)
    assert not (run_dir / "eval_cache").exists()
