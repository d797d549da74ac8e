"""PCFG grammars in the paper's rule format: parse, validate, generate at random, write.

One rule a line, whitespace separated, probability last::

    S S3 0.12            3 fields, LHS starts with "S": unary root rule  S -> S3
    S3 A1_8 A1_5 1.0     4 fields: binary rule                         S3 -> A1_8 A1_5
    A1_0 korean 0.02     other 3-field lines: terminal rule            A1_0 -> korean

Blank lines and lines starting with ``#`` are skipped. Repeated (LHS, RHS) lines are summed, then
each LHS's rules are renormalised to sum to 1; ``Grammar.report`` says how many lines were merged
and by how much each row was off. Unary rules are allowed only from the start symbol ``S``.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flatlm.sources.base import SourceError

START = "S"
ROW_TOLERANCE = 0.01  # |sum of a symbol's rule probabilities - 1| above this: a warning (the
#   paper's file is off by 2e-4 from rounding)
log = logging.getLogger(__name__)


class GrammarError(SourceError):
    """A grammar file that does not define a PCFG; the message names the file and line."""


@dataclass(frozen=True)
class Grammar:
    """A PCFG in normal form: root distribution, binary rules and a terminal (emission) matrix.

    Nonterminal ids index ``nonterminals``; word ids index ``words`` (sorted). Every nonterminal
    A satisfies sum_r binary_prob[parent == A] + emission[A].sum() == 1.
    """

    nonterminals: list[str]
    words: list[str]
    root: np.ndarray  # (N,) Pr(S -> A)
    binary_parent: np.ndarray  # (R,) int64
    binary_left: np.ndarray  # (R,) int64
    binary_right: np.ndarray  # (R,) int64
    binary_prob: np.ndarray  # (R,) float64
    emission: np.ndarray  # (N, V) Pr(A -> word)
    report: dict = field(default_factory=dict)

    @property
    def N(self) -> int:
        return len(self.nonterminals)

    @property
    def V(self) -> int:
        return len(self.words)

    def max_yield_length(self) -> float:
        """Longest sentence the grammar can produce (``math.inf`` when it is recursive)."""
        longest = np.where(self.emission.sum(1) > 0, 1.0, -math.inf)
        for _ in range(self.N + 1):
            pair = longest[self.binary_left] + longest[self.binary_right]
            new = longest.copy()
            np.maximum.at(new, self.binary_parent, pair)
            if np.array_equal(new, longest):
                break
            longest = new
        else:
            return math.inf
        return float(longest[self.root > 0].max())

    def _normalised_rules(self) -> tuple[np.ndarray, np.ndarray]:
        """(each binary rule's probability, each nonterminal's total word probability), rows
        normalised to 1 as the sampler (``pcfg_sampler.RuleTable``) normalises them."""
        total = np.zeros(self.N)
        np.add.at(total, self.binary_parent, self.binary_prob)
        total += self.emission.sum(1)
        scale = np.divide(1.0, total, out=np.zeros(self.N), where=total > 0)
        return self.binary_prob * scale[self.binary_parent], self.emission.sum(1) * scale

    def length_distribution(self, max_length: int) -> np.ndarray:
        """Pr(a sentence has n words) for n = 0..max_length (entry 0 is 0): the chance that the
        sampler's length filter keeps a draw is the sum. Exact, by dynamic programming over
        yield lengths: P_A(1) = Pr(A -> word), P_A(n) = sum over A -> B C of
        p * sum_k P_B(k) P_C(n - k). Rows are normalised as the sampler normalises them."""
        p_rule, p_word = self._normalised_rules()
        by_length = np.zeros((max_length + 1, self.N))  # [n, A] = Pr(A yields n words)
        if max_length >= 1:
            by_length[1] = p_word
        for n in range(2, max_length + 1):
            k = np.arange(1, n)
            pairs = (by_length[k][:, self.binary_left] * by_length[n - k][:, self.binary_right])
            np.add.at(by_length[n], self.binary_parent, p_rule * pairs.sum(0))
        root = self.root / self.root.sum()
        return by_length @ root

    def branching_radius(self) -> float:
        """Spectral radius of the expected-offspring matrix M[A, B] (expected number of B
        children of an A, rows normalised as the sampler normalises them). Above 1 the grammar
        is supercritical: a tree is infinite with positive probability."""
        p, _ = self._normalised_rules()
        offspring = np.zeros((self.N, self.N))
        np.add.at(offspring, (self.binary_parent, self.binary_left), p)
        np.add.at(offspring, (self.binary_parent, self.binary_right), p)
        return float(np.abs(np.linalg.eigvals(offspring)).max()) if self.N else 0.0

    def root_symbols(self) -> np.ndarray:
        """Ids of the nonterminals the start symbol rewrites to."""
        return np.flatnonzero(self.root > 0)


def _fail(path, lineno, msg) -> GrammarError:
    return GrammarError(f"{path}:{lineno}: {msg}")


def _read_lines(path: Path, text: str):
    """Yields (lineno, lhs, rhs tuple, prob) for every rule line, checking the syntax."""
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) not in (3, 4):
            # the line's number, not its text: the file may be anything a spec names
            raise _fail(path, lineno, f"expected 3 or 4 fields (rule then probability), got "
                        f"{len(fields)}")
        try:
            prob = float(fields[-1])
        except ValueError:
            raise _fail(path, lineno, "the last field (the probability) is not a number") \
                from None
        if not math.isfinite(prob) or prob < 0:
            raise _fail(path, lineno, f"probability {fields[-1]} must be finite and >= 0")
        yield lineno, fields[0], tuple(fields[1:-1]), prob


def _collect(path: Path, text: str):
    """Groups the lines into root, binary and terminal rule tables, summing repeats."""
    root, binary, terminal, first_line, merged = {}, {}, {}, {}, 0
    for lineno, lhs, rhs, prob in _read_lines(path, text):
        if len(rhs) == 2:
            table, key = binary, (lhs, rhs)
        elif lhs.startswith(START):
            if lhs != START:
                raise _fail(path, lineno, f"unary rule from {lhs!r}: unary rules are allowed only "
                            f"from the start symbol {START!r} (a terminal rule's LHS must not "
                            f"start with 'S')")
            table, key = root, (lhs, rhs)
        else:
            table, key = terminal, (lhs, rhs)
        merged += key in table
        table[key] = table.get(key, 0.0) + prob
        first_line.setdefault(key, lineno)
        first_line.setdefault(lhs, lineno)
    if not root:
        raise GrammarError(f"{path}: no root rules; add lines 'S <symbol> <probability>'")
    return root, binary, terminal, first_line, merged


def _check_symbols(path, root, binary, terminal, first_line):
    """Every RHS symbol must be known; terminal words must not be nonterminals."""
    nts = {lhs for (lhs, _) in binary} | {lhs for (lhs, _) in terminal}
    for (_, (sym,)), where in ((k, first_line[k]) for k in root):
        if sym not in nts:
            raise _fail(path, where, f"unknown symbol {sym!r}: the root rewrites to it but it has "
                        "no rules")
    for key in binary:
        for sym in key[1]:
            if sym not in nts:
                raise _fail(path, first_line[key], f"unknown symbol {sym!r}: it appears on a "
                            "right-hand side but has no rules of its own")
    for key in terminal:
        if key[1][0] in nts:
            raise _fail(path, first_line[key], f"unary rule {key[0]} -> {key[1][0]} between "
                        "nonterminals; only the start symbol S may have unary rules")
    return nts


def _order_nonterminals(root, nts) -> list[str]:
    """Root targets first (in file order), then the rest sorted: ids stable across rewrites."""
    roots = [rhs[0] for (_, rhs) in root]
    return roots + sorted(nts - set(roots))


def _unreachable(nt_index, root_ids, parent, left, right) -> list[str]:
    reach = np.zeros(len(nt_index), bool)
    reach[root_ids] = True
    for _ in range(len(nt_index)):
        grow = reach.copy()
        grow[left[reach[parent]]] = True
        grow[right[reach[parent]]] = True
        if np.array_equal(grow, reach):
            break
        reach = grow
    return [name for name, i in nt_index.items() if not reach[i]]


def _check_reachable(path, nt_index, root_ids, parent, left, right, first_line, strict):
    """Unreachable symbols: an error when ``strict``, else reported and kept.

    Kept, because the paper's own grammar has one (A1_9): it never appears in a parse, but the
    released code's inside-rule labels range over it, so dropping it would change labels.
    """
    names = _unreachable(nt_index, root_ids, parent, left, right)
    if names and strict:
        raise _fail(path, first_line[names[0]], f"symbol {names[0]!r} is unreachable from the "
                    "start symbol S; remove its rules or add a rule that uses it")
    if names:  # the shipped grammars' are known (the docstring above): no warning every load
        shipped = Path(str(path)).resolve().parent == Path(__file__).resolve().parent / "data"
        log.log(logging.INFO if shipped else logging.WARNING, "%s: unreachable symbols kept: %s",
                path, ", ".join(names))
    return names


def _check_terminates(path, nt_index, emission, parent, left, right, first_line):
    done = emission.sum(1) > 0
    for _ in range(len(nt_index)):
        grow = done.copy()
        grow[parent[done[left] & done[right]]] = True
        if np.array_equal(grow, done):
            break
        done = grow
    for name, i in nt_index.items():
        if not done[i]:
            raise _fail(path, first_line[name], f"nonterminal {name!r} cannot terminate: every "
                        "derivation from it loops forever; give it a terminal rule")


def _normalise(path, nt_index, root_p, bprob, parent, emission, first_line):
    """Renormalises each LHS row; returns the largest |row sum - 1| before renormalising."""
    total = np.bincount(parent, weights=bprob, minlength=len(nt_index)) + emission.sum(1)
    for name, i in nt_index.items():
        if total[i] <= 0:
            raise _fail(path, first_line[name], f"the rules of {name!r} have total probability 0 "
                        "and cannot be normalised")
    if root_p.sum() <= 0:
        raise GrammarError(f"{path}: the root rules have total probability 0")
    far = [(name, total[i]) for name, i in nt_index.items() if abs(total[i] - 1) > ROW_TOLERANCE]
    if far or abs(root_p.sum() - 1) > ROW_TOLERANCE:  # rounding is fine; a typo is not
        name, row = far[0] if far else (START, root_p.sum())
        line = f":{first_line[name]}" if name in first_line else ""
        log.warning("%s%s: the rules of %s sum to %.4g, not 1 (%d such symbol(s)); "
                    "renormalised, so each rule's probability is its weight over the sum",
                    path, line, name, row, len(far) + (abs(root_p.sum() - 1) > ROW_TOLERANCE))
    off = {"max_row_error": float(np.abs(total - 1).max()),
           "root_error": float(abs(root_p.sum() - 1))}
    return root_p / root_p.sum(), bprob / total[parent], emission / total[:, None], off


def _natural_key(word: str):
    """Sorts w2 before w10, so generated vocabularies keep their numeric order."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", word)]


