"""What a sweep derives from its base config (task, shown metrics, objectives), and the per-trial
figure drawn without ``analysis/`` (Ray workers must not import it). No Ray started here."""

import json
import os
import subprocess
import sys
from argparse import Namespace
from dataclasses import replace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

from flatlm.core.config import apply_overrides  # noqa: E402
from flatlm.experiments.paper import base_of  # noqa: E402
from sweeps import (  # noqa: E402
    algorithms,  # noqa: E402
    scaling,  # noqa: E402
    search,  # noqa: E402
    selection,  # noqa: E402
    steps,  # noqa: E402
)
from sweeps.spec import Sweep, check_sweep, objectives, shown_metrics, sweep_task  # noqa: E402


def tiny_sweep(**overrides) -> Sweep:
    """The tiny preset's sweep; a ``source`` comes with its kind's settings, as the command
    line's ``--source`` / ``--set source=`` bring them (the paper's PCFG labels dropped)."""
    base = base_of("sweep", source=overrides.pop("source", None))
    return Sweep(name="t", base=apply_overrides(base, overrides))


@pytest.mark.parametrize(("overrides", "task"), [
    pytest.param({}, "A", id="pcfg-measuring-A-B"),
    pytest.param({"source": "dyck:6", "measure.tasks": []}, "g_star", id="dyck-all-tasks"),
    pytest.param({"source": "hmm:seed=0,vocab=20,states=6,length=6,blocks=2",
                  "measure.tasks": []}, "task-1", id="hmm-all-tasks"),
    pytest.param({"source": "hmm:seed=0,vocab=20,states=6,length=6,blocks=2",
                  "measure.tasks": ["task-3", "task-2"]}, "task-3", id="hmm-first-measured"),
])
def test_the_sweep_task_is_the_first_task_measured(overrides, task):
    sweep = tiny_sweep(**overrides)
    assert sweep_task(sweep) == task
    assert shown_metrics(sweep) == ("pretrain/loss", "pretrain/kl", "flat/trace_fisher",
                                    f"probe/{task}/acc_mean")
    assert objectives(sweep) == ((f"probe/{task}/acc_mean", "max"),)
    own = (("flat/trace_fisher", "min"),)
    assert objectives(replace(sweep, objectives=own)) == own


def test_the_search_scripts_default_objective_follows_the_source():
    args = Namespace(objective=[], samples=None)
    sweep = search.build(args)
    sweep = replace(sweep, base=apply_overrides(sweep.base, {  # as --source dyck:6 sets it
        "source": "dyck:6", "measure.tasks": [], "measure.label_rule": None,
        "measure.spans": None}))
    assert objectives(sweep) == (("probe/g_star/acc_mean", "max"),)
    args.objective = ["flat/trace_fisher:min"]
    assert objectives(search.build(args)) == (("flat/trace_fisher", "min"),)


def test_an_analysis_task_the_sweep_does_not_measure_fails_naming_the_fix():
    sweep = replace(tiny_sweep(**{"measure.tasks": ["A", "B"]}), analysis_task="C")
    with pytest.raises(ValueError, match=r"analysis_task 'C' is not measured .* measures A, B"):
        check_sweep(sweep)
    assert sweep_task(replace(tiny_sweep(**{"measure.tasks": []}), analysis_task="C")) == "C"


