"""Source languages with exact masked-LM conditionals: ``load(spec)`` builds one.

A spec is a dict with a ``kind`` and that kind's fields, a JSON object string, or a short form
``KIND:VALUE`` / ``KIND:key=value,key=value`` (dotted keys nest)::

    load("pcfg:paper")                       # the paper's grammar, shipped with flatlm
    load("pcfg:path/to/rules.txt")           # a grammar file in the paper's format
    load("pcfg:seed=3,random.vocab=20")      # a random layered grammar
    load("hmm:seed=0")                       # a random block-diagonal HMM
    load("hmm:path/to/hmm.npz")              # arrays initial, transition, emission
    load("dyck:length=8")                    # or "dyck:8"
    load("lm:facebook/opt-125m")             # OPT text, top-2000 tokens, T = 24 (A.1)
    load("text:corpus/,tokenizer=bert-large-uncased,glue=glue/")  # real text + GLUE, no truth
    load(SourceSpec("hmm:seed=0"))           # a spec checked on construction (sources.spec)

>>> src = load("dyck:4")
>>> src.spec
{'kind': 'dyck', 'length': 4}
"""

from __future__ import annotations

from flatlm.sources.base import PAD, Source, SourceError
from flatlm.sources.spec import SourceSpec, parse_spec, register_source, source_class

__all__ = ["PAD", "Source", "SourceError", "SourceSpec", "load", "parse_spec", "register_source"]


def load(spec: str | dict | SourceSpec) -> Source:
    """Builds the source a spec describes (see the module docstring for the forms)."""
    spec = parse_spec(spec)
    return source_class(spec["kind"]).from_spec(spec)
