"""The PCFG source: sentences from a grammar, their exact conditionals and parse-tree labels.

Spec fields (``flatlm.sources.load``):

- ``grammar``: ``"paper"`` (the paper's grammar, shipped with flatlm) or a path to a rule file;
  or ``random``: a dict of ``RandomGrammarConfig`` knobs with ``seed`` (an int).
- ``max_length``: the paper's length filter (default 32): longer sentences are rejected when
  sampling. Sentences are padded to T = min(max_length, the grammar's longest sentence); the
  paper's grammar never yields more than 16 words, so its T is 16.
- ``spans``: the downstream tasks other than A, task name -> span length L, or a rule naming them:
  ``"released"`` (the default: ``{"B": 4, "C": 2}``, the released code's ``labeling()`` in
  pcfg/generate_downstream.py) or ``"depth"`` (the paper's text, A.1; see below).
- ``label_rule``: the default downstream label rule, ``"posterior"`` (default), ``"span"`` or
  ``"inside"``; see below.
- ``downstream_min_length``: downstream sentences have at least this many words (the released code
  keeps 5..31); default 5, or the grammar's longest sentence if that is shorter; with spans
  ``"depth"``, at least the longest span (so every sentence has every task's label).
- ``strict``: make an unreachable symbol an error (default false: reported and kept, since the
  paper's grammar has one, A1_9).

Downstream tasks label the nonterminal over the span of the first L words: task A the whole
sentence (root symbols only), B and C the first ``spans[task]`` words. Three rules:

- ``"posterior"`` (default): argmax over A of Pr(A spans [0, L) | x) in a random parse of the whole
  sentence x, plus an explicit "no constituent" class N with probability
  1 - sum_A Pr(A spans [0, L) | x).
- ``"span"`` (the paper's text, A.1: y = argmax_s Pr(s | x_1..x_L)): conditioned on the span's words
  only, the rest of the sentence summed out: Pr(A spans [0, L), x_1..x_L) =
  LC(A) inside(A, [0, L)), where LC(A) = expected number of times A sits on the left spine of a
  tree (LC = root + P_L^T LC, P_L[B, A] = sum_C Pr(B -> A C)). Class N when no nonterminal derives
  the span. Exact for the language without the length filter (the paper's grammar never reaches
  it).
- ``"inside"`` (the paper's released code): argmax_A inside(A, [0, L)) = argmax_A
  Pr(A =>* x_1..x_L), with no prior over A and whether or not A can sit over that span in a parse
  of the whole sentence. Class N when no nonterminal derives the span.

For task A, "posterior" and "span" coincide (the span is the sentence).

Spans by parse depth (``spans="depth"``, the paper's text, A.1): "the sentence length is limited to
32, which means the depth of the parse tree is limited to 6 ... Tasks A, B and C are defined on the
symbols corresponding to span length L = 32, 16 and 8". Task A, B, C classifies the symbol at
depth 1 (the root), 2, 3 of the parse tree; in a binary tree over the grammar's longest sentence
of T words, a symbol at depth k spans T / 2^(k-1) words, so A spans the whole sentence, B the first
T // 2 words and C the first T // 4. On the paper's depth-6 grammar (T = 32) that is L = 32 / 16 /
8; on the released grammar (T = 16) 16 / 8 / 4; on a grammar of 8-word sentences 8 / 4 / 2. The
released code's spans (B = 4, C = 2 on its T = 16 grammar) are depths 3 and 4.

Labels are nonterminal ids (root symbols come first, so task A's labels are 0..roots-1); a
sentence shorter than L gets -1.
"""

from __future__ import annotations

import math
from functools import cached_property
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from flatlm.core.seeds import derive_seed
from flatlm.sources.base import Source, SourceError, as_tokens, padding_mask
from flatlm.sources.grammar import (
    Grammar,
    RandomGrammarConfig,
    parse_grammar,
    random_grammar_lines,
)
from flatlm.sources.inside_outside import (
    Plan,
    inside,
    outside,
    sentence_logprob,
    word_conditionals,
)
from flatlm.sources.inside_outside_fused import (
    FusedPlan,
    conditionals_fused,
    inside_fused,
    outside_fused,
)
from flatlm.sources.pcfg_marginals import covering_posteriors
from flatlm.sources.pcfg_sampler import RuleTable, sample_sentences