def test_curves_are_drawn_without_analysis(tmp_path):
    """A trial's curves.png from its metrics.jsonl, in a process where ``analysis`` and Ray
    cannot be imported (what a Ray worker may rely on)."""
    rows = [{"step": s, "pretrain/loss": 2.0 / s, "pretrain/kl": 0.1 / s,
             "probe/task-1/acc_mean": 0.5 + s / 100, "flat/trace_fisher": float("nan")}
            for s in (10, 20)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = (
        "import sys; sys.modules['analysis'] = None; sys.modules['ray'] = None\n"
        "from pathlib import Path\nfrom sweeps.curves import plot_curves\n"
        "from flatlm.storage.metrics_log import read_metrics\n"
        f"d = Path({str(tmp_path)!r})\n"
        "keys = ['pretrain/loss', 'pretrain/kl', 'flat/trace_fisher', 'probe/task-1/acc_mean']\n"
        "print(plot_curves(read_metrics(d), keys, d / 'curves.png', 't'))\n"
        "print(plot_curves(read_metrics(d), ['flat/trace_fisher'], d / 'none.png', 't'))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout.split()
    assert out == [str(tmp_path / "curves.png"), "None"]  # NaN-only keys draw nothing
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "none.png").exists()


def test_the_trainable_module_does_not_import_analysis():
    code = ("import sys\n"
                "import sweeps.trainable, sweeps.driver\n"
            "assert not [m for m in sys.modules if m.split('.')[0] == 'analysis'], 'analysis'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_trial_names_say_what_the_trial_varies_then_rays_id():
    from types import SimpleNamespace

    from sweeps.console import trial_label

    trial = SimpleNamespace(trial_id="1a0e7_00003", config={"overrides": {
        "model": "d32-h2-l1-i128", "train.seed": 2, "train.lr": 0.000316227,
        "source": '{"kind": "dyck"}'}})
    assert trial_label(trial) == "d32-h2-l1-i128_seed2_lr0.000316_-kind-dyck-_1a0e7_00003"
    assert trial_label(SimpleNamespace(trial_id="x_1", config={})) == "x_1"


@pytest.mark.parametrize("script", ["scaling", "steps", "algorithms", "search"])
def test_help_imports_neither_ray_nor_torch(script):
    code = ("import runpy, sys\n"
            f"sys.argv = ['{script}.py', '--help']\n"
                f"try:\n    runpy.run_path({str(REPO / 'sweeps' / (script + '.py'))!r}, "
            "run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('heavy:', sorted(m for m in ('ray', 'torch', 'transformers') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "--set KEY=VALUE" in out and out.strip().endswith("heavy: []"), out


def test_resume_with_changed_settings_is_refused_naming_them(tmp_path):
    from dataclasses import replace as dc_replace

    from sweeps.rayenv import tune
    from sweeps.resume import check_resume_settings, record_settings

    sweep = Sweep(name="s", base=base_of("sweep"),
                  space={"model": tune.grid_search(["d16-h1-l1-i64"]),
                         "train.lr": tune.loguniform(1e-4, 1e-2)})
    record_settings(sweep, tmp_path)
    check_resume_settings(sweep, tmp_path, resume=True)  # the same settings: fine
    changed = dc_replace(sweep, base=apply_overrides(sweep.base, {"train.steps": 9999}))
    with pytest.raises(ValueError, match=r"base\.train\.steps: 2000 -> 9999"):
        check_resume_settings(changed, tmp_path, resume=True)
    wider = dc_replace(sweep, space={**sweep.space, "train.lr": tune.loguniform(1e-5, 1e-2)})
    with pytest.raises(ValueError, match=r"space\.train\.lr"):
        check_resume_settings(wider, tmp_path, resume=True)


def test_a_sweep_started_before_a_field_was_added_resumes(tmp_path):
    """A record without a field flatlm added since (here train.world_size) reads as its default;
    a non-default value of it is still a change."""
    import json
    from dataclasses import replace as dc_replace

    from sweeps.resume import SETTINGS_FILE, check_resume_settings, record_settings

    sweep = Sweep(name="s", base=base_of("sweep"))
    record_settings(sweep, tmp_path)
    file = tmp_path / SETTINGS_FILE
    old = json.loads(file.read_text())
    del old["base.train.world_size"]
    file.write_text(json.dumps(old))
    check_resume_settings(sweep, tmp_path, resume=True)
    two = dc_replace(sweep, base=apply_overrides(sweep.base, {"train.world_size": 2}))
    with pytest.raises(ValueError, match=r"base\.train\.world_size: 1 -> 2"):
        check_resume_settings(two, tmp_path, resume=True)


def test_an_unreachable_tracking_store_is_an_error_before_ray_starts(tmp_path):
    import socket

    from sweeps.driver import run_sweep

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sweep = Sweep(name="s", base=base_of("sweep"))
    with pytest.raises(ValueError, match=f"127.0.0.1:{port} is unreachable"):
        run_sweep(sweep, workdir=tmp_path, tracking_uri=f"http://127.0.0.1:{port}",
                  address=None, resume=False, show=())
    assert not (tmp_path / "ray_results").exists()


def test_resume_refuses_a_tuner_pickle_others_could_have_written(tmp_path):
    from sweeps.trust import check_trusted

    (tmp_path / "tuner.pkl").write_bytes(b"not really a pickle")
    tmp_path.chmod(0o755)
    (tmp_path / "tuner.pkl").chmod(0o644)
    check_trusted(tmp_path)  # yours alone: fine
    (tmp_path / "tuner.pkl").chmod(0o666)
    with pytest.raises(ValueError, match="not yours alone"):
        check_trusted(tmp_path)
    (tmp_path / "tuner.pkl").unlink()
    (tmp_path / "tuner.pkl").symlink_to(tmp_path / "elsewhere.pkl")
    with pytest.raises(ValueError, match="symbolic link"):
        check_trusted(tmp_path)
    (tmp_path / "tuner.pkl").unlink()
    # the search algorithm's state, which Ray also unpickles (tests/sweeps/test_resume_trust.py
    # plants one the user wrote; this one anybody could have)
    planted = tmp_path / "basic-variant-state-9999-99-99_99-99-99.json"
    planted.write_bytes(b"a pickle")
    planted.chmod(0o600)
    check_trusted(tmp_path)
    planted.chmod(0o666)
    with pytest.raises(ValueError, match=f"{planted.name}: it is not yours alone"):
        check_trusted(tmp_path)


def test_resume_refuses_a_tuner_pickle_flatlm_did_not_write(tmp_path, monkeypatch, capsys):
    """The digest is kept in the user's own cache, outside the sweep's (shared) storage."""
    from sweeps.trust import check_digest, digest_file, record_digest

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME")  # the suite sets one (tests/conftest.py)
    sweep = tmp_path / "ray_results" / "scaling"
    sweep.mkdir(parents=True)
    (sweep / "tuner.pkl").write_bytes(b"what Tune wrote")
    check_digest(sweep)  # never recorded here: a warning, not a refusal
    assert "no digest" in capsys.readouterr().err
    record_digest(sweep)
    assert digest_file(sweep).is_relative_to(tmp_path / "home" / ".cache" / "flatlm")
    assert digest_file(sweep).stat().st_mode & 0o777 == 0o600
    check_digest(sweep)  # the same file: fine
    (sweep / "tuner.pkl").write_bytes(b"import os; os.system('...')")  # replaced by another
    with pytest.raises(ValueError, match=r"tuner.pkl is not the file flatlm wrote"):
        check_digest(sweep)


@pytest.mark.parametrize("changes, needle", [
    ({"name": "../../escaped"}, "--name '../../escaped'"),
    ({"name": "a/b"}, "no '/'"),
    ({"max_failures": -5}, "--max-failures -5"),
])
def test_names_that_escape_the_workdir_and_negative_retries_are_refused(changes, needle):
    with pytest.raises(ValueError, match=needle):
        check_sweep(replace(Sweep(name="ok", base=base_of("sweep")), **changes))


def test_a_password_in_the_tracking_uri_is_refused():
    from sweeps.spec import check_tracking_uri

    with pytest.raises(ValueError, match="MLFLOW_TRACKING_PASSWORD"):
        check_tracking_uri("https://me:s3cret@mlflow.example.org")
    check_tracking_uri("http://127.0.0.1:5000")
    check_tracking_uri("sqlite:////tmp/x/mlflow.db")


def test_the_default_sweeps_aim_at_the_regime_they_are_about():
    """The no-argument sweeps run on the testbed's grammar and models (issue 23: the earlier
    sweep grammar's tasks were nearly free), one seed, at a budget near saturation: the
    testbed's runs at step 2000 were at KL 0.036-0.045 (flatlm.experiments.scales.SWEEP), so the
    rule says 0.05, not a looser one."""
    from flatlm.experiments.scales import TESTBED, TESTBED_MODELS, TESTBED_SOURCE

    tiny = Namespace()
    sizes = scaling.build(tiny)
    assert sizes.kl_threshold == 0.05
    assert sizes.base.source == apply_overrides(sizes.base, {"source": TESTBED_SOURCE}).source
    assert sizes.space["model"]["grid_search"] == list(TESTBED_MODELS)
    # the testbed's batch and the paper's constant rate (A.5), a fifth of its steps
    testbed = TESTBED.base().train
    assert (sizes.base.train.batch_size, sizes.base.train.lr) == (testbed.batch_size, testbed.lr)
    assert sizes.base.train.steps == 2000 and sizes.base.train.schedule == "constant"
    # every curve starts at the initial model
    assert sizes.base.train.checkpoint_steps == (0, 1000, 2000)
    assert tuple(sizes.base.measure.tasks) == ()  # every task of the grammar: A, B and C
    one_seed = [steps.build(tiny), algorithms.build(Namespace(algorithms="adamw"))]
    assert all(s.space["train.seed"]["grid_search"] == [0] for s in [sizes, *one_seed])
    assert scaling.build(Namespace(scale="gpu")).kl_threshold == 0.1  # the paper's scale
    algs = algorithms.build(Namespace(algorithms="adamw,sam,noreg,adversarial"))
    assert algs.space["train.algorithm"]["grid_search"] == ["adamw", "sam", "noreg",
                                                            "adversarial"]
    assert algs.base.train.dropout is None  # each algorithm's own regularisation
    with pytest.raises(ValueError, match="--algorithms 'adamw,adamx'"):
        algorithms.build(Namespace(algorithms="adamw,adamx"))


def _drawn(space: dict, setting: str, **config):
    """The value a ``tune.sample_from`` entry of ``space`` draws for a point ``config``."""
    return space[setting].func(Namespace(config=config))


def test_sgd_in_a_sweep_trains_at_its_rate_and_a_set_rate_or_a_varied_one_wins():
    sgd_lr = base_of("sweep").train.lr, 0.3  # AdamW's rate, the sweep scale's SGD rate
    space = algorithms.build(Namespace(algorithms="adamw,sgd", overrides=[])).space
    assert [_drawn(space, "train.lr", **{"train.algorithm": a}) for a in ("adamw", "sgd")] \
        == list(sgd_lr)
    only_adamw = algorithms.build(Namespace(algorithms="adamw,noreg", overrides=[])).space
    assert "train.lr" not in only_adamw  # no stray key: --set train.lr stays allowed
    pinned = algorithms.build(Namespace(algorithms="sgd", overrides=["train.lr=0.05"])).space
    assert "train.lr" not in pinned  # --set wins over the linked rate, as in flatlm replicate
    varied = selection.build(Namespace(algorithms="adamw,sgd", seeds=1, lrs="0.1,0.2")).space
    assert varied["train.lr"] == {"grid_search": [0.1, 0.2]}  # --lrs wins too


def test_the_selection_sweep_varies_algorithms_seeds_and_rates():
    args = Namespace(algorithms="adamw,sam", seeds=3, lrs="5e-3,1e-3")
    sweep = selection.build(args)
    assert sweep.name == "selection" and sweep.selection and sweep.kl_threshold == 0.05
    grids = {k: v["grid_search"] for k, v in sweep.space.items()}
    assert grids == {"train.algorithm": ["adamw", "sam"], "train.seed": [0, 1, 2],
                     "train.lr": [5e-3, 1e-3]}
    assert {"fisher", "hessian", "eigen", "sharpness"} <= set(sweep.base.measure.what)
    for bad, match in ((dict(algorithms="adam"), "--algorithms 'adam'"),
                       (dict(lrs="fast"), "--lrs 'fast'")):
        with pytest.raises(ValueError, match=match):
            selection.build(Namespace(**{**vars(args), **bad}))
    from sweeps.cli import parser

    p = parser(selection.__doc__)
    selection.add_arguments(p)
    with pytest.raises(SystemExit):  # --seeds 0: refused by its parser (flatlm.core.flags)
        p.parse_args(["--seeds", "0"])


def test_the_summary_prints_the_selection_verdict_and_the_table_for_a_selection_sweep(capsys):
    import numpy as np
    import pandas as pd

    from sweeps import summary

    rng = np.random.default_rng(0)
    flat = rng.uniform(10, 100, size=12)
    runs = pd.DataFrame({"run_id": np.repeat([f"r{i}" for i in range(6)], 2), "step": 1,
                         "pretrain/kl": 0.01, "pretrain/loss": rng.uniform(2, 2.01, size=12),
                         "flat/trace_fisher": flat, "probe/A/acc_mean": 1 - flat / 200})
    sweep = tiny_sweep()
    summary._print_selection(sweep, runs, "probe/A/acc_mean")
    out = capsys.readouterr().out
    assert "Model selection: 12 candidate checkpoints of 6 runs" in out
    assert "flat/trace_fisher" in out and "regret gain +0.2434" in out and "| selector" not in out
    summary._print_selection(replace(sweep, selection=True), runs, "probe/A/acc_mean")
    assert "| selector | statistic |" in capsys.readouterr().out


def test_the_summary_states_the_measurement_cost_and_says_nothing_without_it():
    import pandas as pd

    from sweeps.summary import measurement_cost

    runs = pd.DataFrame({"time/measure_share": [0.5, None, 0.1, 0.2, 0.3]})
    line = measurement_cost(runs)
    assert "25.0% of the training time" in line and "median of 4 checkpoints" in line
    assert "largest 50.0%" in line
    assert measurement_cost(pd.DataFrame({"pretrain/loss": [1.0]})) is None
    assert measurement_cost(pd.DataFrame({"time/measure_share": [None]})) is None


def test_a_tampered_state_is_refused_even_with_trust_state_and_the_refusal_never_advises_it(
        tmp_path, monkeypatch, capsys):
    """Issue 43, item 1: the refusal for a tampered tuner.pkl suggested --trust-state, which ran
    the planted pickle. Tampering is refused whatever the flags; only a sweep with no record
    here (copied, an older flatlm) is what --trust-state accepts."""
    from sweeps.driver import check_state
    from sweeps.trust import StateTampered, StateUnverified, record_digest

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME")  # the suite sets one (tests/conftest.py)
    sweep = tmp_path / "ray_results" / "scaling"
    sweep.mkdir(parents=True)
    sweep.chmod(0o755)
    (sweep / "tuner.pkl").write_bytes(b"what Tune wrote")
    (sweep / "tuner.pkl").chmod(0o644)
    with pytest.raises(StateUnverified):  # no record here: refused, overrulable
        check_state(sweep, trust_state=False)
    check_state(sweep, trust_state=True)
    record_digest(sweep)
    (sweep / "tuner.pkl").write_bytes(b"import os; os.system('...')")
    for trust in (False, True):
        with pytest.raises(StateTampered) as refused:
            check_state(sweep, trust_state=trust)
        assert "--trust-state" not in str(refused.value)
    (sweep / "tuner.pkl").write_bytes(b"what Tune wrote")
    (sweep / "searcher-state-1.pkl").write_bytes(b"planted")  # a file the record does not know
    (sweep / "searcher-state-1.pkl").chmod(0o644)
    with pytest.raises(StateTampered):
        check_state(sweep, trust_state=True)


def test_the_cli_refusal_of_a_tampered_state_does_not_suggest_trust_state(
        tmp_path, monkeypatch, capsys):
    from sweeps.cli import main as sweep_main
    from sweeps.trust import record_digest

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME")  # the suite sets one (tests/conftest.py)
    sweep = tmp_path / "ray_results" / "scaling"
    sweep.mkdir(parents=True)
    (sweep / "tuner.pkl").write_bytes(b"what Tune wrote")
    record_digest(sweep)
    (sweep / "tuner.pkl").write_bytes(b"planted")
    monkeypatch.setattr(sys, "argv", ["scaling.py", "--workdir", str(tmp_path), "--resume"])

    def build(args):
        from sweeps.experiment import experiment_of, sweep_of

        return sweep_of(experiment_of("sizes", args), "scaling")

    rc = sweep_main(build, "the scaling sweep")
    err = capsys.readouterr().err
    assert rc == 2 and "not the file flatlm wrote" in err and "--trust-state" not in err


@pytest.mark.parametrize("uri", [" http://alice:pw@host", "http://alice:pw@host\n",
                                 "\tHTTPS://alice:pw@host/x"])
def test_a_password_behind_blanks_is_refused_too(uri):
    """Issue 43, item 2: a leading space let the password through to Ray's state files."""
    from sweeps.spec import check_tracking_uri

    with pytest.raises(ValueError, match="MLFLOW_TRACKING_PASSWORD"):
        check_tracking_uri(uri)


def test_resume_of_a_sweep_whose_state_is_gone_is_refused(tmp_path):
    """Issue 43, item 10: --resume of a sweep whose tuner.pkl was gone silently started a
    second sweep (6 MLflow runs for 3 grid points)."""
    from sweeps.driver import check_state

    sweep = tmp_path / "ray_results" / "scaling"
    sweep.mkdir(parents=True)
    (sweep / "experiment_state-2026.json").write_text("{}")
    with pytest.raises(ValueError, match="tuner.pkl is missing, so Ray cannot restore"):
        check_state(sweep, trust_state=False)


@pytest.mark.parametrize(("change", "needle"), [
    ({"train.batch_size": 10**9}, "one forward pass of 1000000000 sentences"),
    ({"source": "dyck:1000000", "measure.spans": None}, "sentences of 1000000 positions"),
    ({"model": "d1000000-h1-l1-i64"}, "--model d1000000-h1-l1-i64"),
])
def test_sizes_that_cannot_fit_are_one_error_before_any_trial(change, needle):
    """Issue 43, item 14: the sweeps checked sizes only inside each trial (rc 1 and 4-13
    tracebacks); attention's T x T weights were left out of the estimate (dyck:1000000 reached
    a 32 TB allocation)."""
    sweep = Sweep(name="s", base=apply_overrides(base_of("sweep"), change))
    with pytest.raises(ValueError, match=needle):
        check_sweep(sweep)


def test_a_sweep_whose_every_trial_diverged_says_so_instead_of_empty_tables():
    """Issue 43, item 9: a sweep whose trials all diverged printed an empty table, "no KL was
    measured" and "every run has checkpoints in the regime" over 0 runs."""
    import pandas as pd

    from sweeps.summary import nothing_finished

    diverged = pd.DataFrame({"run_id": ["a", "a", "b"], "status": ["FAILED"] * 3,
                             "step": [0, 0, 0]})
    assert "No run of this sweep finished (2 run(s)" in nothing_finished(diverged)
    assert nothing_finished(diverged.assign(status=["FAILED", "FAILED", "FINISHED"])) is None


def test_failed_trials_end_in_one_line_without_colour_codes():
    """Issue 43, item 9: every trial failing ended the sweep in an uncaught RuntimeError
    traceback with Ray's ANSI colour codes."""
    from pathlib import Path

    from sweeps.driver import TrialsFailed

    e = TrialsFailed(["\x1b[36mray::train()\x1b[39m\nTraceback\n  File x\nValueError: boom\n"],
                     3, Path("/w/trials/s"))
    assert str(e).startswith("1 of 3 trial(s) failed after their retries; the first: "
                             "ValueError: boom")
    assert "\x1b" not in str(e)


def test_an_interrupted_cache_write_leaves_no_temporary(tmp_path):
    from flatlm.measure.eval_cache import remove_stale_temporaries, replace_atomically

    def fails(tmp):
        tmp.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        replace_atomically(tmp_path / "eval-x.pt", fails)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / ".eval-y.pt.1234.tmp").write_bytes(b"left by a killed writer")
    assert remove_stale_temporaries(tmp_path) == 1 and list(tmp_path.iterdir()) == []


def test_quick_measures_the_loss_only_and_a_later_set_replaces_it():
    """Issue 42: the sweeps' cheap mode, named in their help."""
    from argparse import Namespace

    from sweeps.cli import apply_arguments, parser
    from sweeps.spec import Sweep

    assert "--quick" in parser("A sweep.\n\nexamples").format_help()

    def built(quick, *overrides):
        args = Namespace(overrides=list(overrides), quick=quick, name=None,
                         cpus_per_trial=None, gpus_per_trial=None, max_failures=None,
                         kl_threshold=None)
        return apply_arguments(Sweep(name="t", base=base_of("sweep")), args).base.measure.what

    assert built(True) == ("loss",)
    assert built(True, 'measure.what=["loss","probe"]') == ("loss", "probe")
    assert "probe" in built(False)


def _seed_grid(**fields) -> Sweep:
    return replace(tiny_sweep(), space={"train.seed": {"grid_search": [0, 1, 2]},
                                        "model": {"grid_search": ["d16-h1-l1-i64",
                                                                  "lstm-h16-l1"]}}, **fields)


def test_packs_cut_the_grid_by_shape_and_k():
    from sweeps.spec import packs, planned_trials, ray_trials

    sweep = _seed_grid(pack=2)
    got = packs(sweep)  # the BERT's three seeds in packs of 2; each LSTM trial alone
    assert [len(p) for p in got] == [2, 1, 1, 1, 1]
    assert {p["model"] for p in got[0]} == {"d16-h1-l1-i64"}
    assert (planned_trials(sweep), ray_trials(sweep), ray_trials(replace(sweep, pack=1))) == (
        6, 5, 6)
    check_sweep(sweep)


@pytest.mark.parametrize(("fields", "message"), [
    ({"pack": 0}, r"--pack 0: give a whole number >= 1"),
    ({"pack": 2, "searcher": "optuna"}, r"--pack 2: packs group a grid's points.*--pack 1"),
    ({"pack": 2, "base": apply_overrides(base_of("sweep"), {
        "train.algorithm": "grow", "train.grow.steps": [2],
        "train.grow.to": ["d64-h4-l2-i256"]})}, r"train.algorithm=grow cannot be packed"),
])
def test_a_bad_pack_is_refused_before_ray_starts(fields, message):
    sweep = replace(tiny_sweep(), space={"train.seed": {"grid_search": [0, 1]}})
    with pytest.raises(ValueError, match=message):
        check_sweep(replace(sweep, **fields))


def test_pack_defaults_to_on_only_where_trials_get_a_gpu():
    from flatlm.runs.pack_size import CUDA_PACK
    from sweeps.cli import default_pack

    sweep = replace(tiny_sweep(), space={"train.seed": {"grid_search": [0, 1]}})
    assert default_pack(sweep) == 1
    assert default_pack(replace(sweep, gpus_per_trial=0.5)) == CUDA_PACK
    assert default_pack(replace(sweep, gpus_per_trial=1, searcher="optuna")) == 1


def test_the_digests_follow_xdg_cache_home_and_the_suite_keeps_its_own(tmp_path, monkeypatch):
    """A record left in the home directory by an earlier run, at a path pytest handed out again,
    refused a later run's resume (CI): the suite keeps its caches in a directory of its own, and
    an absolute $XDG_CACHE_HOME is where the digests go (a relative one is ignored, as XDG says)."""
    from sweeps.trust import digest_file

    assert Path(os.environ["XDG_CACHE_HOME"]).name.startswith("flatlm-test-cache-")
    sweep = tmp_path / "ray_results" / "scaling"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert digest_file(sweep).is_relative_to(tmp_path / "xdg" / "flatlm" / "tuner-digests")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert digest_file(sweep).is_relative_to(tmp_path / "home" / ".cache" / "flatlm")


def test_a_new_sweep_forgets_the_digests_of_one_deleted_from_its_path(tmp_path, capsys):
    """The record of a sweep deleted from a path is not the record of the next one started
    there: its files, put back, must not verify."""
    from sweeps.trust import check_digest, forget_digests, record_digest

    sweep = tmp_path / "ray_results" / "scaling"
    sweep.mkdir(parents=True)
    (sweep / "tuner.pkl").write_bytes(b"the earlier sweep's state")
    record_digest(sweep)
    check_digest(sweep)
    assert capsys.readouterr().err == ""  # recorded: verified without a word
    forget_digests(sweep)
    forget_digests(sweep)  # nothing recorded: nothing to do
    check_digest(sweep)
    assert "no digest of its state" in capsys.readouterr().err