def parse_grammar(path: str | Path, text: str | None = None, *, strict: bool = False) -> Grammar:
    """Reads and validates a grammar; every error names the file (or ``path`` label) and line.

    ``text``, when given, is parsed instead of reading ``path`` (which then only names it).
    ``strict`` makes an unreachable symbol an error (otherwise it is reported and kept).
    """
    path = Path(path)
    if text is None:
        if path.is_dir():
            raise GrammarError(f"grammar file {path} is a directory: give the grammar file "
                               "itself (one rule per line)")
        if not path.is_file():
            raise GrammarError(f"grammar file {path} does not exist")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:  # a binary file given by mistake: name it
            raise GrammarError(f"grammar file {path} is not UTF-8 text (byte {e.start}); give "
                               "the grammar's text file, one rule per line") from None
    root, binary, terminal, first_line, merged = _collect(path, text)
    nts = _check_symbols(path, root, binary, terminal, first_line)
    names = _order_nonterminals(root, nts)
    nt_index = {s: i for i, s in enumerate(names)}
    words = sorted({rhs[0] for (_, rhs) in terminal}, key=_natural_key)
    w_index = {w: i for i, w in enumerate(words)}
    root_p = np.zeros(len(names))
    for (_, (sym,)), p in root.items():
        root_p[nt_index[sym]] = p
    keys = list(binary)
    parent = np.array([nt_index[k[0]] for k in keys], dtype=np.int64)
    left = np.array([nt_index[k[1][0]] for k in keys], dtype=np.int64)
    right = np.array([nt_index[k[1][1]] for k in keys], dtype=np.int64)
    bprob = np.array([binary[k] for k in keys], dtype=np.float64)
    emission = np.zeros((len(names), len(words)))
    for (lhs, (w,)), p in terminal.items():
        emission[nt_index[lhs], w_index[w]] = p
    unreachable = _check_reachable(path, nt_index, np.flatnonzero(root_p > 0), parent, left,
                                   right, first_line, strict)
    _check_terminates(path, nt_index, emission, parent, left, right, first_line)
    root_p, bprob, emission, off = _normalise(path, nt_index, root_p, bprob, parent, emission,
                                              first_line)
    report = {"file": str(path), "merged_duplicate_lines": merged, "unreachable": unreachable,
              **off}
    return Grammar(names, words, root_p, parent, left, right, bprob, emission, report)


