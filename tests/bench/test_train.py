"""bench/train.py as bench/gpu_check.sh calls it: the smoke part's command (read from the
script, so that the two cannot drift) runs in-process on the CPU and writes a row per variant
and baseline; the GPU part's command parses (a session lent a GPU spends no minutes on a typo)."""

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).parents[2] / "bench"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_train", BENCH / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train_command(part: str, out: Path, device: str) -> list[str]:
    """The flags of the ``bench/train.py`` line in ``part`` of gpu_check.sh."""
    script = (BENCH / "gpu_check.sh").read_text().replace("\\\n", " ")
    body = re.search(rf"^{part}\)(.*?)^\s*;;", script, re.S | re.M).group(1)
    (line,) = [ln for ln in body.splitlines() if "bench/train.py" in ln]
    words = shlex.split(line.split("bench/train.py", 1)[1])
    words = [w.replace("$device", device) for w in words]
    return [str(out / Path(w).name) if w.startswith("$out/") else w for w in words]


def test_the_smoke_part_writes_a_row_per_variant_and_baseline(bench, tmp_path):
    argv = _train_command("smoke", tmp_path, "cpu")
    threads = torch.get_num_threads()
    try:
        bench.main(argv)  # sets torch's threads (--threads 1)
    finally:
        torch.set_num_threads(threads)
    rows = json.loads((tmp_path / "train_gpu_check_smoke.json").read_text())
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


def test_the_gpu_part_s_command_parses(bench, tmp_path):
    args = bench.parse_args(_train_command("train", tmp_path, "cuda"))
    assert args.variants == ["padded", "unpadded", "rows"]
    assert args.presets == "bert-12.8m,bert-41m,bert-110m" and args.batch_size == 4096
    assert args.flatlm_micro["rows"] == 4096  # one pass a step unless memory says otherwise
