"""A toy measurement written as a user would add one: this file, imported before the config is
built, and nothing else (no edit of ``MeasureConfig``, nor of the analysis layer's tables).

"param_norm": the global L^p norm of the model's parameters at each checkpoint, as
``toy/param_norm``; it needs no truth. Its one setting, the order ``p``, is its own section:
its ``Measurement.config`` with ``section="param_norm"``, set as
``--set measure.param_norm.p=1`` and read by the run as ``cfg.settings("param_norm")``.
"""

from dataclasses import dataclass

from flatlm.measure.registry import Measurement, Quantity, register_measurement

PARAM_NORM = "toy/param_norm"


@dataclass(frozen=True, kw_only=True)
class ParamNormConfig:
    p: float = 2.0  # the norm's order; >= 1 (2: the Euclidean norm)

    def __post_init__(self):
        if not self.p >= 1:
            raise ValueError(f"measure.param_norm.p={self.p!r}: use an order >= 1")


def param_norm(model, source, data, cfg, device, artifact_dir) -> dict[str, float]:
    p = cfg.settings("param_norm").p
    powers = sum(w.detach().double().abs().pow(p).sum() for w in model.parameters())
    return {PARAM_NORM: float(powers ** (1 / p))}


# what the analysis layer reads: its name in figures and tables, and a place on the leaderboard
# (analysis.leaderboard ranks it with the built-in selectors, its cost from time/param_norm_s)
NORM = Quantity(key=PARAM_NORM, label="parameter norm", leaderboard=True)

register_measurement(Measurement(name="param_norm", run=param_norm, keys=(PARAM_NORM,),
                                 config=ParamNormConfig, section="param_norm", quantities=(NORM,)))
