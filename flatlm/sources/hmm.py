"""Hidden Markov model source: exact masked-LM conditionals by forward-backward.

A sentence of fixed length T is drawn as z_1 ~ pi, z_{t+1} ~ A[z_t], x_t ~ E[z_t] with S hidden
states and V words (word id c is emission column c). For every position t at once,

    Pr(x_t = c | x_{-t}) = sum_s alpha_t(s) beta_t(s) E[s, c] / sum_{s,c'} (same with c'),

where alpha_t(s) = Pr(x_{<t}, z_t = s) is the forward message before x_t is emitted and
beta_t(s) = Pr(x_{>t} | z_t = s) the backward message. Both are renormalised at every step (the
per-step constants cancel in the ratio), so float32 is safe for long sentences.

Random HMMs (``load("hmm:seed=0")``) are block diagonal: the S states and V words are split into
``blocks`` contiguous groups; each row of A and E is a Dirichlet(concentration) draw over its own
block, mixed with a uniform row over everything with weight ``leakage``:

    A[s] = (1 - leakage) Dir_block(s) + leakage / S,
    E[s] = (1 - leakage) Dir_block(s) + leakage / V,

and pi ~ Dirichlet(1, ..., 1). With leakage 0 a sentence never leaves the block of its first state.

Downstream tasks ``task-k`` (k = 1..T, the paper uses task-6 and task-10) classify the hidden state
z_k into S classes, by one of two rules:

- ``"posterior"`` (the default): argmax_s Pr(z_k = s | x), computable from the sentence alone;
- ``"sampled"``: the state the sampler actually drew (pass ``states`` from ``sample_with_states``).
  The sentence does not determine it, so no classifier reaches 100%: the best one (argmax of
  the posterior) is right with probability max_s Pr(z_k = s | x) on sentence x
  (``bayes_accuracies``), and its mean over the probe's test sentences is the task's ceiling
  (``<stage>/<task>/bayes_ceiling``).

>>> src = HMM.from_spec({"kind": "hmm", "seed": 0, "vocab": 6, "states": 4, "length": 5,
...                      "blocks": 2})
>>> tokens, lengths = src.sample(3, seed=1)
>>> tuple(src.conditionals(tokens, lengths).shape)
(3, 5, 6)
>>> np.allclose(src.conditionals(tokens, lengths, dtype=torch.float64).numpy(),
...             brute_force_conditionals(src, tokens, lengths))
True
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import torch

from flatlm.core.memory import require
from flatlm.sources.base import PAD, Source, SourceError, as_tokens, padding_mask

# Defaults of the random route (the paper's sizes: V = 200, S = 100, T = 16).
RANDOM_DEFAULTS = {
    "seed": 0,  # numpy Generator seed for the matrices
    "vocab": 200,  # V >= blocks
    "states": 100,  # S >= blocks
    "length": 16,  # T >= 1, every sentence has exactly T words
    "blocks": 10,  # groups of states/words; 1 = no block structure
    "leakage": 0.05,  # in [0, 1]: mass of each row spread uniformly over all states/words
    "concentration": 0.1,  # > 0: Dirichlet concentration inside a block; small = peaked rows
}
FILE_KEYS = ("kind", "file", "length")
ARRAYS = ("initial", "transition", "emission")
RULES = ("posterior", "sampled")
# sentences per forward-backward pass of bayes_accuracies: (B, T, S) float64 messages, 4 of them
# (alpha, beta, e, the posterior): 50 MB at the paper's T = 16, S = 100
BAYES_BATCH = 1024


def _check_keys(spec: dict, allowed, hint: str = "") -> None:
    for key in spec:
        if key not in allowed:
            raise SourceError(
                f"hmm spec: unknown key {key!r}; allowed keys are {', '.join(allowed)}{hint}"
            )


def _number(spec: dict, key: str, kind: type, lo: float, hi: float = float("inf"),
            open_lo: bool = False):
    """spec[key] as ``kind`` if it is a number in [lo, hi] ((lo, hi] if ``open_lo``)."""
    value = spec[key]
    ok = isinstance(value, int if kind is int else int | float) and not isinstance(value, bool)
    if not ok or not (lo < value if open_lo else lo <= value) or value > hi:
        where = f"> {lo}" if open_lo else f">= {lo}"
        where = where if hi == float("inf") else f"in [{lo}, {hi}]"
        raise SourceError(f"hmm spec: {key!r} must be {kind.__name__} {where}, got {value!r}")
    return kind(value)


def check_hmm_arrays(initial, transition, emission, where: str = "arrays") -> list[np.ndarray]:
    """Validates pi [S], A [S, S], E [S, V] and returns them as float64, rows renormalised.

    Raises ``SourceError`` naming ``where``, the array and the first bad row: wrong shape, a NaN or
    infinite entry, a negative entry, or a row not summing to 1 within 1e-6.
    """
    arrays = {"initial": initial, "transition": transition, "emission": emission}
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}
    S = arrays["initial"].shape[0] if arrays["initial"].ndim == 1 else -1
    V = arrays["emission"].shape[-1] if arrays["emission"].ndim == 2 else -1
    want = {"initial": (S,), "transition": (S, S), "emission": (S, V)}
    out = []
    for name, a in arrays.items():
        if S < 1 or V < 1 or a.shape != want[name]:
            raise SourceError(
                f"{where}: array {name!r} has shape {a.shape}; expected initial [S], "
                f"transition [S, S], emission [S, V] with S, V >= 1"
            )
        rows = a.reshape(-1, a.shape[-1])
        for r, row in enumerate(rows):
            problem = None
            if not np.isfinite(row).all():
                problem = "has a NaN or infinite entry"
            elif (row < 0).any():
                problem = f"has a negative entry {row.min():.3g}"
            elif abs(row.sum() - 1) > 1e-6:
                problem = f"sums to {row.sum():.9g}, not 1 (tolerance 1e-6)"
            if problem:
                at = "" if name == "initial" else f" row {r}"
                raise SourceError(f"{where}: array {name!r}{at} {problem}")
        out.append(a / a.sum(-1, keepdims=True))
    return out


def _check_size(states: int, vocab: int) -> None:
    """A vocabulary or state count too large for memory is an error naming it, before the
    arrays are drawn (the kernel would otherwise kill the process minutes later)."""
    require(8 * 3 * states * (states + vocab),  # A [S, S] and E [S, V] in float64, ~3 copies
            f"hmm spec: 'vocab' ({vocab}) x 'states' ({states})",
            "lower 'vocab' or 'states' (the emission matrix has vocab x states entries)")


def random_hmm_arrays(seed, vocab, states, blocks, leakage, concentration) -> list[np.ndarray]:
    """Block-diagonal pi [S], A [S, S], E [S, V] from ``np.random.default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    state_block = np.arange(states) * blocks // states  # (S,)
    word_block = np.arange(vocab) * blocks // vocab  # (V,)

    def block_rows(members: np.ndarray) -> np.ndarray:
        out = np.zeros((states, len(members)))
        for s in range(states):
            inside = np.flatnonzero(members == state_block[s])
            out[s, inside] = rng.dirichlet(np.full(len(inside), concentration))
        return (1 - leakage) * out + leakage / len(members)

    initial = rng.dirichlet(np.ones(states))
    transition = block_rows(state_block)
    emission = block_rows(word_block)
    return check_hmm_arrays(initial, transition, emission, where="random hmm")


