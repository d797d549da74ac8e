"""``--source SPEC`` on the sweep scripts: one setting with ``--set source=SPEC``, and each kind's
defaults (an HMM trains BiLSTMs and probes task-6 / task-10; Dyck probes g*). No Ray started."""

from argparse import Namespace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

from flatlm.experiments.presets import PAPER_LSTMS, TINY_LSTMS, hmm_tasks  # noqa: E402
from flatlm.experiments.scales import TESTBED_MODELS  # noqa: E402
from flatlm.sources import SourceSpec  # noqa: E402
from sweeps import (  # noqa: E402
    algorithms,  # noqa: E402
    scaling,  # noqa: E402
    steps,  # noqa: E402
)
from sweeps.cli import parser, resolve_source  # noqa: E402
from sweeps.spec import check_sweep, sweep_task  # noqa: E402
from tests.sweeps.sweeptools import scaling_here  # noqa: E402

HMM = "hmm:seed=0,vocab=20,states=6,length=12,blocks=2"


def args_of(*argv: str) -> Namespace:
    args = parser("A sweep.").parse_args(list(argv))
    resolve_source(args)
    return args


def test_source_and_set_source_are_one_setting():
    assert args_of("--source", HMM).source == HMM
    assert args_of("--set", f"source={HMM}").source == HMM
    assert args_of("--source", HMM, "--set", f"source={HMM}").source == HMM  # the same: fine
    assert args_of().source is None


def test_conflicting_sources_are_an_error_naming_both():
    with pytest.raises(ValueError, match=r"--source 'dyck:6' and --set source='dyck:8' name "
                                         r"different sources"):
        args_of("--source", "dyck:6", "--set", "source=dyck:8")
    with pytest.raises(ValueError, match=r"--source 'dyck:5': .*even"):
        args_of("--source", "dyck:5")


def test_an_hmm_scales_bilstms_on_the_papers_tasks():
    sweep = scaling.build(args_of("--source", HMM))
    assert sweep.space["model"]["grid_search"] == list(TINY_LSTMS)
    assert sweep.base.source == SourceSpec(HMM)
    assert tuple(sweep.base.measure.tasks) == ("task-6", "task-10")
    assert sweep.base.measure.grow_to is None  # BiLSTMs do not grow (B.4 is for BERTs)
    check_sweep(sweep)  # every grid point builds
    paper = scaling.build(Namespace(scale="gpu", source=HMM))
    assert paper.space["model"]["grid_search"] == list(PAPER_LSTMS)
    released = scaling.build(Namespace(scale="gpu", protocol="paper-code", source=HMM))
    assert released.base.measure.label_rule is None  # not the PCFG's inside rule
    check_sweep(released)
    assert hmm_tasks(16) == ["task-6", "task-10"] and hmm_tasks(8) == ["task-6"]
    assert hmm_tasks(4) == ["task-2"]
    assert str(steps.build(Namespace(source=HMM)).base.model) == TINY_LSTMS[-1]


def test_dyck_keeps_the_berts_and_probes_g_star():
    sweep = scaling.build(args_of("--source", "dyck:6"))
    assert sweep.space["model"]["grid_search"] == list(TESTBED_MODELS)
    assert sweep_task(sweep) == "g_star"
    algs = algorithms.build(Namespace(source="dyck:6", algorithms="adversarial"))
    assert algs.base.train.adversarial.task == "g_star"  # the adversary attacks the probed task
    check_sweep(algs)


def test_a_bad_source_on_the_command_line_exits_2_before_any_trial(tmp_path, monkeypatch):
    out = scaling_here(monkeypatch, ["--source", "dyck:6", "--set", "source=dyck:8",
                                     "--workdir", tmp_path], tmp_path)
    assert out.returncode == 2, out.stderr
    assert "error: --source 'dyck:6' and --set source='dyck:8'" in out.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_lm_text_probes_its_first_and_middle_positions(tmp_path):
    from transformers import AutoModelForCausalLM, GPT2Config

    config = GPT2Config(vocab_size=9, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                        bos_token_id=8, eos_token_id=8, pad_token_id=8)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "lm")
    source = f"lm:{tmp_path / 'lm'},vocab=4,length=6,rule=bos"
    sweep = scaling.build(args_of("--source", source))
    assert tuple(sweep.base.measure.tasks) == ("mask-1", "mask-3")
    assert sweep_task(sweep) == "mask-1"


def test_real_text_masks_15_percent_and_fine_tunes_on_its_glue_tasks(tmp_path):
    from tests.assets.text_assets import make_text_assets, text_spec

    assets = make_text_assets(tmp_path, n_docs=40, n_glue=20)
    sweep = scaling.build(args_of("--source", text_spec(assets)))
    assert sweep.base.train.mask == 0.15 and tuple(sweep.base.measure.tasks) == ()
    assert set(sweep.base.measure.what) == {"loss", "fisher", "hessian", "probe", "glue"}
    bare = scaling.build(args_of("--source", text_spec(assets, glue=False)))
    assert set(bare.base.measure.what) == {"loss", "fisher", "hessian"}  # no task to probe
    with pytest.raises(ValueError, match="no downstream task to judge the sweep on"):
        sweep_task(bare)


def test_lm_text_with_glue_also_fine_tunes_on_its_glue_tasks(tmp_path):
    from tests.assets.lm_assets import lm_glue_spec, make_lm_assets

    sweep = scaling.build(args_of("--source", lm_glue_spec(make_lm_assets(tmp_path, n_glue=10))))
    assert tuple(sweep.base.measure.tasks) == ("mask-1", "mask-6")
    assert sweep.base.measure.what == ("loss", "fisher", "hessian", "probe", "lookup", "glue")
    assert sweep_task(sweep) == "mask-1"
    check_sweep(sweep)


def test_real_text_without_tasks_refuses_the_adversary_naming_the_way_out(tmp_path):
    from flatlm.experiments.paper import build
    from tests.assets.text_assets import make_text_assets, text_spec

    bare = text_spec(make_text_assets(tmp_path, n_docs=40, n_glue=20), glue=False)
    with pytest.raises(ValueError, match="adversarial run attacks a downstream task.*measures "
                                         "none.*--algorithms adamw,noreg,sam"):
        build("algorithms", scale="sweep", source=bare)
    trials = build("algorithms", scale="sweep", source=bare, algorithms=("adamw", "sam"))
    assert [cfg.train.algorithm for _, cfg in trials.trials()] == ["adamw", "sam"]