def write_grammar(g: Grammar, path: str | Path) -> None:
    """Writes ``g`` in the paper's format (root rules, binary rules, terminal rules)."""
    lines = [f"{START} {g.nonterminals[i]} {float(g.root[i])!r}" for i in g.root_symbols()]
    for a, b, c, p in zip(g.binary_parent, g.binary_left, g.binary_right, g.binary_prob,
                          strict=True):
        lines.append(f"{g.nonterminals[a]} {g.nonterminals[b]} {g.nonterminals[c]} {float(p)!r}")
    for a, w in zip(*np.nonzero(g.emission), strict=True):
        lines.append(f"{g.nonterminals[a]} {g.words[w]} {float(g.emission[a, w])!r}")
    Path(path).write_text("\n".join(lines) + "\n")


@dataclass(frozen=True, kw_only=True)
class RandomGrammarConfig:
    """Knobs of a random layered grammar shaped like the paper's.

    The start symbol rewrites to ``roots`` symbols; each root has ``binary_per_root`` binary rules
    into level 1; a level-k nonterminal (k < depth) has ``binary_per_nonterminal`` binary rules
    into level k+1 and, with total probability ``terminal_share``, terminal rules; level-``depth``
    nonterminals only emit words. Sentences are 2 .. 2**depth words long.
    """

    vocab: int = 200  # number of words, >= 2
    roots: int = 9  # root symbols S1..S<roots>, >= 1
    nonterminals_per_level: int = 10  # >= 1
    depth: int = 4  # levels of A-symbols below the roots, >= 1
    binary_per_root: int = 1  # binary rules per root symbol, >= 1
    binary_per_nonterminal: int = 20  # binary rules per non-final nonterminal, >= 1
    terminal_share: float = 0.1  # probability mass of terminal rules at non-final levels, [0, 1)
    words_per_nonterminal: int = 20  # terminal rules per emitting nonterminal, >= 1
    concentration: float = 0.5  # Dirichlet concentration of each rule row, > 0

    def __post_init__(self):
        for name in ("vocab", "roots", "nonterminals_per_level", "depth", "binary_per_root",
                     "binary_per_nonterminal", "words_per_nonterminal"):
            if getattr(self, name) < (2 if name == "vocab" else 1):
                raise SourceError(f"random grammar field {name}={getattr(self, name)} is too small")
        if not 0 <= self.terminal_share < 1:
            raise SourceError("random grammar field terminal_share must lie in [0, 1)")
        if self.concentration <= 0:
            raise SourceError("random grammar field concentration must be > 0")


