"""The one parser of numeric command-line flags (``--minutes``, ``--jobs``, ``--pack``,
``--n-boot`` ...), for the ``flatlm`` commands, the sweep scripts and the analysis scripts alike:
argparse's ``type``, so that a value that is not a number, is not finite (``nan``, ``inf``,
``1e1000``) or lies out of range is refused before any work. argparse names the flag
(``error: argument --minutes: ...``); the message says what to give instead.

>>> minutes = number_flag(float, above=0)
>>> minutes("1.5")
1.5
>>> minutes("nan")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: 'nan' is not finite: give a number > 0
>>> number_flag(int, at_least=1)("2.5")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: '2.5' is not a whole number: give a whole number >= 1
>>> number_flag(int, at_least=1, at_most=65535)("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: 0 is out of range: give a whole number from 1 to 65535
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def number_flag(kind: type = float, *, above: float | None = None,
                at_least: float | None = None, at_most: float | None = None,
                hint: str = "") -> Callable[[str], int | float]:
    """The ``type=`` of a numeric flag: ``kind`` (``int`` for a whole number, ``float``), finite,
    ``> above``, ``>= at_least`` and ``<= at_most`` where given. ``hint``: what the value means,
    added to the message (``"0: no check"``)."""
    wanted = _wanted(kind, above, at_least, at_most) + (f" ({hint})" if hint else "")

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}: give {wanted}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not finite: give {wanted}")
        if ((above is not None and value <= above) or (at_least is not None and value < at_least)
                or (at_most is not None and value > at_most)):
            raise argparse.ArgumentTypeError(f"{value!r} is out of range: give {wanted}")
        return value

    parse.__name__ = kind.__name__  # argparse's own messages name the type
    return parse


def _wanted(kind: type, above, at_least, at_most) -> str:
    """What a flag takes, in words: ``a whole number >= 1``, ``a number from 0 to 1``."""
    noun = "a whole number" if kind is int else "a number"
    if at_least is not None and at_most is not None:
        return f"{noun} from {at_least:g} to {at_most:g}"
    bounds = [f"> {above:g}" if above is not None else "",
              f">= {at_least:g}" if at_least is not None else "",
              f"<= {at_most:g}" if at_most is not None else ""]
    return " ".join([noun, *(b for b in bounds if b)]) if any(bounds) else f"a finite {noun[2:]}"


COUNT = number_flag(int, at_least=1)  # how many (sentences, resamples, workers): at least one
SEED = number_flag(int, at_least=0)  # a seed: numpy's generators take no negative one
POSITIVE = number_flag(float, above=0)  # a KL threshold, a budget in minutes, a factor
NON_NEGATIVE = number_flag(float, at_least=0)  # a tolerance
