"""Every trial config the layers build, as plain data: the behaviour-unchanged proof of a change
to the layers (``flatlm.experiments.layers``: defaults, scale, protocol, source kind, experiment,
grid point). ``test_trial_configs.py`` compares them with the committed snapshot
(``data/trial_configs.json``: per trial a sha256 of its flat config); regenerate it only for a
change that is meant to change a trial's config:

    PYTHONPATH=. python -m tests.experiments.trial_configs   # rewrites the snapshot

What is enumerated: every built-in scale x every protocol (each base alone and with each switch
it lacks) x sources of each kind (the scale's own PCFG; a PCFG, an HMM short and long enough for
the paper's tasks, Dyck; LM text and real text, with and without GLUE tasks, built in a temporary
folder whose path the snapshot writes as ``<tmp>``) x the base trial (``base_of``: flatlm trial,
flatlm config, a sweep script of one's own) and every experiment as ``flatlm replicate`` builds it
(its replication seeds; the algorithms grid also over every registered algorithm with one
seed; the testbed's experiments also without its selection measures). A combination that is
refused is recorded by its error. Besides, the testbed searches' trials
(``search_trial_configs``): a candidate's pins (a linear schedule, the probe's epochs) win over
the protocol, a v2 scale's settings do not.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

# as tests/conftest.py: the text and LM sources' files are local, the Hub is not asked
for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_name, "1")

from flatlm.core.config import apply_overrides, flatten_dict, to_dict, to_flat_dict  # noqa: E402
from flatlm.experiments.grids import EXPERIMENTS, EXTRA_EXPERIMENTS, trial_name  # noqa: E402
from flatlm.experiments.paper import base_of, build  # noqa: E402
from flatlm.experiments.protocols import BASES, SWITCHES  # noqa: E402
from flatlm.experiments.scales import SCALES  # noqa: E402

SNAPSHOT = Path(__file__).parent / "data" / "trial_configs.json"
TMP = "<tmp>"

# The built-in scales and algorithms (a plug-in another test loaded may have added to the
# registries).
SCALE_NAMES = ("sweep", "tiny", "gpu", "testbed", "testbed-v2")
ALGORITHMS = ("adamw", "sgd", "noreg", "sam", "adversarial", "grow", "label_noise", "muon")
PLAIN_SOURCES = {
    "scale": None,
    "pcfg": "pcfg:seed=3,random.vocab=20",
    "hmm-short": "hmm:seed=0,vocab=20,states=6,length=6,blocks=2",
    "hmm-long": "hmm:seed=0,vocab=20,states=6,length=12,blocks=2",
    "dyck": "dyck:8",
}


def protocols() -> list[str]:
    """Each base, then it with each switch it lacks."""
    out = []
    for base, (_, has) in BASES.items():
        out += [base, *(f"{base}+{s}" for s in SWITCHES if s not in has)]
    return out


def file_sources(root: Path) -> dict[str, str]:
    """Real text (a tiny corpus) and LM text (a tiny saved GPT-2 with its tokenizer), each with
    and without GLUE tasks (``tests.assets``)."""
    from tests.assets.lm_assets import lm_glue_spec, make_lm_assets
    from tests.assets.text_assets import text_spec

    assets = make_lm_assets(root, n_glue=10)
    lm_glue = lm_glue_spec(assets)
    return {"text": text_spec(assets, length=16, glue=False),
            "text-glue": text_spec(assets, length=16),
            "lm": lm_glue.split(",glue=")[0], "lm-glue": lm_glue}


# The algorithms' sections that were TrainConfig fields until issue 51 (every config wrote them):
# hashed as they were, so that the snapshot made before shows that no trial's config moved.
FORMER_FIELDS = ("sam", "adversarial", "grow", "label_noise")
# and the measurements' sections that were MeasureConfig fields until issue 51
FORMER_MEASURE_FIELDS = ("loss", "flatness", "probe", "finetune", "spectrum", "sharpness",
                         "precond", "critical", "noise", "cka", "llc")


def _former(train, measure) -> dict:
    """The former fields' sections as a saved dict wrote them: {"train": {...}, "measure": ...}."""
    return {"train": {s: to_dict(train.settings(s)) for s in FORMER_FIELDS},
            "measure": {s: to_dict(measure.settings(s)) for s in FORMER_MEASURE_FIELDS}}


def digest(cfg, tmp: str) -> str:
    """The first 16 hex digits of the sha256 of the trial's flat config (``to_flat_dict``, with
    the former fields' sections at their values) as sorted JSON, ``tmp`` written as
    ``<tmp>``."""
    flat = {**flatten_dict(_former(cfg.train, cfg.measure)), **to_flat_dict(cfg)}
    text = json.dumps(flat, sort_keys=True, default=repr).replace(tmp, TMP)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _with_former_fields(config: dict) -> dict:
    """A trial's saved dict with the former fields' sections written, as they were."""
    from flatlm.core.config import from_dict
    from flatlm.runs.trial import TrialConfig

    cfg = from_dict(TrialConfig, config)
    former = _former(cfg.train, cfg.measure)
    return {**config, "train": {**config["train"], **former["train"]},
            "measure": {**config["measure"], **former["measure"]}}


