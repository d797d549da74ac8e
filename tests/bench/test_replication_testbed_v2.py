"""bench/replication_testbed_v2.py refuses to read its trials from where it writes their records:
copying them there would first empty the directory it reads (it once deleted the committed
records that way)."""

import shutil

from tests.bench.conftest import bench_script

V2 = "replication_testbed_v2"


def test_the_records_directory_is_refused_as_its_own_source(tmp_path, capsys):
    mod = bench_script(V2)
    trial = tmp_path / "out" / "trials" / "paper" / "sizes" / "t_seed0"
    trial.mkdir(parents=True)
    (trial / "config.json").write_text("{}")
    for trials in (tmp_path / "out" / "trials", tmp_path / "out" / "trials" / "paper"):
        assert mod.main(["--trials", str(trials), "--out", str(tmp_path / "out")]) == 2
        assert "that is where the records are written" in capsys.readouterr().err
    assert (trial / "config.json").read_text() == "{}"  # nothing deleted
    shutil.rmtree(tmp_path / "out")
