"""``TrainConfig``: one pre-training run's algorithm, schedule, batch and checkpoints.

The model shape is a ``ModelConfig`` and the language a source spec; neither is a field here. Fields
left ``None`` take the algorithm's default from ``ALGORITHMS`` (the paper's values, A.5), a view
of the algorithm registry (``flatlm.train.registry``, which also says how to add one);
``resolve(cfg)`` fills them in, and the loop works on the resolved config. Settings of one
algorithm are declared on its registry entry (``Algorithm.config``), the built-ins' as a plug-in
declares its own: sam's ``SamConfig``, adversarial's ``AdversarialConfig``, grow's ``GrowConfig``,
label_noise's ``LabelNoiseConfig`` (``flatlm.train.algorithm_settings``) and muon's
``MuonConfig`` (``flatlm.train.muon_config``). Their keys are ``train.sam.rho``,
``train.adversarial.lambda``, ``train.grow.steps``, ``train.label_noise.p``, ``train.muon.lr``
etc.; a run reads them as ``cfg.sam`` (``cfg.settings("sam")``), and none is a field here.
``flatlm.core.config`` converts to and from dicts (``to_dict``, ``from_dict``).

>>> cfg = resolve(TrainConfig(algorithm="noreg", steps=100))
>>> cfg.weight_decay, cfg.dropout, cfg.warmup_steps
(0.0, 0.0, 1000)
>>> resolve(TrainConfig(algorithm="sgd", steps=1000)).warmup_steps
120
>>> TrainConfig(lr=-1.0)
Traceback (most recent call last):
...
ValueError: train.lr=-1.0: the learning rate must be > 0 (the paper uses 1e-3)
>>> TrainConfig(algorithm="sam", sections={"sam": SamConfig(rho=0.1)}).settings("sam")
SamConfig(rho=0.1)
>>> TrainConfig(algorithm="sam", sections={"sam": SamConfig()}).sections  # at its defaults
()
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from flatlm.core.config import OpenSections, to_dict
from flatlm.core.schedules import SCHEDULES
from flatlm.train.algorithm_settings import (
    AdversarialConfig,
    GrowConfig,
    LabelNoiseConfig,
    SamConfig,
)
from flatlm.train.algorithm_settings import check as _check
from flatlm.train.algorithm_settings import check_finite as _check_finite
from flatlm.train.algorithm_settings import is_int as _is_int
from flatlm.train.registry import (
    ALGORITHMS,
    REGISTRY,
    AlgorithmDefaults,
    algorithm_named,
    load_ref,
)

__all__ = ["ALGORITHMS", "AlgorithmDefaults", "AdversarialConfig", "GrowConfig", "LabelNoiseConfig",
           "PREFETCH_WORKERS", "SEQUENCE_PACKINGS", "SamConfig", "TARGETS", "TrainConfig",
           "resolve", "sequence_packing_for", "switch_on"]

PRECISIONS = ("auto", "fp32", "bf16")
MASK_COUNTS = ("fixed", "bernoulli")  # train.mask_count (flatlm.train.data.mask_batch)
TARGETS = ("sampled", "truth")  # train.targets (flatlm.train.algorithms.masked_targets)
# train.sequence_packing: how a pass's sentences meet the model ("auto": as train.unpad says)
SEQUENCE_PACKINGS = ("auto", "padded", "unpadded", "rows")
PREFETCH_WORKERS = ("threads", "processes")  # train.prefetch_workers (flatlm.train.data)
_SWITCH_WORDS = {"true": True, "on": True, "false": False, "off": False, "auto": "auto"}


def switch_on(value: bool | str, device_type: str) -> bool:
    """Whether a True / False / "auto" switch (``compile``, ``unpad``) is on for a device type
    ("cuda", "cpu"): "auto" is on for CUDA only."""
    return device_type == "cuda" if value == "auto" else bool(value)


def sequence_packing_for(cfg: TrainConfig, device_type: str) -> str:
    """The layout a run uses on a device type: "padded", "unpadded" or "rows" (``"auto"``
    follows ``train.unpad``: unpadded on CUDA, padded on the CPU, what runs before the setting
    existed used)."""
    if cfg.sequence_packing != "auto":
        return cfg.sequence_packing
    return "unpadded" if switch_on(cfg.unpad, device_type) else "padded"


# The flat keys these settings had before they moved into SamConfig / AdversarialConfig.
_RENAMED = {"sam_rho": "sam.rho",
            **{f"adversarial_{k}": f"adversarial.{k}"
               for k in ("lambda", "task", "d1", "d2", "pool", "ridge")}}


# The TrainConfig keys that say when a run's checkpoints are taken and its curve is logged: they
# do not change the model trained (runs.trial.training_identity, analysis/same_training.py)
SCHEDULING_KEYS = ("checkpoint_steps", "log_every")


@dataclass(frozen=True, kw_only=True)
class TrainConfig(OpenSections):
    """One pre-training run. Validated on construction: a bad field raises ``ValueError``."""

    RENAMED_KEYS: ClassVar[dict[str, str]] = _RENAMED  # old key -> new (override errors)
    # the settings of every algorithm registered with its own ``Algorithm.config`` (the
    # built-ins' and a plug-in's alike): keys train.<section>.*, as if each were a field
    # (flatlm.core.config, "Open sections")
    OPEN_SECTIONS: ClassVar[str] = "sections"
    SECTION_KEY: ClassVar[str] = "train"
    SECTION_OWNER: ClassVar[str] = "algorithm"

    algorithm: str = "adamw"  # a registered algorithm (flatlm.train.registry): adamw, sgd,
    #   noreg, sam, adversarial, grow, label_noise, muon (its settings: train.muon.*,
    #   flatlm.train.muon.MuonConfig)
    steps: int = 1000  # optimizer updates in the run; >= 1 (paper: 30K+ for PCFG)
    batch_size: int = 4096  # sentences per update; >= 1 (paper: 4096); sam: even
    micro_batch_size: int | None = None  # sentences per forward/backward (gradient
    #   accumulation); must divide batch_size (sam: batch_size / 2); None = the whole batch
    lr: float = 1e-3  # peak learning rate after warmup (see schedule); > 0 (paper: 1e-3)
    beta1: float = 0.9  # Adam's first-moment decay in [0, 1) (paper: 0.9); unused by sgd
    beta2: float = 0.98  # Adam's second-moment decay in [0, 1) (paper: 0.98); unused by sgd
    eps: float = 1e-6  # Adam's denominator epsilon; > 0 (paper: 1e-6)
    weight_decay: float | None = None  # >= 0; None = the algorithm's default (0.01 or 0)
    dropout: float | None = None  # model dropout in [0, 1); None = the algorithm's (0.1 or 0);
    #   overrides ModelConfig.dropout
    warmup_steps: int | None = None  # linear warmup length in updates, >= 0 ...
    warmup_proportion: float | None = None  # ... or as a fraction of steps in [0, 1]; set at
    #   most one; both None = the algorithm's default (1000 steps; sgd 12%)
    mask: str | float = "one"  # "one": one masked word per sentence, uniform over its words
    #   (the paper's formulation, Section 2 and its footnote 1); or a rate in (0, 1), drawn as
    #   mask_count says (0.15: the released code, and the paper on real text, A.2)
    mask_count: str = "fixed"  # at a rate, how many words of a sentence are masked: "fixed":
    #   exactly max(1, round(rate * (words + 2))) (the +2 counts [CLS] and [SEP]; Python's
    #   round), a uniformly random subset of its words, at most max_predictions: BERT's rule, as
    #   the released create_pretraining_data.py draws it (create_masked_lm_predictions); or
    #   "bernoulli": each word independently with that probability (some sentences get none)
    mask_replace: tuple[float, float, float] = (0.8, 0.1, 0.1)  # what a masked word's input
    #   becomes: [MASK], a random word, itself (BERT's rule, the released code); (1, 0, 0) =
    #   always [MASK]. Each >= 0, summing to 1
    max_predictions: int | None = None  # at a rate: at most this many masked words per
    #   sentence (the released code: 5); None = no cap. >= 1
    targets: str = "sampled"  # what each masked word's cross-entropy is taken against:
    #   "sampled", the word the sentence holds (one-hot; the paper's); or "truth", the source's
    #   true conditional Pr(. | x_{-t}) of that word given the others (soft targets: the
    #   expectation of the one-hot target given x_{-t}, the loss H + KL of flatlm.measure.loss);
    #   "truth" needs a source with exact conditionals, and no rows layout, pack or label noise
    schedule: str = "constant"  # after warmup: "constant" (the paper: checkpoints comparable,
    #   training continuable) or "linear" decay to 0 at ``steps`` (the released code's "time")
    data: str = "fresh"  # "fresh": new sentences from the source at every step (population
    #   loss); or a corpus directory written by `flatlm data` (its train split, reshuffled
    #   every epoch)
    sections: tuple[tuple[str, Any], ...] = ()  # (section, settings) of the algorithms whose
    #   settings differ from their defaults (train.<section>.<key>: train.sam.rho, a plug-in's),
    #   sorted by section; a mapping is accepted. A section at its defaults is not stored, so
    #   configs that say the same compare equal; ``settings(section)`` reads either
    checkpoint_steps: tuple[int, ...] = ()  # updates after which to save (0 = the initial
    #   model); each in 0..steps; stored sorted and unique
    seed: int = 0  # initialisation, data order, masking and dropout all derive from it
    log_every: int = 10  # updates between loss read-outs (each costs one host sync); >= 1
    precision: str = "auto"  # "auto" (bf16 autocast on CUDA, fp32 on CPU), "fp32" or "bf16"
    compile: bool | str = "auto"  # torch.compile the forward and loss: True, False or "auto"
    #   (on for CUDA, off on the CPU); a compile failure falls back to eager with one warning
    unpad: bool | str = "auto"  # sort each pass's sentences by length into its micro-batches
    #   and cut each micro-batch to its longest sentence: the same update up to the order of
    #   float sums (and which dropout draw meets which word), without computing on padding.
    #   True, False or "auto" (on for CUDA; off on the CPU, which keeps CPU runs bit for bit).
    #   It removes padding only between micro-batches: with micro_batch_size None (one pass
    #   per batch) the one micro-batch is cut to the batch's longest sentence; the GPU scale
    #   sets micro_batch_size=1024 of 4096. Read only when sequence_packing is "auto"
    sequence_packing: str = "auto"  # how each pass's sentences meet the model: "padded" (one
    #   sentence a row of the source's T + 2 positions), "unpadded" (train.unpad=true), "rows"
    #   (sentences end to end in rows of row_length slots, block-diagonal attention, position
    #   ids restarting per sentence, the head only at masked words, static shapes; BERT only,
    #   world_size 1: flatlm.train.rows), or "auto" (as train.unpad says: padded on the CPU,
    #   unpadded on CUDA, the default, so that earlier runs rerun bit for bit). Not the trial
    #   packs of flatlm.train.pack
    row_length: int = 64  # slots per row under sequence_packing="rows"; >= the source's
    #   max_length + 2 (checked when training starts); 64 holds 3 to 21 PCFG sentences
    prefetch: int | str = "auto"  # updates whose batches are built ahead, in background
    #   workers, while the current update runs: an integer >= 0 (0: each batch is built when its
    #   update starts), or "auto" (0 on the CPU, whose cores train; on CUDA min(4, host cores /
    #   2): a 4096-sentence batch of the paper's grammar takes ~0.1 s of a core to sample and
    #   mask, longer than a small model's GPU update). Batches are the same either way: each is
    #   a pure function of (seed, update), so a run is bit for bit the same at any depth
    prefetch_workers: str = "threads"  # where batches are built ahead: "threads" (in this
    #   process; sampling and masking release the GIL only in torch's kernels) or "processes"
    #   (one spawned process per batch ahead, each with one torch thread: no GIL shared with the
    #   training loop, a few seconds to start). Read only when prefetch resolves to > 0
    divergence_factor: float | None = 10.0  # stop the run (``Diverged``) when a logged loss
    #   exceeds this times the initial loss log V or the first logged loss; > 1; None = off
    #   (a non-finite loss always stops it)
    world_size: int = 1  # data-parallel processes, each taking an equal slice of every batch
    #   (one GPU each on CUDA, gloo processes on the CPU; flatlm.train.distributed); >= 1,
    #   dividing batch_size (sam: each half); adversarial runs in one process only

    @classmethod
    def section_class(cls, name: str) -> type | None:
        """The settings class of a registered algorithm's own section ``name`` (not a field)."""
        return next((a.config for a in REGISTRY.values()
                     if a.section == name and a.config is not None), None)

    @classmethod
    def open_section_names(cls) -> list[str]:
        return [a.section for a in REGISTRY.values() if a.config is not None]

    def own_settings(self) -> dict:
        """The run's algorithm's own settings as a saved config spells them, defaults included
        (``{"sam": {"rho": 0.05}}``; {} for an algorithm without any): what a stored config
        leaves out when they are at their defaults, and the logged params, the training's
        identity and a resume's check still read."""
        section = algorithm_named(self.algorithm).section
        return {} if section is None else {section: to_dict(self.settings(section))}

    @property
    def sentences_per_pass(self) -> int:
        """Sentences in one forward/backward pass before micro-batching: the batch, or each of
        sam's two halves (``Algorithm.halves_batch``)."""
        halves = algorithm_named(self.algorithm).halves_batch
        return self.batch_size // 2 if halves else self.batch_size

    @property
    def _pass_name(self) -> str:
        """What one pass is, for the messages: the batch, or half of it."""
        halves = algorithm_named(self.algorithm).halves_batch
        return f"half the {self.algorithm} batch" if halves else "batch_size"

    def followers(self, changed: dict) -> dict:
        """Fields that follow an override that did not give them (``apply_overrides``): when
        ``steps`` changes and a checkpoint would lie outside the new run, every checkpoint
        keeps its place as a fraction of the run (step 0 stays 0, the last lands on the new
        end), so ``--set train.steps=200`` alone works with a scale's checkpoints. Checkpoints
        that all fit the new run are kept as they are."""
        steps = changed.get("steps")
        if steps is None or "checkpoint_steps" in changed or not _is_int(steps) or steps < 1:
            return {}
        if all(s <= steps for s in self.checkpoint_steps):
            return {}
        scaled = {min(steps, round(s * steps / self.steps)) for s in self.checkpoint_steps}
        return {"checkpoint_steps": tuple(sorted(scaled))}

    def __post_init__(self):
        _check_finite(self, "")  # inf passes "> 0"; nan fails every check with a wrong message
        _check(self.algorithm in ALGORITHMS, "algorithm", self.algorithm,
               f"use one of {', '.join(ALGORITHMS)}")
        _check(_is_int(self.steps) and self.steps >= 1, "steps", self.steps,
               "use an integer >= 1")
        _check(_is_int(self.batch_size) and self.batch_size >= 1, "batch_size", self.batch_size,
               "use an integer >= 1")
        if algorithm_named(self.algorithm).halves_batch:
            _check(self.batch_size % 2 == 0 and self.batch_size >= 2, "batch_size",
                   self.batch_size,
                   f"{self.algorithm} splits the batch in two halves; use an even size")
        per_pass = self.sentences_per_pass
        if self.micro_batch_size is not None:
            _check(_is_int(self.micro_batch_size) and self.micro_batch_size >= 1
                   and per_pass % self.micro_batch_size == 0, "micro_batch_size",
                   self.micro_batch_size, f"use a divisor of {per_pass} ({self._pass_name})")
        _check(self.lr > 0, "lr", self.lr, "the learning rate must be > 0 (the paper uses 1e-3)")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            _check(0.0 <= value < 1.0, name, value, "use a decay rate in [0, 1)")
        _check(self.eps > 0, "eps", self.eps, "use a value > 0 (the paper uses 1e-6)")
        _check(self.weight_decay is None or self.weight_decay >= 0, "weight_decay",
               self.weight_decay, "use a value >= 0, or None for the algorithm's default")
        _check(self.dropout is None or 0.0 <= self.dropout < 1.0, "dropout", self.dropout,
               "use a probability in [0, 1), or None for the algorithm's default")
        _check(self.warmup_steps is None or self.warmup_proportion is None, "warmup_steps",
               self.warmup_steps, "set warmup_steps or warmup_proportion, not both")
        _check(self.warmup_steps is None or (_is_int(self.warmup_steps)
                                             and self.warmup_steps >= 0),
               "warmup_steps", self.warmup_steps, "use an integer >= 0")
        _check(self.warmup_proportion is None or 0.0 <= self.warmup_proportion <= 1.0,
               "warmup_proportion", self.warmup_proportion, "use a fraction in [0, 1]")
        mask = _number(self.mask) if self.mask != "one" else "one"  # "0.15" from an override
        _check(mask == "one" or (isinstance(mask, float) and 0.0 < mask < 1.0),
               "mask", self.mask, "use 'one' or a masking rate in (0, 1) such as 0.15")
        object.__setattr__(self, "mask", mask)
        _check(self.mask_count in MASK_COUNTS, "mask_count", self.mask_count,
               f"use one of {', '.join(MASK_COUNTS)}")
        self._check_targets()
        replace = tuple(self.mask_replace)
        _check(len(replace) == 3 and all(p >= 0 for p in replace)
               and abs(sum(replace) - 1.0) < 1e-9, "mask_replace", self.mask_replace,
               "use three probabilities ([MASK], random word, unchanged) summing to 1, e.g. "
               "0.8,0.1,0.1")
        object.__setattr__(self, "mask_replace", tuple(float(p) for p in replace))
        _check(self.max_predictions is None or (_is_int(self.max_predictions)
                                                and self.max_predictions >= 1),
               "max_predictions", self.max_predictions, "use an integer >= 1, or None")
        _check(self.schedule in SCHEDULES, "schedule", self.schedule,
               f"use one of {', '.join(SCHEDULES)}")
        _check(isinstance(self.data, str) and self.data.strip() != "", "data", self.data,
               "use 'fresh' or the path of a corpus directory")
        self._check_sections()
        steps = tuple(self.checkpoint_steps)
        _check(all(_is_int(s) for s in steps), "checkpoint_steps", self.checkpoint_steps,
               "use integers")
        bad = [s for s in steps if not 0 <= s <= self.steps]
        _check(not bad, "checkpoint_steps", self.checkpoint_steps,
               f"step(s) {bad} lie outside the run; use steps in 0..{self.steps} (train.steps)")
        object.__setattr__(self, "checkpoint_steps", tuple(sorted(set(steps))))
        _check(_is_int(self.seed), "seed", self.seed, "use an integer")
        _check(_is_int(self.log_every) and self.log_every >= 1, "log_every", self.log_every,
               "use an integer >= 1")
        _check(self.precision in PRECISIONS, "precision", self.precision,
               f"use one of {PRECISIONS}")
        for name in ("compile", "unpad"):
            value = getattr(self, name)
            flag = _SWITCH_WORDS.get(str(value).lower(), value)  # "true" from a command line
            _check(flag is True or flag is False or flag == "auto", name, value,
                   "use true, false or auto (on for CUDA, off on the CPU)")
            object.__setattr__(self, name, flag)
        self._check_sequence_packing()
        self._check_prefetch()
        _check(self.divergence_factor is None or self.divergence_factor > 1,
               "divergence_factor", self.divergence_factor, "use a factor > 1, or None (off)")
        self._check_world_size()

    def _check_sequence_packing(self) -> None:
        _check(self.sequence_packing in SEQUENCE_PACKINGS, "sequence_packing",
               self.sequence_packing, f"use one of {', '.join(SEQUENCE_PACKINGS)}")
        _check(self.sequence_packing == "auto" or self.unpad == "auto", "unpad", self.unpad,
               f"train.sequence_packing={self.sequence_packing!r} says the layout; leave "
               "train.unpad at auto (sequence_packing 'unpadded' is unpad=true, 'padded' is "
               "unpad=false)")
        _check(_is_int(self.row_length) and self.row_length >= 3, "row_length", self.row_length,
               "use an integer >= 3 (>= the source's max_length + 2)")
        _check(self.sequence_packing != "rows" or self.world_size == 1, "sequence_packing",
               self.sequence_packing, "rows run in one process; use train.world_size=1, or "
               "'unpadded' data-parallel")

    def _check_targets(self) -> None:
        _check(self.targets in TARGETS, "targets", self.targets,
               f"use one of {', '.join(TARGETS)}")
        if self.targets == "sampled":
            return
        _check(self.sequence_packing != "rows", "targets", self.targets,
               "the rows layout (train.sequence_packing='rows') carries no soft targets; use "
               "'padded', 'unpadded' or 'auto', or train.targets=sampled")
        _check(algorithm_named(self.algorithm).batch_transform is None, "targets", self.targets,
               f"{self.algorithm} changes the sampled targets (its batch transform), which "
               "train.targets='truth' replaces; use train.targets=sampled")

    def _check_prefetch(self) -> None:
        prefetch = self.prefetch
        if isinstance(prefetch, str) and prefetch.strip().lstrip("-").isdigit():
            prefetch = int(prefetch)  # "2" from a command line
        _check(prefetch == "auto" or (_is_int(prefetch) and prefetch >= 0), "prefetch",
               self.prefetch, "use an integer >= 0 (batches built ahead; 0 = none) or auto "
               "(none on the CPU, up to 4 on CUDA)")
        object.__setattr__(self, "prefetch", prefetch)
        _check(self.prefetch_workers in PREFETCH_WORKERS, "prefetch_workers",
               self.prefetch_workers, f"use one of {', '.join(PREFETCH_WORKERS)}")

    def _check_world_size(self) -> None:
        _check(_is_int(self.world_size) and self.world_size >= 1, "world_size", self.world_size,
               "use an integer >= 1 (processes, one GPU each)")
        if self.world_size == 1:
            return
        algorithm = algorithm_named(self.algorithm)
        _check(algorithm.data_parallel_step is not None, "world_size", self.world_size,
               algorithm.one_process_message())
        per_pass = self.sentences_per_pass
        halves = f" / 2 under {self.algorithm}" if algorithm.halves_batch else ""
        _check(per_pass % self.world_size == 0, "world_size", self.world_size,
               f"each process takes an equal slice of the {per_pass} sentences of a pass "
               f"(train.batch_size{halves}); use a world size dividing it, or change "
               "train.batch_size")

    def _check_sections(self) -> None:
        """Each section given is a registered algorithm's, of its class; those at their defaults
        are dropped (one stored form per run). The algorithm's own settings pass its
        ``config_check`` (grow: every growth inside the run)."""
        self._store_sections()
        algorithm = algorithm_named(self.algorithm)
        if algorithm.config_check is not None:
            load_ref(algorithm.config_check)(self)


def _number(x):
    """``x`` as a float if it is a number or a string of one, else ``x`` unchanged."""
    if isinstance(x, bool):
        return x
    try:
        return float(x)
    except (TypeError, ValueError):
        return x


def resolve(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with the algorithm's defaults filled in and the warmup as a number of steps."""
    d = ALGORITHMS[cfg.algorithm]
    if cfg.warmup_steps is not None:
        warmup = cfg.warmup_steps
    elif cfg.warmup_proportion is not None:
        warmup = round(cfg.warmup_proportion * cfg.steps)
    elif d.warmup_proportion is not None:
        warmup = round(d.warmup_proportion * cfg.steps)
    else:
        warmup = d.warmup_steps
    return dataclasses.replace(
        cfg,
        weight_decay=d.weight_decay if cfg.weight_decay is None else cfg.weight_decay,
        dropout=d.dropout if cfg.dropout is None else cfg.dropout,
        warmup_steps=warmup,
        warmup_proportion=None,
    )
