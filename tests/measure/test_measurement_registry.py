"""A new measurement is one file: the toy in tests/assets/toy_measurement.py, registered through
``flatlm.measure.registry`` and nothing else, runs in a whole trial and shows in every table
derived from the registry; the built-in measurements give the keys they declare."""

import importlib
import math
import subprocess
import sys
from types import SimpleNamespace

import pytest

from flatlm.cli import build_parser
from flatlm.core.config import ConfigError, apply_overrides, from_dict, to_dict, to_flat_dict
from flatlm.measure import ENTROPY, KL
from flatlm.measure import registry as measure_registry
from flatlm.measure.probes.probe import ProbeConfig
from flatlm.measure.registry import (
    Measurement,
    Quantity,
    measurement_names,
    metric_keys,
    register_measurement,
)
from flatlm.measure.run import MeasureConfig, eval_data, measure_model, skipped_without_truth
from flatlm.models import build_model, load_checkpoint, parse_model
from flatlm.runs.trial import TrialConfig, run_trial, tracked_params
from flatlm.sources import load

TOY = "tests.assets.toy_measurement"


@pytest.fixture
def toy(monkeypatch):
    """The toy module, imported (so registered) on a copy of the registry, undone after."""
    # Without the toy's own entries: whatever imported the module before (a collector, another
    # test) must not make this import a second registration.
    registry = measure_registry.MEASUREMENTS
    saved = dict(registry)
    for name, m in saved.items():
        if getattr(m.run, "__module__", None) == TOY:
            del registry[name]
    sys.modules.pop(TOY, None)
    yield importlib.import_module(TOY)
    registry.clear()
    registry.update(saved)
    sys.modules.pop(TOY, None)


def test_a_registered_toy_measurement_runs_in_a_trial(toy, tmp_path):
    cfg = apply_overrides(TrialConfig(), {
        "source": "dyck:4", "model": "d16-h1-l1-i32", "train.steps": 2, "train.batch_size": 4,
        "train.checkpoint_steps": [1, 2], "train.warmup_steps": 1, "measure.n_eval": 8,
        "measure.n_downstream": 20, "measure.what": ["param_norm", "loss"]})
    rows = run_trial(cfg, tmp_path)
    for step in (1, 2):
        model = load_checkpoint(tmp_path / "checkpoints" / f"step-{step}")[0]
        norm = math.sqrt(sum(float(p.detach().double().square().sum())
                             for p in model.parameters()))
        assert rows[step][toy.PARAM_NORM] == pytest.approx(norm, rel=1e-12)
    keys = [k for k in rows[2] if not k.startswith("time/")]
    assert keys.index(toy.PARAM_NORM) > keys.index("pretrain/loss")  # after the built-in ones
    assert rows[2]["time/param_norm_s"] >= 0  # timed, though it does not time itself


def _norm_trial(**overrides) -> TrialConfig:
    return apply_overrides(TrialConfig(), {
        "source": "dyck:4", "model": "d16-h1-l1-i32", "train.steps": 1, "train.batch_size": 4,
        "train.checkpoint_steps": [1], "train.warmup_steps": 0, "measure.n_eval": 8,
        "measure.what": ["param_norm"], **overrides})


def test_its_setting_is_a_key_checked_against_its_own_defaults(toy):
    cfg = _norm_trial(**{"measure.param_norm.p": "1"})
    assert cfg.measure.settings("param_norm") == toy.ParamNormConfig(p=1.0)
    assert _norm_trial().measure.settings("param_norm").p == 2.0  # not given: its default
    assert cfg.measure.param_norm == cfg.measure.settings("param_norm")  # read as an attribute
    assert cfg.measure.probe == cfg.measure.settings("probe") == ProbeConfig()  # a built-in's too
    with pytest.raises(ConfigError, match=r"unknown config key 'measure.param_norm.q': "
                                          "ParamNormConfig has p"):
        _norm_trial(**{"measure.param_norm.q": 1})
    with pytest.raises(ValueError, match=r"measure.param_norm.p=0.5: use an order >= 1"):
        _norm_trial(**{"measure.param_norm.p": 0.5})
    with pytest.raises(ConfigError, match=r"unknown config key 'measure.param_norms'.*sections "
                                          "of registered components: .*, param_norm$"):
        _norm_trial(**{"measure.param_norms.p": 1})
    with pytest.raises(ConfigError, match=r"measure.param_norm=3: measure.param_norm is a "
                                          r"section; set its keys \(measure.param_norm.<key>\)"):
        _norm_trial(**{"measure.param_norm": 3})


