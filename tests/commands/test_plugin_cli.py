"""``flatlm trial --plugin MODULE``: the four toy assets (a source, an algorithm, a measurement and
an architecture, each a module that registers itself when imported) named on the command line,
and in ``FLATLM_PLUGINS``, run a trial of a fresh ``flatlm`` process, the toy measurement's own
setting given by ``--set measure.param_norm.p=1``; the same command without them is refused
before any work, naming the fix. ``flatlm replicate --plugin`` runs the toy experiment
(tests/assets/toy_experiment.py) as one of the paper's, read from the experiments registry."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS = ("tests.assets.toy_source", "tests.assets.toy_algorithm",
           "tests.assets.toy_measurement", "tests.assets.toy_architecture")
TOY_TRIAL = ["--source", "uniform:5,length=3", "--set", "model=toy-d16-l1",
             "--set", "train.algorithm=sign_sgd", "--set", "train.steps=4",
             "--set", "train.batch_size=8", "--set", "train.checkpoint_steps=[2,4]",
             "--set", "train.warmup_steps=0", "--set", "measure.what=loss,param_norm",
             "--set", "measure.n_eval=16", "--set", "measure.tasks=first", "--no-progress"]
# the L^p norm of each checkpoint's parameters, in a process that knows the toy architecture
NORMS = """import json, sys
import tests.assets.toy_architecture
from flatlm.models import load_checkpoint
out, p = sys.argv[1], float(sys.argv[2])
norms = {}
for step in (2, 4):
    model = load_checkpoint(f"{out}/checkpoints/step-{step}")[0]
    norms[step] = sum(float(w.detach().double().abs().pow(p).sum())
                      for w in model.parameters()) ** (1 / p)
print(json.dumps(norms))
"""


def checkpoint_norms(out: Path, p: float) -> dict[int, float]:
    """step -> the L^p norm of the parameters saved in ``out``'s checkpoints (steps 2 and 4)."""
    done = subprocess.run([sys.executable, "-c", NORMS, str(out), str(p)], capture_output=True,
                          text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    return {int(step): norm for step, norm in json.loads(done.stdout).items()}


def _flatlm(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "FLATLM_PLUGINS"}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO),
                                                          os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "flatlm", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**environ, **env})


def test_toy_plugins_run_a_trial_of_the_flatlm_command(tmp_path):
    # two named by the flag, two by the environment: both ways in one process
    flags = [a for p in PLUGINS[:2] for a in ("--plugin", p)]
    out = tmp_path / "t"
    done = _flatlm(["trial", "--out", str(out), *TOY_TRIAL, *flags,
                    "--set", "measure.param_norm.p=1"], tmp_path,
                   FLATLM_PLUGINS=",".join(PLUGINS[2:]))
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["train"]["algorithm"] == "sign_sgd" and config["model"] == "toy-d16-l1"
    assert config["measure"]["param_norm"] == {"p": 1.0}  # the plug-in's section, saved
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    norms = {row["step"]: row["toy/param_norm"] for row in rows if "toy/param_norm" in row}
    assert sorted(norms) == [2, 4]
    l1 = checkpoint_norms(out, 1)  # what it records is the L1 norm, not the default L2
    assert norms == pytest.approx(l1, rel=1e-9)
    assert all(n > 1.01 * l2 for n, l2 in zip(norms.values(), checkpoint_norms(out, 2).values(),
                                              strict=True))
    refused = _flatlm(["trial", "--out", str(tmp_path / "u"), *TOY_TRIAL, *flags,
                       "--set", "measure.param_norm.q=1"], tmp_path,
                      FLATLM_PLUGINS=",".join(PLUGINS[2:]))
    assert refused.returncode == 2  # before any work: no trial directory
    assert "unknown config key 'measure.param_norm.q': ParamNormConfig has p" in refused.stderr
    assert not (tmp_path / "u").exists()