def _covering_sets(rng, n_lhs, n_items, per_lhs):
    """One item set per LHS, together covering every item (so nothing is unreachable/unused)."""
    perm = rng.permutation(n_items)
    sets = []
    for j in range(n_lhs):
        forced = perm[j::n_lhs]
        extra = rng.choice(n_items, size=min(per_lhs, n_items), replace=False)
        sets.append(np.unique(np.concatenate([forced, extra])))
    return sets


def _random_binary(rng, cfg, lhs_names, children, n_rules, share):
    """Binary rules per LHS over child pairs, total probability ``share``; every child is used."""
    n = len(children)
    rows = []
    for lhs, lefts in zip(lhs_names, _covering_sets(rng, len(lhs_names), n, 0), strict=True):
        pairs = {int(b) * n + int(rng.integers(n)) for b in lefts}
        free = n * n - len(pairs)
        extra = rng.permutation([p for p in range(n * n) if p not in pairs])
        pairs = sorted(pairs | set(extra[: max(0, min(free, n_rules - len(pairs)))].tolist()))
        probs = share * rng.dirichlet(np.full(len(pairs), cfg.concentration))
        rows += [(lhs, children[p // n], children[p % n], q)
                 for p, q in zip(pairs, probs, strict=True)]
    return rows


def random_grammar_lines(cfg: RandomGrammarConfig, seed: int) -> list[str]:
    """The rule lines of a random layered grammar (see ``RandomGrammarConfig``)."""
    rng = np.random.default_rng(seed)
    levels = [[f"A{k}_{i}" for i in range(cfg.nonterminals_per_level)]
              for k in range(1, cfg.depth + 1)]
    roots = [f"S{i}" for i in range(1, cfg.roots + 1)]
    lines = [f"S {r} {float(p)!r}" for r, p in zip(roots, rng.dirichlet(np.ones(cfg.roots)),
                                              strict=True)]
    rules = _random_binary(rng, cfg, roots, levels[0], cfg.binary_per_root, 1.0)
    for k in range(cfg.depth - 1):
        rules += _random_binary(rng, cfg, levels[k], levels[k + 1], cfg.binary_per_nonterminal,
                                1.0 - cfg.terminal_share)
    lines += [f"{a} {b} {c} {float(p)!r}" for a, b, c, p in rules]
    emitters = [(lhs, 1.0 if k == cfg.depth - 1 else cfg.terminal_share)
                for k, level in enumerate(levels) for lhs in level]
    emitters = [(lhs, share) for lhs, share in emitters if share > 0]
    word_sets = _covering_sets(rng, len(emitters), cfg.vocab, cfg.words_per_nonterminal)
    for (lhs, share), chosen in zip(emitters, word_sets, strict=True):
        probs = share * rng.dirichlet(np.full(len(chosen), cfg.concentration))
        lines += [f"{lhs} w{w} {float(p)!r}" for w, p in zip(chosen, probs, strict=True)]
    return lines


def random_grammar(cfg: RandomGrammarConfig, seed: int, path: str | Path) -> Grammar:
    """Writes a random layered grammar to ``path`` and parses it back (so it is validated)."""
    Path(path).write_text("\n".join(random_grammar_lines(cfg, seed)) + "\n")
    return parse_grammar(path)