def _variants(scale: str) -> list[tuple[str, str, dict]]:
    """(label, experiment, build's options) of every experiment as replicate builds it."""
    sc = SCALES[scale]
    out = [(name, name, {"seeds": sc.seeds_of(name)}) for name in (*EXPERIMENTS,
                                                                   *EXTRA_EXPERIMENTS)]
    out.append(("algorithms[all]", "algorithms", {"seeds": (0,), "algorithms": ALGORITHMS}))
    if sc.selection_what:
        out += [(f"{name}[no-selection-measures]", name,
                 {"seeds": sc.seeds_of(name), "selection_measures": False})
                for name in ("steps", "sizes", "algorithms", "selection")]
    return out


def _point(base, point: dict, tmp: str) -> str:
    """The digest of ``base`` with the grid ``point`` (``Experiment.trials``), or its error."""
    try:
        return digest(apply_overrides(base, point), tmp)
    except Exception as e:  # noqa: BLE001 (e.g. the grow algorithm without its growths)
        return _error(e, tmp)


def _error(e: Exception, tmp: str) -> str:
    return f"error: {type(e).__name__}: {e}".replace(tmp, TMP)


def trial_configs(sources: dict[str, str | None], tmp: str, *,
                  scales: tuple[str, ...] = SCALE_NAMES,
                  protocol_names: list[str] | None = None) -> dict:
    """scale -> protocol -> source label -> experiment label -> trial name -> sha256 (or the
    error of a refused combination, in place of the trials); every scale and protocol unless
    ``scales`` / ``protocol_names`` name fewer."""
    out: dict = {}
    for scale in scales:
        for protocol in protocol_names or protocols():
            for label, source in sources.items():
                group = out.setdefault(scale, {}).setdefault(protocol, {}).setdefault(label, {})
                try:
                    group["base"] = digest(base_of(scale, protocol, source), tmp)
                except Exception as e:  # noqa: BLE001 (a refusal is behaviour too)
                    group["base"] = _error(e, tmp)
                for name, experiment, options in _variants(scale):
                    try:
                        exp = build(experiment, scale=scale, protocol=protocol, source=source,
                                    **options)
                        # with the settings linked to the point (a model's, an algorithm's),
                        # as Experiment.trials applies them
                        group[name] = {trial_name(point): _point(
                            exp.base, {**point, **exp.linked_to(point)}, tmp)
                            for point in exp.points()}
                    except Exception as e:  # noqa: BLE001 (a refusal is behaviour too)
                        group[name] = _error(e, tmp)
    return out


def search_trial_configs() -> dict:
    """The testbed searches' trials (``apps.testbed_search``: its candidate
    scales, each stage-1 setting of each grid, and the second search's scales), as their jobs
    build them (``experiment_trials``, protocol paper): label -> experiment -> trial -> sha256.
    The scales are registered under their names meanwhile, as the searches do, then removed."""
    from apps.testbed_search import first, second
    from apps.testbed_search.trials import (
        candidate_pins,
        candidate_scale,
        experiment_trials,
        v2_scale,
    )
    from flatlm.experiments.scales import SCALES

    spec = second.PAPER_GRAMMAR["spec"]
    scales = {f"candidate {grid} {name}": (candidate_scale(spec, grid, setting, None),
                                           candidate_pins(setting))
              for grid in first.GRIDS for name, setting in first.SETTINGS.items()}
    scales["candidate lambda+long_lr"] = (candidate_scale(
        spec, "tiny", first.SETTINGS["linear"], 9000, adversarial_lambda=0.0316, long_lr=2e-3),
        candidate_pins(first.SETTINGS["linear"]))
    scales.update({f"v2 {grid}": (v2_scale(spec, grid), None) for grid in second.GRIDS})
    before = {name: SCALES.get(name) for name in ("candidate", "v2-candidate")}
    out: dict = {}
    try:
        for label, (sc, pins) in scales.items():
            for experiment, trial, config in experiment_trials(sc, EXPERIMENTS, (0, 1),
                                                               pins=pins):
                text = json.dumps(_with_former_fields(config), sort_keys=True, default=repr)
                out.setdefault(label, {}).setdefault(experiment, {})[trial] = hashlib.sha256(
                    text.encode()).hexdigest()[:16]
    finally:
        for name, entry in before.items():
            SCALES.pop(name, None)
            if entry is not None:
                SCALES[name] = entry
    return out


def all_trial_configs() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        layers = trial_configs({**PLAIN_SOURCES, **file_sources(Path(tmp))}, tmp)
    return {**layers, "testbed searches": search_trial_configs()}


def count(snapshot: dict) -> int:
    """How many trial configs (and bases) a snapshot holds."""
    return sum(1 if isinstance(v, str) else count(v) for v in snapshot.values())


if __name__ == "__main__":
    snapshot = all_trial_configs()
    SNAPSHOT.write_text(json.dumps(snapshot, indent=0, sort_keys=True, separators=(",", ":"))
                        + "\n")
    print(f"{SNAPSHOT}: {count(snapshot)} trial configs", file=sys.stderr)
