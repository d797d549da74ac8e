"""The names of the growth constructions (``flatlm.models.growth``, paper B.4), in a module light
enough for config checks and command-line choices (growth itself imports transformers).
"""

from __future__ import annotations

# name -> what it does (flatlm.models.growth says how); "paper" is the default but for train.grow
CONSTRUCTIONS = {
    "paper": "B.4.2 / enlarge.py: input embeddings (and the tied decoder) tiled / m, LayerNorms "
             "tiled, added blocks zero (post-LN: their LayerNorms exact as in head-norm)",
    "head-norm": "flatlm's earlier: embeddings tiled unscaled, the MLM head's LayerNorm / m, "
                 "added blocks' query, key, value, MLP up-projection freshly initialised",
}
DEFAULT_CONSTRUCTION = "paper"


def check_construction(construction: str, field: str = "construction") -> str:
    """``construction`` if it names one of ``CONSTRUCTIONS``, else a ValueError naming ``field``.

    >>> check_construction("flatlm", "measure.growth_construction")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: measure.growth_construction='flatlm': use one of 'paper' (B.4.2 / ...), ...
    """
    if construction not in CONSTRUCTIONS:
        known = ", ".join(f"{name!r} ({text.split(':')[0]}: ...)"
                          for name, text in CONSTRUCTIONS.items())
        raise ValueError(f"{field}={construction!r}: use one of {known}")
    return construction
