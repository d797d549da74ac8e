"""``flatlm data make`` and ``flatlm data entropy``, in process and through the console script."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flatlm.cli import main
from flatlm.corpus import CorpusConfig, load_corpus, make_corpus
from flatlm.sources import load

TINY_HMM = "hmm:seed=0,states=8,vocab=12,blocks=2,length=6"
TINY_PCFG = json.dumps({"kind": "pcfg", "seed": 1,
                        "random": {"vocab": 10, "depth": 2, "nonterminals_per_level": 3}})
FLATLM = Path(sys.executable).with_name("flatlm")  # the installed console script


def test_entropy_json_agrees_with_the_source(capsys):
    assert main(["data", "entropy", TINY_HMM, "--n", "300", "--seed", "2", "--json",
                 "--device", "cpu", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    mean, se = load(TINY_HMM).entropy(300, seed=2)
    assert out["entropy"] == pytest.approx(mean, rel=1e-12)
    assert out["entropy_se"] == pytest.approx(se, rel=1e-9)
    assert (out["n_sentences"], out["n_tokens"]) == (300, 1800)
    assert out["source"]["kind"] == "hmm" and out["unit"] == "nats/token"


def test_entropy_human_line(capsys):
    assert main(["data", "entropy", TINY_PCFG, "--n", "50", "--device", "cpu",
                 "--no-progress"]) == 0
    line = capsys.readouterr().out.strip()
    assert re.fullmatch(r"entropy \d+\.\d{4} ± \d+\.\d{4} nats/token \(n_sentences=50, "
                        r"n_tokens=\d+, source=.*\)", line), line


def test_make_writes_a_corpus(tmp_path, capsys):
    out = tmp_path / "corpus"
    assert main(["data", "make", "dyck:6", "--n", "40", "--seed", "7", "--out", str(out),
                 "--n-downstream", "12", "--no-progress", "--device", "cpu"]) == 0
    assert "wrote" in capsys.readouterr().out
    splits, meta = load_corpus(out)
    assert {s: len(d) for s, d in splits.items()} == {"train": 40, "validation": 4,
                                                      "downstream": 12}
    assert meta["seed"] == 7 and meta["label_rule"] == "count"


@pytest.mark.parametrize("argv, message", [
    (["data", "entropy", "nosuch:1", "--n", "5"], "source kind 'nosuch' is unknown"),
    (["data", "entropy", "pcfg:no/such/rules.txt", "--n", "5"], "no/such/rules.txt"),
    (["data", "entropy", '{"kind": "hmm", ', "--n", "5"], "not valid JSON"),
    (["data", "entropy", "hmm:seed=0,colours=3", "--n", "5"], "unknown key 'colours'"),
    (["data", "make", TINY_HMM, "--n", "5", "--out", "{tmp}/x", "--label-rule", "viterbi"],
     "label rule 'viterbi'"),
])
def test_bad_input_exits_2_with_a_message(argv, message, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("flatlm data: error:"), err


def test_a_count_below_one_is_refused_naming_the_flag(capsys):
    """argparse's error, from the one parser of numeric flags (``flatlm.core.flags``)."""
    with pytest.raises(SystemExit) as e:
        main(["data", "entropy", "dyck:6", "--n", "0", "--no-progress"])
    assert e.value.code == 2
    assert "argument --n: 0 is out of range: give a whole number >= 1" in capsys.readouterr().err


def test_make_refuses_a_full_directory(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["data", "make", "dyck:6", "--n", "5", "--out", str(tmp_path),
                 "--no-progress"]) == 2
    assert "not empty" in capsys.readouterr().err


def test_console_script_makes_the_same_bytes_as_the_library(tmp_path):
    """Another process, the same seed: byte-identical files (nothing depends on the process)."""
    cmd = [str(FLATLM), "data", "make", TINY_HMM, "--n", "30", "--seed", "5", "--out",
           str(tmp_path / "cli"), "--no-progress", "--device", "cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    make_corpus(load(TINY_HMM), CorpusConfig(n_train=30, seed=5), tmp_path / "lib",
                progress=False)
    for path in sorted((tmp_path / "lib").rglob("*")):
        if path.is_file():
            twin = tmp_path / "cli" / path.relative_to(tmp_path / "lib")
            assert twin.read_bytes() == path.read_bytes(), path.name