LABEL_RULES = ("posterior", "span", "inside")
RELEASED_SPANS = {"B": 4, "C": 2}  # pcfg/generate_downstream.py labeling(): inside_partial 4 / 2
SPAN_RULES = ("released", "depth")  # the spec's spans, when not a dict (module docstring)
DEPTH_TASKS = ("B", "C")  # depths 2 and 3; task A is depth 1, the whole sentence


def depth_spans(longest: int) -> dict[str, int]:
    """The paper's spans (A.1) on a grammar whose longest sentence has ``longest`` words: task
    B, C over the first words a symbol at depth 2, 3 spans in a binary tree over it.

    >>> depth_spans(32), depth_spans(16), depth_spans(8)
    ({'B': 16, 'C': 8}, {'B': 8, 'C': 4}, {'B': 4, 'C': 2})
    """
    return {task: max(1, longest // 2 ** (k + 1)) for k, task in enumerate(DEPTH_TASKS)}
_FIELDS = {"kind", "grammar", "random", "seed", "max_length", "spans", "label_rule", "strict",
           "downstream_min_length"}
DOWNSTREAM_MIN_LENGTH = 5  # the released code keeps downstream sentences of 5..31 words


def paper_grammar_path() -> Path:
    """The paper's grammar file as shipped inside the package."""
    return Path(str(resources.files("flatlm.sources") / "data" / "paper.txt"))


def _grammar_from_spec(spec: dict) -> Grammar:
    if "grammar" in spec and "random" in spec:
        raise SourceError("pcfg spec has both 'grammar' and 'random': name a grammar "
                          "(pcfg:paper, pcfg:path/to/rules.txt) or ask for a random one "
                          "(pcfg:seed=3,random.vocab=50), not both")
    if "grammar" not in spec and "random" not in spec:
        raise SourceError("pcfg spec names no grammar: give one (pcfg:paper, "
                          "pcfg:path/to/rules.txt) or ask for a random grammar with at least "
                          "one random.<knob> (pcfg:seed=3,random.vocab=50; knobs: "
                          f"{', '.join(sorted(RandomGrammarConfig.__dataclass_fields__))}); "
                          "'seed' alone only seeds the random grammar")
    if "random" in spec:
        knobs = spec["random"] if isinstance(spec["random"], dict) else {}
        try:
            cfg = RandomGrammarConfig(**knobs)
        except TypeError as e:
            raise SourceError(f"pcfg spec field 'random': {e}; knobs are "
                              f"{sorted(RandomGrammarConfig.__dataclass_fields__)}") from None
        text = "\n".join(random_grammar_lines(cfg, int(spec.get("seed", 0))))
        return parse_grammar(f"<random grammar seed={spec.get('seed', 0)}>", text=text,
                             strict=True)
    name = spec["grammar"]
    path = paper_grammar_path() if name == "paper" else Path(name)
    return parse_grammar(path, strict=bool(spec.get("strict", False)))


MIN_ACCEPTANCE = 1e-4  # below it, rejection sampling by length is hopeless: an error


def _check_acceptance(grammar: Grammar, max_length: int) -> float:
    """The share of sampled sentences the length filter keeps; a SourceError, naming the fix,
    when it is too small for sampling to finish (a grammar whose sentences are all longer than
    ``max_length``, or a supercritical recursive one whose trees rarely end short)."""
    radius = grammar.branching_radius()
    if radius > 1 + 1e-9:
        raise SourceError(f"pcfg grammar is supercritical: its recursive rules expect "
                          f"{radius:.3g} > 1 children per nonterminal (spectral radius of the "
                          "expected-offspring matrix), so its trees grow without end with "
                          "positive probability; make the recursive rules rarer")
    dist = grammar.length_distribution(max_length)
    kept = float(dist.sum())
    if kept >= MIN_ACCEPTANCE:
        return kept
    possible = np.flatnonzero(grammar.length_distribution(64) > 0)
    shortest = f"its shortest sentence has {possible[0]} words" if len(possible) else \
        "it yields no sentence of up to 64 words (a supercritical or non-terminating grammar)"
    raise SourceError(f"pcfg max_length={max_length}: only {kept:.2g} of this grammar's "
                      f"sentences have at most {max_length} words, so sampling would not finish "
                      f"({shortest}); raise max_length, or make the recursive rules rarer")


FUSED = {"cpu": False, "cuda": True}
# inside-outside with all splits of a width at once (inside_outside_fused), by device type: 2.9x
# fewer kernels at T = 16, for a GPU bound by launches; 1.6x slower on a CPU (more memory traffic).
# Not yet measured on a GPU: bench/truth.py --fused times it against the split-by-split route.

MIN_GROUP = {"cpu": 1, "cuda": 4096}
# sentences per length group, by device type: a CPU pays for arithmetic, so every length gets its
# own chart (1); a GPU pays per kernel launch below a few thousand sentences per chart (H100:
# 108k sent/s at 16k sentences, 365k at 65k, replication_facts.md), so neighbouring lengths share
# a chart, padded to the longest, until it holds this many: the default batch of ``conditionals``
# and ``labels_of_tasks`` (not yet measured on a GPU: bench/truth.py --min-group)


def length_groups(lengths: torch.Tensor, min_group: int | None = None):
    """[(rows, L)]: the sentences in groups of neighbouring lengths, each with its longest length
    L; a group closes once it holds ``min_group`` sentences (default ``MIN_GROUP`` of the
    lengths' device type; 1: one group per length). Charts accept mixed lengths (padding scores
    0), so the grouping changes the work and the rounding, never the answer."""
    if min_group is None:
        min_group = MIN_GROUP.get(lengths.device.type, 1)
    if min_group < 1:
        raise ValueError(f"min_group={min_group}: use an int >= 1 (1: one group per length)")
    values, counts = (a.tolist() for a in lengths.unique(return_counts=True))
    groups, members, size = [], [], 0
    for L, count in zip(values, counts, strict=True):
        members.append(L)
        size += count
        if size >= min_group or values[-1] == L:
            rows = torch.isin(lengths, torch.tensor(members, device=lengths.device))
            groups.append((rows.nonzero().squeeze(-1), L))
            members, size = [], 0
    return groups


class PCFG(Source):
    """A PCFG language; see the module docstring for the spec and the task labels."""

    def __init__(self, grammar: Grammar, *, spec: dict, max_length: int = 32,
                 spans: dict | None = None, label_rule: str = "posterior",
                 downstream_min_length: int | None = None):
        self.grammar = grammar
        self.spec = spec
        self.vocab = list(grammar.words)
        self.length_filter = int(max_length)
        self.max_length = int(min(max_length, grammar.max_yield_length()))
        self.acceptance = _check_acceptance(grammar, self.length_filter)
        self.spans = self._spans_of(spans if spans is not None else "released")
        self.label_rule = label_rule
        self.tasks = ("A", *self.spans)
        if downstream_min_length is None:
            downstream_min_length = min(DOWNSTREAM_MIN_LENGTH, self.max_length)
            if spans == "depth":  # every sentence long enough for every task's span
                downstream_min_length = max(downstream_min_length, *self.spans.values())
        if not 1 <= downstream_min_length <= self.max_length:
            raise SourceError(f"pcfg spec field downstream_min_length={downstream_min_length}: "
                              f"this grammar's sentences have 1..{self.max_length} words; use a "
                              "value in that range")
        self.downstream_min_length = int(downstream_min_length)
        long = {t: L for t, L in self.spans.items() if self.downstream_min_length < L}
        if long:  # the span's label would be read off a sentence shorter than the span
            task, span = next(iter(long.items()))
            raise SourceError(f"pcfg spec field spans: {task}={span} is longer than the "
                              f"shortest downstream sentence (downstream_min_length="
                              f"{self.downstream_min_length}; this grammar's sentences have "
                              f"1..{self.max_length} words); shorten the span or raise "
                              "downstream_min_length")
        self._plans: dict = {}

    def _spans_of(self, spans: dict | str) -> dict[str, int]:
        """Task -> span length of the spec's ``spans`` (a dict, "released" or "depth")."""
        if spans == "released":
            return dict(RELEASED_SPANS)
        if spans == "depth":
            return depth_spans(self.max_length)
        return dict(spans)

    @classmethod
    def from_spec(cls, spec: dict) -> PCFG:
        unknown = set(spec) - _FIELDS
        if unknown:
            raise SourceError(f"pcfg spec: unknown field(s) {sorted(unknown)}; allowed: "
                              f"{sorted(_FIELDS)}")
        max_length = spec.get("max_length", 32)
        if not isinstance(max_length, int) or max_length < 1:
            raise SourceError(f"pcfg spec field max_length={max_length!r} must be an int >= 1")
        spans = spec.get("spans", "released")
        if spans not in SPAN_RULES and (not isinstance(spans, dict) or "A" in spans or not all(
                isinstance(v, int) and v >= 1 for v in spans.values())):
            raise SourceError(f"pcfg spec field spans={spans!r}: use 'released' (B=4, C=2), "
                              "'depth' (the paper's text: the symbols at parse depth 2 and 3) "
                              "or a map of task names (not 'A') to span lengths >= 1, e.g. "
                              "{\"B\": 4, \"C\": 2}")
        rule = spec.get("label_rule", LABEL_RULES[0])
        if rule not in LABEL_RULES:
            raise SourceError(f"pcfg spec field label_rule={rule!r}: use one of {LABEL_RULES}")
        min_length = spec.get("downstream_min_length")
        if min_length is not None and (not isinstance(min_length, int) or min_length < 1):
            raise SourceError(f"pcfg spec field downstream_min_length={min_length!r}: use an "
                              "int >= 1 (the released code: 5)")
        spec = dict(spec)
        if spec.get("grammar") not in (None, "paper"):
            spec["grammar"] = str(Path(spec["grammar"]).absolute())  # Ray may chdir
        return cls(_grammar_from_spec(spec), spec=spec, max_length=max_length,
                   spans=spans, label_rule=rule, downstream_min_length=min_length)

    @cached_property
    def _table(self) -> RuleTable:
        return RuleTable(self.grammar)

    def plan(self, T: int, device, dtype) -> Plan:
        """Inside-outside tables for sentences of at most T words on ``device`` (cached)."""
        key = (T, str(device), dtype)
        if key not in self._plans:
            self._plans[key] = Plan.of(self.grammar, T, device, dtype)
        return self._plans[key]

    def sample(self, n: int, seed: int):
        tokens, lengths = sample_sentences(self._table, n, self.length_filter, self.max_length,
                                           seed)
        return torch.from_numpy(tokens), torch.from_numpy(lengths)

    def conditionals(self, tokens, lengths, *, device=None, dtype=torch.float32,
                     batch_size: int = 4096, min_group: int | None = None,
                     fused: bool | None = None) -> torch.Tensor:
        """As ``Source.conditionals``. Sentences are grouped by length over the whole input
        (``length_groups``), so each chart is only as wide as its sentences (the work grows like
        T^3) and each group is large (per-op overhead amortised); results are written in place,
        no reordering copies. ``fused``: all splits of a width at once (default ``FUSED`` of the
        device type)."""
        tokens, lengths = self._prepare(tokens, lengths, device)
        fused = FUSED.get(tokens.device.type, False) if fused is None else fused
        probs = torch.zeros(*tokens.shape, self.V, device=tokens.device, dtype=dtype)
        for group, L in length_groups(lengths, min_group):
            plan = self.plan(L, tokens.device, dtype)
            for rows in group.split(batch_size):
                if fused:
                    probs[rows, :L] = self._checked(conditionals_fused(
                        tokens[rows, :L], lengths[rows], self.fused_plan(plan)), rows,
                        lengths[rows])
                    continue
                chart = inside(tokens[rows, :L], plan)
                probs[rows, :L] = self._checked(
                    word_conditionals(outside(chart, lengths[rows], plan), plan), rows,
                    lengths[rows])
        return probs

    def fused_plan(self, plan: Plan) -> FusedPlan:
        """``FusedPlan`` of a cached ``plan`` (cached beside it)."""
        key = (plan.T, str(plan.root.device), plan.root.dtype, "fused")
        if key not in self._plans:
            self._plans[key] = FusedPlan.of(plan)
        return self._plans[key]

    def _conditionals_batch(self, tokens, lengths, dtype):
        return self.conditionals(tokens, lengths, dtype=dtype)

    @staticmethod
    def _checked(probs: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Refuses a real position no word can fill (the sentence is not in the language)."""
        impossible = (probs.sum(-1) == 0) & padding_mask(lengths, probs.shape[1])
        if impossible.any():
            b, t = (int(i) for i in impossible.nonzero()[0])
            raise ValueError(f"sentence {int(rows[b])}: no word at position {t} makes it a "
                             "sentence of this grammar, so its conditional is undefined")
        return probs

    def sentence_logprob(self, tokens, lengths, *, dtype=torch.float64) -> torch.Tensor:
        """log Pr(x) under the grammar (without the length filter's renormalisation)."""
        tokens, lengths = as_tokens(tokens, lengths)
        plan = self.plan(tokens.shape[1], tokens.device, dtype)
        return sentence_logprob(inside(tokens, plan), lengths, plan)

    def latent_posteriors(self, tokens, lengths, *, device=None,
                          batch_size: int = 1024) -> torch.Tensor:
        """The parse's posterior at every word: [n, T, N] float64 on ``device`` (default: the
        tokens'), the expected number of constituents labelled A over each word
        (``sources.pcfg_marginals``), 0 on padding; what ``measure.cka`` compares a model's
        features with. Grouped by length as ``conditionals`` is."""
        tokens, lengths = self._prepare(tokens, lengths, device)
        out = torch.zeros(*tokens.shape, self.grammar.N, device=tokens.device,
                          dtype=torch.float64)
        for group, L in length_groups(lengths):
            plan = self.plan(L, tokens.device, torch.float64)
            for rows in group.split(batch_size):
                chart = inside(tokens[rows, :L], plan)
                out[rows, :L] = covering_posteriors(
                    chart, outside(chart, lengths[rows], plan), lengths[rows], plan)
        return out

    @property
    def label_rules(self) -> tuple[str, ...]:
        """The spec's ``label_rule`` first, then the others."""
        return (self.label_rule, *(r for r in LABEL_RULES if r != self.label_rule))

    def num_classes(self, task: str) -> int:
        self._check_task(task)
        return len(self.grammar.root_symbols()) if task == "A" else self.grammar.N + 1

    def _check_task(self, task):
        if task not in self.tasks:
            raise ValueError(f"unknown task {task!r}; this PCFG's tasks are {self.tasks}")

    def labels(self, tokens, lengths, task: str, rule: str | None = None, *,
               batch_size: int = 4096) -> torch.Tensor:
        """Nonterminal labels for ``task`` by ``rule`` (default: the spec's ``label_rule``)."""
        return self.labels_of_tasks(tokens, lengths, (task,), rule, batch_size=batch_size)[task]

    def labels_of_tasks(self, tokens, lengths, tasks, rule: str | None = None, *,
                        batch_size: int = 4096, min_group: int | None = None,
                        fused: bool | None = None) -> dict[str, torch.Tensor]:
        """{task: labels [n]} for several tasks from one inside (and outside) pass per batch, on
        the tokens' device. Sentences are grouped by length and the route chosen (``fused``) as
        in ``conditionals``; the labels equal those of one padded batch."""
        for task in tasks:
            self._check_task(task)
        rule = rule or self.label_rule
        if rule not in LABEL_RULES:
            raise ValueError(f"label rule {rule!r}: use one of {LABEL_RULES}")
        tokens, lengths = as_tokens(tokens, lengths)
        fused = FUSED.get(tokens.device.type, False) if fused is None else fused
        out = {task: torch.full_like(lengths, -1) for task in tasks}
        for group, L in length_groups(lengths, min_group):
            for rows in group.split(batch_size):
                labels = self._labels_batch(tokens[rows, :L], lengths[rows], tasks, rule,
                                            fused)
                for task, y in labels.items():
                    out[task][rows] = y
        return out

    def _labelled_sample(self, n, seed, rule, tasks, device):
        """Sentences of at least ``downstream_min_length`` words, labelled for all tasks at
        once."""
        tokens, lengths = self.downstream_sentences(n, seed)
        tok, ln = tokens.to(device or "cpu"), lengths.to(device or "cpu")
        labels = self.labels_of_tasks(tok, ln, tasks, rule)
        return tokens, lengths, {task: y.cpu() for task, y in labels.items()}

    def downstream_sentences(self, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """n sentences of the pre-training distribution conditioned on at least
        ``downstream_min_length`` words: rejection sampling, round k drawing from
        derive_seed(seed, "downstream", k), so the result is a function of (n, seed)."""
        if self.downstream_min_length <= 1:
            return self.sample(n, seed)
        kept_tokens, kept_lengths, have, drawn, accepted = [], [], 0, 0, 0
        for k in range(64):
            rate = (accepted + 1) / (drawn + 2)  # smoothed acceptance so far
            m = int(min(4 * n, (n - have) / rate * 1.1)) + 64
            tokens, lengths = self.sample(m, derive_seed(seed, "downstream", k))
            keep = lengths >= self.downstream_min_length
            drawn, accepted = drawn + m, accepted + int(keep.sum())
            kept_tokens.append(tokens[keep])
            kept_lengths.append(lengths[keep])
            have += int(keep.sum())
            if have >= n:
                return torch.cat(kept_tokens)[:n], torch.cat(kept_lengths)[:n]
        raise SourceError(f"downstream_min_length={self.downstream_min_length}: only {accepted} "
                          f"of {drawn} sampled sentences are that long; lower it")

    @cached_property
    def log_left_corner(self) -> torch.Tensor:
        """log LC(A): expected occurrences of A on the left spine of a tree (module docstring),
        [N] float64; -inf where A never starts a sentence."""
        g = self.grammar
        P = np.zeros((g.N, g.N))
        np.add.at(P, (g.binary_parent, g.binary_left), g.binary_prob)
        lc = np.linalg.solve(np.eye(g.N) - P.T, g.root)  # lc = root + P^T lc
        with np.errstate(divide="ignore"):
            return torch.from_numpy(np.log(np.clip(lc, 0.0, None)))

    def _labels_batch(self, tokens, lengths, tasks, rule,
                      fused: bool = False) -> dict[str, torch.Tensor]:
        plan = self.plan(tokens.shape[1], tokens.device, torch.float64)
        if fused:
            chart, stacked = inside_fused(tokens, self.fused_plan(plan))
        else:
            chart = inside(tokens, plan)
        if rule == "posterior":
            out_chart = outside_fused(stacked, lengths, self.fused_plan(plan)) if fused else \
                outside(chart, lengths, plan)
            log_px = sentence_logprob(chart, lengths, plan)[:, None]  # (B, 1)
        labels = {}
        for task in tasks:
            L = lengths if task == "A" else torch.full_like(lengths, self.spans[task])
            L_cell = L.clamp(max=tokens.shape[1])
            score = chart.log(0, L_cell)  # (B, N): log inside(A, [0, L))
            if rule == "posterior":
                score = score + out_chart.log(0, L_cell) - log_px
            elif rule == "span":
                score = score + self.log_left_corner.to(score.device)
            labels[task] = self._argmax_label(score, task, rule, lengths, L)
        return labels

    def _argmax_label(self, score, task, rule, lengths, L) -> torch.Tensor:
        if task == "A":
            return score[:, : len(self.grammar.root_symbols())].argmax(-1)
        none = torch.log1p(-score.exp().sum(-1).clamp(max=1)) if rule == "posterior" else \
            torch.where(torch.isfinite(score).any(-1), -math.inf, 0.0).to(score.dtype)
        label = torch.cat([score, none[:, None]], -1).argmax(-1)  # class N = no constituent
        return torch.where(lengths >= L, label, torch.full_like(label, -1))

    def _fingerprint_arrays(self):
        g = self.grammar
        return [g.root, g.binary_parent, g.binary_left, g.binary_right, g.binary_prob,
                g.emission, np.array([self.length_filter])]
