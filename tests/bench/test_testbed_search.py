"""bench/testbed_search.py, the command line: --check finds the committed table (before its
hand-run sections) regenerated from the committed JSON, and a table that differs; --table writes
it."""

import json
import shutil
from pathlib import Path

import pytest

from tests.bench.conftest import BENCH, bench_script

RESULTS = BENCH / "results"


@pytest.fixture(scope="module")
def search():
    return bench_script("testbed_search")


@pytest.fixture
def copied(tmp_path) -> Path:
    for name in ("testbed_search.json", "testbed_search.md"):
        shutil.copy(RESULTS / name, tmp_path / name)
    return tmp_path / "testbed_search.json"


def test_check_finds_the_committed_table_regenerated(search, copied, capsys):
    assert search.main(["--check", "--out", str(copied)]) == 0
    assert "regenerates" in capsys.readouterr().out


def test_check_finds_a_table_that_differs(search, copied):
    results = json.loads(copied.read_text())
    results["stage3"]["adamw_kl"] += 0.001
    copied.write_text(json.dumps(results))
    assert search.main(["--check", "--out", str(copied)]) == 1


def test_table_writes_the_scripts_part_of_the_committed_table(search, copied):
    assert search.main(["--table", "--out", str(copied)]) == 0
    written = copied.with_suffix(".md").read_text()
    assert written.startswith("# Testbed search (issue 23, item 3)")
    assert (RESULTS / "testbed_search.md").read_text().startswith(written)
    assert json.loads(copied.read_text()) == json.loads((RESULTS / "testbed_search.json")
                                                        .read_text())  # --table keeps the JSON