def test_its_setting_is_saved_logged_and_read_back_like_a_field(toy):
    cfg = _norm_trial(**{"measure.param_norm.p": 1})
    assert to_flat_dict(cfg.measure)["param_norm.p"] == 1.0
    assert to_dict(cfg)["measure"]["param_norm"] == {"p": 1.0}  # config.json
    assert from_dict(TrialConfig, to_dict(cfg)) == cfg
    assert tracked_params(cfg)["measure.param_norm.p"] == 1.0
    other = apply_overrides(cfg, {"measure.what": ["loss"]})  # given, but it does not run
    assert not any("param_norm" in k for k in tracked_params(other))
    # the field holding the sections is never a key; a section at its defaults is not stored
    assert to_dict(MeasureConfig()).keys().isdisjoint({"sections", "probe", "param_norm"})
    assert not any(k.startswith(("sections", "probe.")) for k in to_flat_dict(MeasureConfig()))
    assert tracked_params(_norm_trial(**{"measure.what": ["probe"]}))["measure.probe.seeds"] == 5


def test_the_run_reads_its_setting(toy, tmp_path):
    rows = run_trial(_norm_trial(**{"measure.param_norm.p": 1}), tmp_path)
    model = load_checkpoint(tmp_path / "checkpoints" / "step-1")[0]
    l1 = sum(float(p.detach().double().abs().sum()) for p in model.parameters())
    assert rows[1][toy.PARAM_NORM] == pytest.approx(l1, rel=1e-12)


def test_a_settings_section_is_declared_whole_and_owned_once(toy):
    with pytest.raises(ValueError, match="give both, a dataclass of its settings and the "
                                         "identifier of their section"):
        Measurement(name="x", run=toy.param_norm, config=toy.ParamNormConfig)
    with pytest.raises(ValueError, match="section 'param_norm' holds another measurement's "
                                         "settings \\(ParamNormConfig\\)"):
        register_measurement(Measurement(name="x", run=toy.param_norm, section="param_norm",
                                         config=type("Other", (toy.ParamNormConfig,), {})))
    with pytest.raises(ValueError, match="section 'probe' holds another measurement's "
                                         "settings \\(ProbeConfig\\)"):  # a built-in's
        register_measurement(Measurement(name="x", run=toy.param_norm, section="probe",
                                         config=toy.ParamNormConfig))
    register_measurement(Measurement(name="shadow", run=toy.param_norm, section="n_eval",
                                     config=toy.ParamNormConfig))
    with pytest.raises(ValueError, match="measure.n_eval: a registered measurement's section "
                                         "has the name of a MeasureConfig field or attribute"):
        MeasureConfig()


def test_the_derived_tables_name_the_toy(toy, capsys):
    assert measurement_names()[-1] == "param_norm"
    assert MeasureConfig(what=("param_norm",)).what == ("param_norm",)
    assert metric_keys(("param_norm", "finetune"), ("B",)) == (
        "finetune/B/acc_mean", "finetune/B/acc_std", toy.PARAM_NORM)
    no_truth = SimpleNamespace(has_truth=False)
    assert skipped_without_truth(no_truth, MeasureConfig(what=("loss", "param_norm"))) == [
        ENTROPY, KL]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["measure", "--help"])
    assert "glue, param_norm" in " ".join(capsys.readouterr().out.split())  # --what's help


def test_a_plugin_quantity_reaches_the_leaderboard_with_its_label_and_timing(toy):
    from analysis.labels import axis_label
    from analysis.leaderboard import comparable_across_shapes, measure_keys, timing_key

    columns = ["pretrain/loss", "flat/trace_fisher", toy.PARAM_NORM, toy.PARAM_NORM + "_se"]
    assert measure_keys(columns) == ["flat/trace_fisher", toy.PARAM_NORM]
    assert axis_label(toy.PARAM_NORM) == "parameter norm"
    assert timing_key(toy.PARAM_NORM) == "time/param_norm_s"  # measure.run times it whole
    assert not comparable_across_shapes(toy.PARAM_NORM)  # not declared shape_free


