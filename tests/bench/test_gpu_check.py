"""``bench/gpu_check.sh``, the one GPU check: its smoke run (``smoke cpu``) runs every part's
commands at toy sizes through the same budgets, once for the module, and each part's JSON is
checked here for its keys and sane values, so that a session lent a GPU spends no minutes on a
broken command; the GPU run's own commands (printed with ``PYTHON=echo``) parse and fit the
8-minute call."""

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "bench"
SCRIPT = BENCH / "gpu_check.sh"


def _run(tmp: Path, *args: str, python: str = sys.executable, timeout: int = 900):
    env = {**os.environ, "OUT": str(tmp), "PYTHON": python, "WHEELS": str(tmp / "no-wheels")}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The folder the smoke run wrote to."""
    out = tmp_path_factory.mktemp("gpu_check_smoke")
    done = _run(out, "smoke", "cpu")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return out


def _read(folder: Path, name: str):
    return json.loads((folder / name).read_text())


@pytest.mark.slow
def test_the_smoke_run_records_every_part_within_its_budget(smoke):
    record = _read(smoke, "gpu_check_smoke.json")
    assert [r["part"] for r in record] == ["train", "measure", "packs", "large"]
    assert all(r["rc"] == 0 and 0 <= r["seconds"] <= r["budget_s"] for r in record), record


@pytest.mark.slow
def test_train_rows_per_variant_and_per_prefetch_setting(smoke):
    rows = _read(smoke, "train_gpu_check_smoke.json")
    tokens = [r for r in rows if r["metric"] == "train_tokens_per_s"]
    assert [(r["variant"], r["baseline_name"].split(":")[0]) for r in tokens] == [
        ("padded", "hf-bf16"), ("unpadded", "hf-bf16"), ("rows", "hf-bf16")]
    first = tokens[0]["first_step_s"]
    assert set(first) == {"flatlm-padded", "flatlm-unpadded", "flatlm-rows", "hf-bf16"}
    assert all(s > 0 for s in first.values())
    computed = {r["variant"]: r["flatlm_positions_per_batch"] for r in tokens}
    assert computed["padded"] == 32 * 18  # every sentence at the source's 18 positions
    assert computed["unpadded"] < computed["padded"]
    for r in tokens:
        assert r["ratio"] == pytest.approx(r["flatlm"] / r["baseline"])
    ahead = [r for r in rows if r["metric"] == "train_tokens_per_s_prefetch"]
    assert [(r["prefetch"], r["prefetch_depth"], r["prefetch_workers"]) for r in ahead] == [
        ("0", 0, "threads"), ("1", 1, "threads"), ("1:processes", 1, "processes")]
    assert ahead[0]["ratio"] == 1.0
    assert all(r["variant"] == "padded" for r in ahead)  # what training runs on the CPU
    assert all(r["flatlm"] > 0 and r["host_batch_s"] > 0 for r in ahead)


@pytest.mark.slow
def test_measure_times_each_measurement_and_checks_each_setting(smoke):
    report = _read(smoke, "measure_cpu.json")
    first, second = report["checkpoint"][1:]
    for key in ("time/loss_s", "time/flatness_s", "time/probe_s", "time/lookup_s"):
        assert first["times"][key] > 0, key
    assert "time/lookup_s" not in second["times"]  # once per trial
    assert second["metrics"] == first["metrics"]  # the same model, the cached truth
    settings = {row["setting"]: row for row in report["settings"]}
    assert set(settings) == {  # bench/gpu_measure.py's TOLERANCE
        "fisher_bf16", "fisher_tf32", "hessian_tf32", "hessian_stack", "loss_tf32"}
    assert all(row["within"] for row in settings.values()), settings
    assert settings["fisher_bf16"]["relative_difference"] > 0  # bf16 ran
    assert [row["fused"] for row in report["truth"]] == [True, False]
    assert all(row["rule_evaluations_per_s"] > row["sentences_per_s"] > 0
               for row in report["truth"])


@pytest.mark.slow
def test_packs_compare_against_separate_processes_and_train_the_sizes(smoke):
    report = _read(smoke, "packs_smoke.json")
    assert report["baseline"].startswith("K separate trial processes")
    (row,) = report["rows"]
    assert row["ratio_packed_over_separate"] == pytest.approx(
        row["packed_model_steps_per_s"] / row["separate_model_steps_per_s"], rel=1e-2)
    sizes = report["sizes_packed"]
    assert [r["model"] for r in sizes] == ["d64-h4-l2-i256", "d64-h4-l3-i256", "d64-h4-l4-i256"]
    for r in sizes:  # two members, each a finite loss (no Diverged in their place)
        assert len(r["last_loss"]) == 2 and all(isinstance(x, float) for x in r["last_loss"])


@pytest.mark.slow
def test_large_times_the_truth_and_the_evaluation_data(smoke):
    truth = _read(smoke, "truth_smoke.json")
    metrics = {r["metric"] for r in truth}
    assert {"pcfg_paper_conditionals", "hmm_default_conditionals"} <= metrics
    assert any(r.get("fused") is not None or "fused" in r["baseline_name"] for r in truth)
    assert all(r["flatlm"] > 0 for r in truth)
    assert all(r["rule_evaluations_per_s"] > r["flatlm"] for r in truth
               if r["metric"].startswith("pcfg"))
    data = {r["metric"]: r for r in _read(smoke, "eval_data_smoke.json")}
    assert set(data) == {"labels_abc_s", "validation_truth_s"}
    assert all(r["flatlm"] > 0 and r["ratio"] == pytest.approx(r["baseline"] / r["flatlm"])
               for r in data.values())


def test_the_gpu_run_s_commands_parse(tmp_path):
    """``PYTHON=echo``: the default run's commands, printed; bench/train.py's flags parse."""
    done = _run(tmp_path, "all", "cuda", python="echo", timeout=60)
    assert done.returncode == 0, done.stderr
    budgets = {r["part"]: r["budget_s"] for r in _read(tmp_path, "gpu_check.json")}
    assert list(budgets) == ["train", "measure", "packs", "large"]
    assert sum(budgets.values()) <= 8 * 60 - 40  # one 8-minute call, the kill grace included
    lines = [shlex.split(ln) for ln in done.stdout.splitlines() if ln.startswith("bench/")]
    scripts = [words[0] for words in lines]
    assert sorted(set(scripts)) == ["bench/eval_data.py", "bench/gpu_measure.py",
                                    "bench/packs.py", "bench/train.py", "bench/truth.py"]
    spec = importlib.util.spec_from_file_location("bench_train", BENCH / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    parsed = [train.parse_args(words[1:]) for words in lines if words[0] == "bench/train.py"]
    assert [a.presets for a in parsed] == ["bert-12.8m", "bert-41m", "bert-110m", "bert-950m"]
    assert all(a.batch_size == 4096 for a in parsed)
    assert parsed[0].variants == ["padded", "unpadded", "rows"]
    assert parsed[0].flatlm_micro["rows"] == 4096  # one pass a step unless memory says otherwise
    assert parsed[0].prefetch == ["0", "auto", "4:processes"] and not parsed[1].prefetch


def test_an_unknown_part_is_refused_with_the_parts_named(tmp_path):
    done = _run(tmp_path, "everything", timeout=60)
    assert done.returncode == 2 and "use all, train, measure, packs, large or" in done.stderr
