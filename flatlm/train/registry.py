"""The algorithm registry: one ``Algorithm`` object per pre-training algorithm, in one table.

An algorithm is its name, its defaults (optimizer, weight decay, dropout, warmup), its own
settings (a dataclass given as ``config=`` and the ``section`` naming its keys,
``train.sam.rho``; the built-ins' declared so as a plug-in's are), its update, its data-parallel
update, an optional batch transform and the hooks that the shared code reads instead of comparing
names. The tables other modules know are views of this one: ``ALGORITHMS`` (defaults,
``flatlm.train.config``), ``STEPS`` (``flatlm.train.algorithms``), ``DATA_PARALLEL_STEPS``
(``flatlm.train.distributed``) and the sections a trial leaves out of its logged params
(``unused_sections``).

Layering: this module imports only the ground floor (``flatlm.core.registry``: the table and the
lazy importer every registry shares) and ``flatlm.train.muon_config``'s settings class (torch-free;
muon's optimizer module is reached lazily), so ``flatlm.train.config``, which is read
when configs are parsed and imports no torch, checks ``train.algorithm`` against it. A function
is given as itself
or as ``"module:name"``, imported when first used; the built-ins below name theirs that way, so
neither parsing a config nor the modules of ``flatlm.train`` import each other to find a step
(``data.py`` no longer imports ``label_noise.py``, which imports it).

To add an algorithm, register it from a plug-in module (``--plugin MODULE`` on the ``flatlm``
commands and the sweeps, ``FLATLM_PLUGINS``, or the ``flatlm.plugins`` entry-point group), which
every process of a run imports, Ray workers and data-parallel ranks included:

    from flatlm.train.registry import Algorithm, AlgorithmDefaults, register_algorithm

    register_algorithm(Algorithm(
        name="sign_sgd", step=sign_step,  # (StepContext, StepInputs) -> {"train/loss": ...}
        defaults=AlgorithmDefaults(optimizer="sgd", weight_decay=0.0, dropout=0.0,
                                   warmup_steps=0, summary="what it is, in a line")))

``train.algorithm=sign_sgd`` then trains with it (tests/assets/toy_algorithm.py does exactly this).
Settings of its own are a small frozen config dataclass given as ``config=`` with its
``section``: its keys are ``train.<section>.<key>``, checked against that class, and the update
reads them as ``ctx.cfg.settings(section)``; no ``TrainConfig`` field is added
(tests/assets/toy_settings_algorithm.py). A data-parallel update (``data_parallel_step``) runs on
every rank, which gets the ``Algorithm`` object from rank 0 (so its functions must be importable,
not lambdas).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from flatlm.core.registry import Ref, Registry, check_ref, load_ref
from flatlm.train.algorithm_settings import (  # torch-free, read at parse time
    AdversarialConfig,
    GrowConfig,
    LabelNoiseConfig,
    SamConfig,
)
from flatlm.train.muon_config import MuonConfig  # torch-free, read at parse time

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmDefaults", "REGISTRY", "Ref", "algorithm_named",
           "load_ref", "register_algorithm", "unused_sections"]

OPTIMIZERS = ("adamw", "sgd")


@dataclass(frozen=True, kw_only=True)
class AlgorithmDefaults:
    """What an algorithm changes by default; everything else is shared (see ``algorithms.py``)."""

    optimizer: str  # "adamw" (decoupled weight decay) or "sgd" (no momentum)
    weight_decay: float  # applied to matrices and embeddings, never to biases or LayerNorms
    dropout: float  # the model's dropout during pre-training
    warmup_steps: int | None = None  # linear warmup length in updates ...
    warmup_proportion: float | None = None  # ... or as a fraction of ``steps``
    summary: str = ""

    def __post_init__(self):
        _require(self.optimizer in OPTIMIZERS, f"optimizer={self.optimizer!r}: use one of "
                                               f"{', '.join(OPTIMIZERS)}")
        _require(self.weight_decay >= 0, f"weight_decay={self.weight_decay!r}: use a value >= 0")
        _require(0.0 <= self.dropout < 1.0, f"dropout={self.dropout!r}: use one in [0, 1)")
        _require((self.warmup_steps is None) != (self.warmup_proportion is None),
                 "give exactly one of warmup_steps and warmup_proportion")


@dataclass(frozen=True, kw_only=True)
class Algorithm:
    """One pre-training algorithm: everything the shared loop needs to know about it."""

    name: str  # the value of train.algorithm; an identifier
    defaults: AlgorithmDefaults
    step: Ref  # one update: (StepContext, StepInputs) -> {"train/loss": tensor, ...}
    data_parallel_step: Ref | None = None  # the same update on a rank's slice of the batch,
    #   gradients reduced over the ranks; None: train.world_size must be 1 ...
    one_process_reason: str = "it has no data-parallel update"  # ... and this says why
    section: str | None = None  # where its settings are (train.<section>.*), logged only when
    #   the algorithm runs; None: it has none
    config: type | None = None  # its settings: a frozen dataclass whose defaults are its
    #   section's (``TrainConfig.settings(section)``), the built-ins' as a plug-in's; no
    #   TrainConfig field is added
    batch_transform: Ref | None = None  # (MLMBatch, cfg, n_words, i) -> MLMBatch: update i's
    #   masked batch changed on the CPU, before it is sorted, split or sliced (label noise)
    halves_batch: bool = False  # the update splits each batch into two halves (sam): the batch
    #   size is even, and micro-batches and data-parallel slices are taken of each half
    probe_pool: Ref | None = None  # (cfg, source, device) -> DownstreamPool: labelled sentences
    #   whose D1, D2 each update reads as inputs.probe (adversarial)
    config_check: Ref | None = None  # (TrainConfig) -> None, raising ValueError: checks of its
    #   settings against the run's (grow: every growth inside the run), at construction
    model_check: Ref | None = None  # (TrainConfig, ModelConfig) -> None, raising ValueError:
    #   checks against the model before any work (grow: each shape a growth of the one before)
    packed_step: Ref | None = None  # the same update for K members trained as one model
    #   (flatlm.train.pack, flatlm.train.pack_steps); None: its members train unpacked ...
    unpacked_reason: str = "it has no packed update"  # ... and this says why
    make_optimizer: Ref | None = None  # (TrainConfig, model, *, fused) -> its optimizer: an
    #   object with torch's param_groups, zero_grad, step, state_dict and load_state_dict (muon:
    #   Muon and AdamW as one); None: defaults.optimizer's (adamw or sgd), built by
    #   flatlm.train.algorithms.build_optimizer

    def __post_init__(self):
        _require(isinstance(self.name, str) and self.name.isidentifier(),
                 f"name={self.name!r}: use an identifier such as sign_sgd")
        _require(isinstance(self.defaults, AlgorithmDefaults),
                 f"{self.name}: defaults={self.defaults!r}: use an AlgorithmDefaults")
        _require(self.section is None or self.section.isidentifier(),
                 f"{self.name}: section={self.section!r}: use an identifier, or None")
        _require(self.config is None or (dataclasses.is_dataclass(self.config)
                                         and self.section is not None),
                 f"{self.name}: config={self.config!r}: give a dataclass of its settings and "
                 "the section that holds them (section='...')")
        _require(self.section is None or self.config is not None,
                 f"{self.name}: section={self.section!r} but config=None: give the dataclass "
                 "of its settings (config=...), or section=None if it has none")
        for hook in ("step", "data_parallel_step", "batch_transform", "probe_pool",
                     "config_check", "model_check", "packed_step", "make_optimizer"):
            ref = getattr(self, hook)
            _require((ref is None and hook != "step") or check_ref(ref),
                     f"{self.name}: {hook}={ref!r}: give a function or 'module:name'")

    @property
    def summary(self) -> str:
        return self.defaults.summary

    def update(self) -> Callable:
        """The one-process update."""
        return load_ref(self.step)

    def data_parallel_update(self) -> Callable:
        """The update of one data-parallel rank; a ValueError if there is none."""
        if self.data_parallel_step is None:
            raise ValueError(self.one_process_message())
        return load_ref(self.data_parallel_step)

    def one_process_message(self) -> str:
        return (f"train.algorithm={self.name!r} runs in one process only "
                f"({self.one_process_reason}); use train.world_size=1")

    def packed_update(self) -> Callable:
        """The update of a pack (``flatlm.train.pack``); a ValueError if there is none."""
        if self.packed_step is None:
            raise ValueError(f"train.algorithm={self.name!r} cannot be packed "
                             f"({self.unpacked_reason}); train its trials unpacked")
        return load_ref(self.packed_step)

    def transform(self) -> Callable | None:
        """The batch transform, or None."""
        return None if self.batch_transform is None else load_ref(self.batch_transform)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"algorithm: {message}")


# ------------------------------------------------------------------------------ the registry

REGISTRY: Registry[Algorithm] = Registry(
    "algorithm", key="train.algorithm",
    how_to_add="flatlm.train.registry.register_algorithm in a plug-in module: --plugin MODULE")


def register_algorithm(algorithm: Algorithm, *, replace: bool = False) -> Algorithm:
    """Adds ``algorithm`` under its name (``replace``: over one registered before); returns it."""
    return REGISTRY.add(algorithm, Algorithm, "register_algorithm", replace=replace)


def algorithm_named(name: str) -> Algorithm:
    """The registered algorithm ``name``; a ValueError naming the known ones."""
    return REGISTRY.lookup(name)


def unused_sections(name: str) -> list[str]:
    """The TrainConfig sections of the other algorithms, which ``name`` does not read."""
    own = algorithm_named(name).section
    sections = dict.fromkeys(a.section for a in REGISTRY.values())  # ordered, unique
    return [s for s in sections if s is not None and s != own]


def check_before_training(cfg, model_cfg) -> None:
    """Runs the algorithm's ``model_check`` (``cfg`` a TrainConfig, ``model_cfg`` the model's
    ModelConfig), so that a bad combination fails before any work."""
    hook = algorithm_named(cfg.algorithm).model_check
    if hook is not None:
        load_ref(hook)(cfg, model_cfg)


class RegistryView(Mapping):
    """name -> ``pick(algorithm)`` for every registered algorithm that ``has``; live: an
    algorithm registered later is in it. The hand-kept tables of old are such views."""

    def __init__(self, pick: Callable[[Algorithm], object],
                 has: Callable[[Algorithm], bool] = lambda a: True):
        self._pick, self._has = pick, has

    def __getitem__(self, name: str):
        algorithm = REGISTRY.get(name)
        if algorithm is None or not self._has(algorithm):
            raise KeyError(name)
        return self._pick(algorithm)

    def __iter__(self) -> Iterator[str]:
        return (name for name, a in REGISTRY.items() if self._has(a))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"RegistryView({list(self)})"


ALGORITHMS: Mapping[str, AlgorithmDefaults] = RegistryView(operator.attrgetter("defaults"))


# ------------------------------------------------------------------------------ the built-ins

def _growths_within_run(cfg) -> None:
    """grow: at least one growth, each inside the run (a function, not a lambda: the
    ``Algorithm`` goes to the data-parallel ranks by pickle)."""
    cfg.grow.check_within(cfg.steps)


_STANDARD = "flatlm.train.algorithms:standard_step"
_DATA_PARALLEL = "flatlm.train.distributed:data_parallel_step"
_PACKED = "flatlm.train.pack_steps:packed_standard_step"
_PAPER_ADAMW = {"optimizer": "adamw", "weight_decay": 0.01, "dropout": 0.1,
                "warmup_steps": 1000}  # A.5
_PAPER_SGD = {"optimizer": "sgd", "weight_decay": 0.01, "dropout": 0.1,
              "warmup_proportion": 0.12}  # Section 3, F
_NO_REGULARISER = {"optimizer": "adamw", "weight_decay": 0.0, "dropout": 0.0,
                   "warmup_steps": 1000}


def _standard(name: str, defaults: dict, summary: str) -> Algorithm:
    """An algorithm of the standard step everywhere (one process, data-parallel, packed): one
    that only its defaults (optimizer, regularisers, warmup) tell apart."""
    return Algorithm(name=name, step=_STANDARD, data_parallel_step=_DATA_PARALLEL,
                     packed_step=_PACKED, defaults=AlgorithmDefaults(**defaults, summary=summary))


BUILT_IN = (
    _standard("adamw", _PAPER_ADAMW, "the paper's standard pre-training: AdamW, dropout 0.1, "
              "weight decay 0.01 (A.5)"),
    _standard("sgd", _PAPER_SGD, "mini-batch SGD without momentum, warmup over 12% of the steps "
              "(Section 3, F)"),
    _standard("noreg", _NO_REGULARISER, "AdamW without dropout or weight decay (Tables 1-2, "
              "'-dropout-WD')"),
    Algorithm(name="sam", section="sam", config=SamConfig, halves_batch=True,
              step="flatlm.train.algorithms:sam_step",
              packed_step="flatlm.train.pack_steps:packed_sam_step",
              data_parallel_step="flatlm.train.distributed:data_parallel_sam_step",
              defaults=AlgorithmDefaults(**_NO_REGULARISER, summary=(
                  "SAM around AdamW, no dropout or weight decay; perturbation from the first "
                  "half of the batch, update from the second (Tables 1-2, '+SAM'; A.5)"))),
    Algorithm(name="adversarial", section="adversarial", config=AdversarialConfig,
              step="flatlm.train.algorithms:adversarial_step",
              one_process_reason="its closed-form head is fitted on all of D1 at once",
              packed_step="flatlm.train.pack_steps:packed_adversarial_step",
              probe_pool="flatlm.train.data:adversarial_pool",
              defaults=AlgorithmDefaults(**_PAPER_ADAMW, summary=(
                  "MLM loss minus lambda times the D2 loss of a downstream head fitted in "
                  "closed form on D1 (A.5)"))),
    # the growth itself happens between updates, in any algorithm whose section is grow
    # (flatlm.train.growth.grows); every rank grows alike
    Algorithm(name="grow", section="grow", config=GrowConfig, step=_STANDARD,
              data_parallel_step=_DATA_PARALLEL,
              unpacked_reason="the model's shape changes mid-run; a pack has one shape",
              config_check=_growths_within_run,
              model_check="flatlm.train.growth:check_schedule",
              defaults=AlgorithmDefaults(**_PAPER_ADAMW, summary=(
                  "adamw whose model grows function-preservingly (B.4: width by replication, "
                  "depth by zero-output blocks) at train.grow.steps (flatlm.train.growth)"))),
    # on noisy targets, drawn on the whole batch before a rank takes its slice
    Algorithm(name="label_noise", section="label_noise", config=LabelNoiseConfig,
              step=_STANDARD,
              data_parallel_step=_DATA_PARALLEL, packed_step=_PACKED,
              batch_transform="flatlm.train.label_noise:noisy_batch",
              defaults=AlgorithmDefaults(**_PAPER_SGD, summary=(
                  "sgd (its defaults) whose masked-word targets are each replaced, with "
                  "probability train.label_noise.p, by a uniformly drawn word (Section 3.3; "
                  "flatlm.train.label_noise)"))),
    Algorithm(name="muon", section="muon", config=MuonConfig, step=_STANDARD,
              make_optimizer="flatlm.train.muon:muon_optimizer",
              model_check="flatlm.train.muon:check_model",
              # measured: two ranks' reduced gradient, summed in another order, flips bfloat16
              # roundings in Newton-Schulz: 1e-4 from the one-process weights after one update,
              # 8e-3 after six (the other algorithms: 1e-7)
              one_process_reason="its bfloat16 Newton-Schulz step turns the ranks' float-order "
                                 "differences into weight differences of 1e-3, not the "
                                 "one-process run",
              unpacked_reason="the packed optimizer (flatlm.train.packed_optim) has no Muon",
              defaults=AlgorithmDefaults(**_PAPER_ADAMW, summary=(
                  "Muon (torch.optim.Muon, train.muon.*) on the encoder's hidden matrices, "
                  "AdamW (adamw's defaults) on embeddings, the MLM head, biases and LayerNorms "
                  "(Jordan et al. 2024; flatlm.train.muon)"))),
)
for _algorithm in BUILT_IN:
    register_algorithm(_algorithm)