def test_the_built_in_quantities_name_every_selector_and_load_without_torch():
    """The leaderboard's selectors, names and timings come from the built-in entries, and the
    registry loads without torch (the analysis layer reads it): the runs are imported on their
    first call."""
    from analysis.leaderboard import measure_keys, timing_key

    code = ("import sys, flatlm.measure.registry as r; "
            "print(len(r.quantities()), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.split()[1] == "False", done.stderr
    columns = ["flat/sharpness_avg", "noise/loss_delta_0.1", "noise/loss_delta_0.01", "llc/mean",
               "cka/truth_random_init", "cka/truth", "flat/trace_hessian_grown"]
    assert measure_keys(columns) == ["flat/sharpness_avg", "llc/mean",
                                     "flat/trace_hessian_grown", "noise/loss_delta_0.01",
                                     "noise/loss_delta_0.1", "cka/truth"]
    assert timing_key("flat/top_eig_fisher") == "time/landscape_s"
    assert timing_key("cka/truth_token") == "time/cka_truth_s"
    assert measure_registry.quantity_of("made/up") is None


def test_a_quantity_is_checked_when_declared():
    with pytest.raises(ValueError, match="not its _se twin"):
        Quantity(key="toy/x_se", label="x")
    with pytest.raises(ValueError, match="give leaderboard=True too"):
        Quantity(key="toy/x", label="x", higher_picked=True)


def test_what_a_measurement_declares_decides_what_is_skipped_and_logged(toy):
    register_measurement(Measurement(name="toy_truth", run=toy.param_norm, needs_truth=True,
                                     sections=("finetune",)))
    no_truth = SimpleNamespace(has_truth=False)
    assert skipped_without_truth(no_truth, MeasureConfig(what=("toy_truth",))) == ["toy_truth/*"]
    logged = tracked_params(TrialConfig(measure=MeasureConfig(what=("toy_truth",))))
    assert "measure.finetune.lr" in logged and "measure.probe.epochs" not in logged
    assert "measure.finetune.lr" not in tracked_params(
        TrialConfig(measure=MeasureConfig(what=("param_norm",))))


def test_an_unknown_measurement_is_an_error_naming_the_field_and_the_known_ones(toy):
    with pytest.raises(ValueError, match=r"measure\.what: unknown measurement\(s\) "
                                         r"\['param_nrom'\]; use any of loss, .*, param_norm"):
        apply_overrides(TrialConfig(), {"measure.what": ["loss", "param_nrom"]})


def test_a_measurement_is_checked_when_declared_and_registered(toy):
    with pytest.raises(ValueError, match="registered already"):
        register_measurement(Measurement(name="loss", run=toy.param_norm))
    with pytest.raises(ValueError, match="implies"):
        register_measurement(Measurement(name="x", run=toy.param_norm, implies=("y",)))
    with pytest.raises(ValueError, match="without commas"):
        Measurement(name="a,b", run=toy.param_norm)
    with pytest.raises(ValueError, match="give a run or a reference"):
        Measurement(name="nothing")


def test_the_built_in_measurements_give_the_keys_they_declare():
    src = load("dyck:4")
    shape = parse_model("d16-h1-l1-i32")
    what = ("loss", "hessian", "lookup", "eigen", "density", "precond", "critical", "llc",
            "probe", "finetune")
    cfg = apply_overrides(MeasureConfig(), {
        "what": what, "n_eval": 16, "n_downstream": 30, "flatness.hutchinson_batch_size": 8,
        "spectrum.n_inputs": 8, "spectrum.batch_size": 4, "spectrum.lanczos_steps": 2,
        "precond.n_inputs": 8, "critical.n_inputs": 8,  # no checkpoint: precond NaN, critical -g
        "llc.chains": 2, "llc.draws": 2, "llc.burn_in": 0, "llc.batch_size": 8,
        "spectrum.slq_probes": 2, "spectrum.slq_steps": 2, "probe.epochs": 1, "probe.seeds": 1,
        "finetune.epochs": 1, "finetune.seeds": 1, "finetune.warmup_steps": 1})
    model = build_model(shape, src.V, src.max_length, seed=0)
    out = measure_model(model, src, eval_data(src, cfg, shape), cfg, "cpu")
    # random_init/*, random_init_ridge/*: probe's reference, given only when eval_data has the
    # model config
    given = {k for k in out if not k.startswith(("time/", "random_init/", "random_init_ridge/"))}
    assert given == set(metric_keys(what, src.tasks))
