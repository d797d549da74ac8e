"""The built-in algorithms' own settings, torch-free: ``train.sam.*``, ``train.adversarial.*``,
``train.grow.*`` and ``train.label_noise.*``. Each is declared on its ``Algorithm`` as
``config=`` with its ``section`` (``flatlm.train.registry``), as a plug-in declares its own
(muon's: ``flatlm.train.muon_config``); no ``TrainConfig`` field holds them. A run reads them as
``cfg.sam`` (or ``cfg.settings("sam")``); keys, flags and saved dicts spell them as before
(``train.sam.rho``).

>>> SamConfig(rho=0.0)
Traceback (most recent call last):
...
ValueError: train.sam.rho=0.0: use a radius > 0 (paper: 0.05)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from flatlm.models.constructions import check_construction

__all__ = ["AdversarialConfig", "GrowConfig", "LabelNoiseConfig", "SamConfig", "check",
           "check_finite", "is_int"]


@dataclass(frozen=True, kw_only=True)
class SamConfig:
    """SAM's settings (``algorithm="sam"``); the batch is split in two halves (A.5)."""

    rho: float = 0.05  # perturbation radius in parameter L2 norm; > 0 (paper: 0.05)

    def __post_init__(self):
        check_finite(self, "sam.")
        check(self.rho > 0, "sam.rho", self.rho, "use a radius > 0 (paper: 0.05)")


@dataclass(frozen=True, kw_only=True)
class AdversarialConfig:
    """The adversarial objective's settings (``algorithm="adversarial"``, A.5)."""

    lambda_: float = 1.0  # weight of the head's D2 loss; >= 0 (key: adversarial.lambda)
    task: str | None = None  # downstream task of the source (e.g. "C"); None = its first task
    d1: int = 256  # sentences the head is fitted on per step; >= 2
    d2: int = 256  # sentences the head's loss is taken on; >= 1
    pool: int = 4096  # labelled sentences D, drawn once, from which disjoint D1 and D2 are
    #   drawn each step; >= d1 + d2
    ridge: float = 1e-3  # ridge of the closed-form head, relative to the mean squared feature
    #   norm; > 0

    def __post_init__(self):
        check_finite(self, "adversarial.")
        check(self.lambda_ >= 0, "adversarial.lambda", self.lambda_, "use a weight >= 0")
        check(is_int(self.d1) and self.d1 >= 2, "adversarial.d1", self.d1,
               "use an integer >= 2")
        check(is_int(self.d2) and self.d2 >= 1, "adversarial.d2", self.d2,
               "use an integer >= 1")
        check(is_int(self.pool) and self.pool >= self.d1 + self.d2, "adversarial.pool",
               self.pool, f"use at least adversarial.d1 + adversarial.d2 = "
               f"{self.d1 + self.d2} sentences")
        check(self.ridge > 0, "adversarial.ridge", self.ridge, "use a value > 0")


@dataclass(frozen=True, kw_only=True)
class GrowConfig:
    """Growth's schedule (``algorithm="grow"``): after ``steps[j]`` updates the model becomes its
    function-preserving embedding (``flatlm.models.growth.grow``) into the shape ``to[j]``.

    Each shape must be a growth of the one before it (the first: of the run's model), which
    ``flatlm.train.growth.check_schedule`` checks against the model before any work.
    """

    steps: tuple[int, ...] = ()  # updates after which to grow; strictly increasing, each in
    #   1..train.steps - 1
    to: tuple[str, ...] = ()  # the shape after each growth (d64-h2-l2-i256, a preset), one per
    #   step
    # flatlm.models.constructions.CONSTRUCTIONS. Not the paper's (measure.growth_construction): the
    # paper never trains a grown model, and its all-zero added blocks would not train (with zero
    # query, key, value and up-projection only their output biases get a gradient);
    # "head-norm" initialises those afresh (flatlm.train.growth)
    construction: str = "head-norm"

    def __post_init__(self):
        check_construction(self.construction, "train.grow.construction")
        check(all(is_int(s) for s in self.steps), "grow.steps", self.steps, "use integers")
        check(list(self.steps) == sorted(set(self.steps)), "grow.steps", self.steps,
               "use strictly increasing steps, one growth each")
        check(len(self.to) == len(self.steps), "grow.to", self.to,
               f"give one shape per growth step ({len(self.steps)} in train.grow.steps)")
        check(all(isinstance(t, str) and t.strip() for t in self.to), "grow.to", self.to,
               "use model shapes or presets such as d64-h2-l2-i256")

    def check_within(self, steps: int) -> None:
        """At least one growth, each inside a run of ``steps`` updates (algorithm "grow"; its
        shapes are checked against the model at train())."""
        check(bool(self.steps), "grow.steps", self.steps,
               "algorithm 'grow' needs at least one growth, e.g. train.grow.steps=500 "
               "train.grow.to=d64-h2-l2-i256")
        bad = [s for s in self.steps if not 1 <= s < steps]
        check(not bad, "grow.steps", self.steps,
               f"step(s) {bad} lie outside the run; grow after 1..{steps - 1} updates "
               "(train.steps)")


@dataclass(frozen=True, kw_only=True)
class LabelNoiseConfig:
    """Label-noise SGD's setting (``algorithm="label_noise"``, Section 3.3)."""

    p: float = 0.1  # probability that a masked word's target is replaced by a word drawn
    #   uniformly from the vocabulary (possibly itself); in [0, 1]

    def __post_init__(self):
        check_finite(self, "label_noise.")
        check(0.0 <= self.p <= 1.0, "label_noise.p", self.p, "use a probability in [0, 1]")



def check_finite(cfg, prefix: str) -> None:
    """Every float field of ``cfg`` (and each float in a tuple field) is finite."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        items = value if isinstance(value, tuple) else (value,)
        if any(isinstance(x, float) and not math.isfinite(x) for x in items):
            name = prefix + f.name.rstrip("_")  # lambda_ is adversarial.lambda
            check(False, name, value, "use a finite number")


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check(ok: bool, field: str, value, fix: str) -> None:
    """A ``ValueError`` naming ``train.<field>``, its value and the fix, unless ``ok``."""
    if not ok:
        raise ValueError(f"train.{field}={value!r}: {fix}")