def test_without_the_plugins_the_command_names_the_fix(tmp_path):
    done = _flatlm(["trial", "--out", str(tmp_path / "t"), *TOY_TRIAL], tmp_path)
    assert done.returncode == 2
    assert "source kind 'uniform' is unknown" in done.stderr
    assert "--plugin MODULE" in done.stderr
    missing = _flatlm(["trial", "--out", "t", "--plugin", "tests.assets.no_such_toy"], tmp_path)
    assert missing.returncode == 2
    assert "plug-in 'tests.assets.no_such_toy' (--plugin): cannot import" in missing.stderr


def test_replicate_runs_a_plugin_experiment_named_by_the_flag(tmp_path):
    """``flatlm replicate --experiment`` reads the experiments registry: the toy experiment of
    tests/assets/toy_experiment.py, named by ``--plugin``, runs like one of the paper's."""
    from tests.experiments.fastcfg import fast_set_flags

    out = tmp_path / "r"
    args = ["replicate", "--plugin", "tests.assets.toy_experiment", "--experiment", "lr_pair",
            "--scale", "tiny", "--protocol", "paper", "--seeds", "1", "--out", str(out),
            *fast_set_flags()]
    done = _flatlm(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = sorted((out / "paper" / "lr_pair").iterdir())
    lrs = sorted(json.loads((t / "config.json").read_text())["train"]["lr"] for t in trials)
    assert len(trials) == 2 and lrs[1] == 4 * lrs[0]  # half and twice the scale's rate
    assert all((t / "metrics.jsonl").exists() for t in trials)


def test_an_unknown_experiment_lists_the_registered_ones(tmp_path):
    args = ["replicate", "--experiment", "lr_pair", "--out", str(tmp_path / "r"), "--dry-run"]
    without = _flatlm(args, tmp_path)
    assert without.returncode == 2 and not (tmp_path / "r").exists()
    assert ("--experiment 'lr_pair': use one of the registered experiments, steps, sizes, "
            "algorithms, sgd, selection, search (add one with "
            "flatlm.experiments.paper.register_experiment in a plug-in module: --plugin MODULE)"
            ) in " ".join(without.stderr.split())
    named = _flatlm([*args, "--plugin", "tests.assets.toy_experiment"], tmp_path)
    assert named.returncode == 0, named.stderr[-2000:]
    assert "lr_pair: 2 trials" in named.stdout  # the sweep scale: one seed, two rates
    typo = _flatlm(["replicate", "--experiment", "lr_piar", "--dry-run", "--out", "r",
                    "--plugin", "tests.assets.toy_experiment"], tmp_path)
    assert typo.returncode == 2
    assert "use one of the registered experiments, steps, sizes, algorithms, sgd, selection, " \
           "search, lr_pair (add one with" in " ".join(typo.stderr.split())


@pytest.mark.parametrize("how", ["flag", "variable", "sweep script"])
def test_a_plugin_that_raises_is_one_line_at_each_entry_point(how, tmp_path, monkeypatch,
                                                               capsys):
    """Issue 52, item 4: ``flatlm config --plugin X``, ``FLATLM_PLUGINS=X flatlm ...`` and
    ``python sweeps/scaling.py --plugin X`` ended in the plug-in's traceback."""
    from flatlm.cli import main
    from flatlm.core import registry

    (tmp_path / "raising_plugin_mod.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_LOADED", [])
    monkeypatch.delenv("FLATLM_PLUGINS", raising=False)
    if how == "flag":
        code, named = main(["config", "--plugin", "raising_plugin_mod"]), "--plugin"
    elif how == "variable":
        monkeypatch.setenv("FLATLM_PLUGINS", "raising_plugin_mod")
        code, named = main(["config"]), "FLATLM_PLUGINS"
    else:
        from sweeps import scaling
        from sweeps.cli import main as sweep_main

        monkeypatch.setattr(sys, "argv", ["sweeps/scaling.py", "--plugin", "raising_plugin_mod"])
        code, named = sweep_main(scaling.build, scaling.__doc__), "--plugin"
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"plug-in 'raising_plugin_mod' ({named}): importing it raised RuntimeError: boom" in err