def _inverse_cdf(cdf: np.ndarray, rows: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Index j with cdf[r, j-1] <= u < cdf[r, j] for each (r, u): one searchsorted for all rows.

    Row r of ``cdf`` (last entry exactly 1) is shifted to [r, r + 1] so the rows form one sorted
    array; ``rows`` (n,) picks a row per draw, ``u`` (n,) is uniform on [0, 1).
    """
    R, K = cdf.shape
    flat = (cdf + np.arange(R)[:, None]).ravel()  # (R * K,)
    idx = np.searchsorted(flat, rows + u, side="right") - rows * K
    return np.clip(idx, 0, K - 1)


class HMM(Source):
    """An HMM language with fixed length T; see the module docstring for the math and tasks.

    Build it with ``HMM.from_spec`` (random or file route) or directly from arrays; ``spec`` is
    None for an HMM built from arrays (``save`` it and load the file to get a spec).
    """

    def __init__(self, initial, transition, emission, length: int, *, spec: dict | None = None,
                 where: str = "arrays"):
        self.initial, self.transition, self.emission = check_hmm_arrays(
            initial, transition, emission, where
        )
        self.max_length = int(length)
        self.spec = spec
        self.vocab = [f"w{c}" for c in range(self.emission.shape[1])]
        self.tasks = tuple(f"task-{k}" for k in range(1, self.max_length + 1))
        self._torch_cache: dict = {}

    @property
    def S(self) -> int:
        return self.initial.shape[0]

    @classmethod
    def from_spec(cls, spec: dict) -> HMM:
        """Random route: keys of ``RANDOM_DEFAULTS``; file route: ``file`` (+ ``length``)."""
        spec = dict(spec)
        if "file" in spec:
            _check_keys(spec, FILE_KEYS)
            if not isinstance(spec["file"], str | os.PathLike):
                raise SourceError(f"hmm spec: 'file' must be a path, got {spec['file']!r}")
            spec.setdefault("length", RANDOM_DEFAULTS["length"])
            length = _number(spec, "length", int, 1)
            path = os.path.abspath(os.fspath(spec["file"]))
            arrays = _load_npz(path)
            return cls(*arrays, length, spec={"kind": "hmm", "file": path, "length": length},
                       where=path)
        _check_keys(spec, ("kind", *RANDOM_DEFAULTS), " (or kind, file, length for an .npz)")
        spec = {"kind": "hmm", **RANDOM_DEFAULTS, **spec}
        args = {
            "seed": _number(spec, "seed", int, 0),
            "vocab": _number(spec, "vocab", int, 1),
            "states": _number(spec, "states", int, 1),
            "blocks": _number(spec, "blocks", int, 1),
            "leakage": _number(spec, "leakage", float, 0.0, 1.0),
            "concentration": _number(spec, "concentration", float, 0.0, open_lo=True),
        }
        length = _number(spec, "length", int, 1)
        if args["blocks"] > min(args["states"], args["vocab"]):
            raise SourceError(
                f"hmm spec: 'blocks' ({args['blocks']}) must not exceed 'states' "
                f"({args['states']}) or 'vocab' ({args['vocab']}); lower 'blocks'"
            )
        _check_size(args["states"], args["vocab"])
        arrays = random_hmm_arrays(**args)
        return cls(*arrays, length, spec={"kind": "hmm", **args, "length": length},
                   where="random hmm")

    def save(self, path) -> str:
        """Writes ``initial``, ``transition``, ``emission`` to an .npz; returns the path written."""
        path = os.fspath(path)
        path = path if path.endswith(".npz") else path + ".npz"
        np.savez(path, initial=self.initial, transition=self.transition, emission=self.emission)
        return path

    def _fingerprint_arrays(self) -> list[np.ndarray]:
        return [self.initial, self.transition, self.emission]

    def _tensors(self, device, dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        key = (str(device), dtype)
        if key not in self._torch_cache:
            self._torch_cache[key] = tuple(
                torch.as_tensor(a, device=device, dtype=dtype) for a in self._fingerprint_arrays()
            )
        return self._torch_cache[key]

    # ---- sampling -------------------------------------------------------------------------------

    def sample_with_states(self, n: int, seed: int):
        """tokens [n, T], lengths [n] (all T) and hidden states [n, T], int64 CPU tensors.

        Per step t: one uniform draw per sentence for z_t, then one for x_t (inverse CDF), all
        from ``np.random.default_rng(seed)``; ``sample`` returns the same tokens.
        """
        rng = np.random.default_rng(seed)
        T = self.max_length
        cdf_pi = np.cumsum(self.initial)[None, :]
        cdf_A, cdf_E = np.cumsum(self.transition, 1), np.cumsum(self.emission, 1)
        for cdf in (cdf_pi, cdf_A, cdf_E):
            cdf[:, -1] = 1.0
        z = np.zeros((n, T), dtype=np.int64)  # (n, T)
        x = np.zeros((n, T), dtype=np.int64)  # (n, T)
        for t in range(T):
            if t == 0:
                z[:, 0] = _inverse_cdf(cdf_pi, np.zeros(n, dtype=np.int64), rng.random(n))
            else:
                z[:, t] = _inverse_cdf(cdf_A, z[:, t - 1], rng.random(n))
            x[:, t] = _inverse_cdf(cdf_E, z[:, t], rng.random(n))
        lengths = torch.full((n,), T, dtype=torch.int64)
        return torch.from_numpy(x), lengths, torch.from_numpy(z)

    def sample(self, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """n sentences of length T: tokens [n, T] int64 and lengths [n] (all T), on the CPU."""
        tokens, lengths, _ = self.sample_with_states(n, seed)
        return tokens, lengths

    # ---- exact inference ------------------------------------------------------------------------

    def _messages(self, tokens, lengths, dtype):
        """Normalised forward alpha (before x_t), backward beta, and emission likelihoods e.

        All (B, T, S), on the tokens' device: alpha_t ∝ Pr(x_{<t}, z_t), beta_t ∝ Pr(x_{>t} | z_t),
        e_t(s) = E[s, x_t] (1 on padding, so beta is 1 past the end). A zero normaliser (a prefix
        or suffix of probability 0) leaves the message zero instead of NaN.
        """
        pi, A, E = self._tensors(tokens.device, dtype)
        B, T = tokens.shape
        real = padding_mask(lengths, T)  # (B, T)
        e = E.T[tokens.clamp_min(0)]  # (B, T, S)
        e = torch.where(real[..., None], e, torch.ones_like(e))
        tiny = torch.finfo(dtype).tiny

        def norm(m):
            return m / m.sum(-1, keepdim=True).clamp_min(tiny)

        alpha = [norm(pi.expand(B, -1))]
        for t in range(T - 1):
            alpha.append(norm((alpha[-1] * e[:, t]) @ A))  # (B, S)
        beta = [torch.ones(B, self.S, device=tokens.device, dtype=dtype)]
        for t in range(T - 1, 0, -1):
            beta.append(norm((e[:, t] * beta[-1]) @ A.T))  # (B, S)
        return torch.stack(alpha, 1), torch.stack(beta[::-1], 1), e, real

    def _conditionals_batch(self, tokens, lengths, dtype) -> torch.Tensor:
        """Pr(x_t = c | x_{-t}) ∝ sum_s alpha_t(s) beta_t(s) E[s, c]: [B, T, V], padding 0.

        A position whose context x_{-t} has probability 0 gets a zero row.
        """
        alpha, beta, _, real = self._messages(tokens, lengths, dtype)
        E = self._tensors(tokens.device, dtype)[2]
        joint = (alpha * beta) @ E  # (B, T, V)
        cond = joint / joint.sum(-1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
        return cond * real[..., None]

    def posteriors(self, tokens, lengths, *, dtype=torch.float64) -> torch.Tensor:
        """Pr(z_t = s | x): [n, T, S] on the tokens' device, padding rows 0."""
        tokens, lengths = as_tokens(tokens, lengths)
        alpha, beta, e, real = self._messages(tokens, lengths, dtype)
        post = alpha * e * beta  # (B, T, S)
        post = post / post.sum(-1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
        return post * real[..., None]

    def latent_posteriors(self, tokens, lengths, *, device=None) -> torch.Tensor:
        """Pr(z_t = s | x) [n, T, S] float64 on ``device`` (default: the tokens'), padding 0:
        the hidden structure's posterior at every word, as ``PCFG.latent_posteriors`` gives a
        parse's (what ``measure.cka`` compares a model's features with)."""
        return self.posteriors(*self._prepare(tokens, lengths, device))

    # ---- downstream -----------------------------------------------------------------------------

    def _position(self, task: str) -> int:
        if task not in self.tasks:
            raise ValueError(
                f"unknown HMM task {task!r}; use task-k with k in 1..{self.max_length}"
            )
        return int(task.split("-")[1]) - 1

    def num_classes(self, task: str) -> int:
        """S: the label of ``task-k`` is a hidden state."""
        self._position(task)
        return self.S

    label_rules = ("sampled", "posterior")  # the paper classifies the hidden variable it drew

    def _labelled_sample(self, n, seed, rule, tasks, device):
        """Sentences with the states the sampler drew: rule "sampled" labels by them."""
        tokens, lengths, states = self.sample_with_states(n, seed)
        tok, ln = tokens.to(device or "cpu"), lengths.to(device or "cpu")
        drawn = states if rule == "sampled" else None
        return tokens, lengths, {task: self.labels(tok, ln, task, rule, states=drawn)
                                 for task in tasks}

    def bayes_accuracies(self, tokens, lengths, rule: str, tasks, *, device=None,
                         batch_size: int = BAYES_BATCH) -> dict[str, torch.Tensor]:
        """Rule "sampled" labels ``task-k`` by the state z_k the sampler drew, which the
        sentence does not determine: per task, max_s Pr(z_k = s | x) for each sentence, [n]
        float64 on the CPU (forward-backward in batches of ``batch_size`` sentences on
        ``device``). Rule "posterior" labels by the sentence alone: {}."""
        if rule != "sampled":
            return {}
        positions = {task: self._position(task) for task in tasks}
        tokens, lengths = self._prepare(tokens, lengths, device)
        best = [self.posteriors(tokens[i : i + batch_size], lengths[i : i + batch_size])
                .amax(-1).cpu() for i in range(0, len(tokens), batch_size)]  # each (B, T)
        best = torch.cat(best) if best else torch.zeros(0, self.max_length, dtype=torch.float64)
        return {task: best[:, k] for task, k in positions.items()}

    def labels(self, tokens, lengths, task: str, rule: str = "posterior", states=None):
        """Hidden state at position k for ``task-k``: [n] int64, -1 where k > length.

        ``rule="posterior"`` (default): argmax_s Pr(z_k = s | x), -1 if Pr(x) = 0.
        ``rule="sampled"``: the sampled state ``states[:, k-1]`` (``states`` from
        ``sample_with_states``).
        """
        k = self._position(task)
        tokens, lengths = as_tokens(tokens, lengths)
        if rule == "posterior":
            post = self.posteriors(tokens, lengths)[:, k]  # (n, S)
            label = torch.where(post.sum(-1) > 0, post.argmax(-1), PAD)
        elif rule == "sampled":
            if states is None:
                raise ValueError(
                    "rule='sampled' needs the hidden states: pass states=... from "
                    "sample_with_states(n, seed)"
                )
            label = torch.as_tensor(states, dtype=torch.int64, device=tokens.device)[:, k]
        else:
            raise ValueError(f"unknown label rule {rule!r}; use one of {', '.join(RULES)}")
        return torch.where(lengths > k, label, torch.full_like(label, PAD))


def _load_npz(path: str) -> list[np.ndarray]:
    if not os.path.exists(path):
        raise SourceError(f"hmm file {path} does not exist (arrays {', '.join(ARRAYS)} expected)")
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [a for a in ARRAYS if a not in data.files]
            if missing:
                raise SourceError(f"{path}: missing array(s) {', '.join(missing)}; found "
                                  f"{', '.join(data.files) or 'none'}")
            arrays = [np.array(data[a]) for a in ARRAYS]
    except (OSError, ValueError) as err:
        if isinstance(err, SourceError):
            raise
        raise SourceError(f"{path}: not a readable .npz file ({err})") from err
    for name, array in zip(ARRAYS, arrays, strict=True):
        if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
            raise SourceError(f"{path}: array {name!r} has dtype {array.dtype}; probabilities "
                              "must be real numbers (float)")
    return arrays


# ---- slow references (tiny HMMs only) ---------------------------------------------------------


def _sentence_paths(hmm: HMM, tokens: np.ndarray, lengths: np.ndarray):
    """For each sentence, of length L: all S^L hidden paths (P, L), their prior probabilities
    Pr(z) (P,) and the probabilities of its words along each path, Pr(x_t | z_t) (P, L)."""
    for i in range(len(lengths)):
        L = int(lengths[i])
        paths = np.array(list(itertools.product(range(hmm.S), repeat=L)), dtype=np.int64)
        prior = hmm.initial[paths[:, 0]] * np.prod(hmm.transition[paths[:, :-1], paths[:, 1:]], 1)
        yield paths, prior, hmm.emission[paths, tokens[i, :L]]


def brute_force_conditionals(hmm: HMM, tokens, lengths) -> np.ndarray:
    """Pr(x_t = c | x_{-t}) by summing Pr(z, x) over all S^L hidden paths: [n, T, V] float64.

    Exponential in the length: a reference for tiny HMMs. Padding and zero-probability
    contexts give zero rows, as in the fast version.
    """
    tokens, lengths = (np.asarray(a) for a in as_tokens(tokens, lengths))
    out = np.zeros((*tokens.shape, hmm.V))
    for i, (paths, prior, em) in enumerate(_sentence_paths(hmm, tokens, lengths)):
        for t in range(em.shape[1]):
            rest = prior * np.prod(np.delete(em, t, axis=1), 1)  # (P,)
            joint = rest @ hmm.emission[paths[:, t]]  # (V,)
            if joint.sum() > 0:
                out[i, t] = joint / joint.sum()
    return out


def brute_force_posteriors(hmm: HMM, tokens, lengths) -> np.ndarray:
    """Pr(z_t = s | x) by summing over all hidden paths: [n, T, S] float64, padding 0."""
    tokens, lengths = (np.asarray(a) for a in as_tokens(tokens, lengths))
    out = np.zeros((*tokens.shape, hmm.S))
    for i, (paths, prior, em) in enumerate(_sentence_paths(hmm, tokens, lengths)):
        w = prior * np.prod(em, 1)  # (P,)
        for t in range(em.shape[1]):
            out[i, t] = np.bincount(paths[:, t], weights=w, minlength=hmm.S) / w.sum()
    return out


def sequence_logprob(hmm: HMM, tokens, lengths) -> np.ndarray:
    """log Pr(x) = log sum_z Pr(z, x) over all hidden paths: [n] float64 (tiny HMMs only)."""
    tokens, lengths = (np.asarray(a) for a in as_tokens(tokens, lengths))
    out = np.zeros(tokens.shape[0])
    for i, (_, prior, em) in enumerate(_sentence_paths(hmm, tokens, lengths)):
        with np.errstate(divide="ignore"):
            out[i] = np.log(prior @ np.prod(em, 1))
    return out
