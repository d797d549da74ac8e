r"""The experiment of the paper's section 5 (Theorem 5.1): among fits of the masked-LM loss on the
Dyck language, the flattest one's features solve g* downstream; random-feature and adversarial
fits of the same loss do not.

Setting (section 5, ``flatlm.sources.dyck``): strings of T brackets, uniform over the balanced ones,
one uniformly chosen position masked; the paper's encoding x_t = +-e_t, a mask s e_{t+T} with a
random sign s; the target y = g*(x) = #">" - #"<" of the unmasked tokens, which is +1 when the
masked token is "<" and -1 when it is ">". The model is the paper's single-layer transformer,

    f(x) = (1/m) u^T relu(V h(x)),   h(x) = sum_j a_j x_j,   a = softmax_j <Q x_1, K x_j>,

with Q, K (k, 2T), V (m, 2T), u (m,), and the squared loss L = E (f(x) - y)^2. Every expectation
here is exact: the pre-training distribution has C(T, T/2) T 2 equally likely inputs, all
enumerated, and the downstream distribution (i.i.d. uniform brackets, nothing masked) 2^T.

The fits compared (all with the same m and k):

- ``flat``: the paper's solution (1): Q = K = 0 (uniform attention) and two neurons
  V_1 = [1_T; 0], V_2 = -V_1 with u = (-mT, mT), so f = g* (the other neurons zero);
- ``random``: solution (2): Q = K = 0, V with i.i.d. N(0, T) entries, u the minimum-norm
  interpolation of y over all pre-training inputs (needs m >= their number);
- ``trained``: every parameter trained from a random start by Adam on L (the implicit bias of
  plain training; a reference, not a claim of the theorem);
- ``adversarial``: from a random-feature fit, V ascends min(L_ds, 1), L_ds the relative squared
  error of g* on held-out downstream strings under a ridge head fitted on others (the paper's A.5
  objective), then u interpolates the pre-training targets again, so L = 0 exactly.

Each fit is then rebalanced to its own flattest point along the loss-preserving rescalings
(V, u) -> (cV, u/c) and (Q, K) -> (cQ, K/c): Tr H changes under them, f does not, so each model is
compared at its best. Measured per fit: L, Tr H = Tr of the Hessian of L over (Q, K, V, u), exact
(``trace_hessian``), and the downstream error of Theorem 5.1's head: u refitted on relu(V h(x)) as
the minimum-norm interpolation of g* on n i.i.d. downstream strings, evaluated on all 2^T
(squared error, and accuracy = the nearest possible value of g* is the true one).

The lower bound behind the theorem (Lemma G.1, in this normalisation): at L = 0,
Tr H >= (4/m) E ||h(x)|| |y| >= 4 / (m sqrt(T)), attained by ``flat``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, hessian, vmap

from flatlm.sources.dyck import Dyck


@dataclass(frozen=True, kw_only=True)
class Section5Config:
    """One run of the experiment (``fits``)."""

    length: int = 8  # T: even, >= 6 (Theorem 5.1)
    neurons: int = 1280  # m: >= the C(T, T/2) 2T pre-training inputs, so random features fit
    key_dim: int = 2  # k: rows of Q and K
    random_fits: int = 3  # random-feature fits (seeds)
    train_steps: int = 1000  # Adam steps of the trained and adversarial fits (full batch);
    #   0 leaves both out
    lr: float = 1e-2  # their Adam learning rate
    adversary_split: int = 32  # downstream strings the adversary's head is fitted on (and
    #   the same number it is scored on), redrawn every step
    n_downstream: tuple[int, ...] = (4, 16, 64)  # downstream training sizes n (Theorem 5.1)
    draws: int = 20  # downstream samples of each size
    seed: int = 0

    def __post_init__(self):
        T = self.length
        if isinstance(T, bool) or not isinstance(T, int) or T < 6 or T % 2:
            raise ValueError(f"section5.length={T!r}: use an even T >= 6 (Theorem 5.1)")
        inputs = math.comb(T, T // 2) * 2 * T
        if self.neurons < 2:
            raise ValueError(f"section5.neurons={self.neurons}: the flat fit needs m >= 2")
        if self.neurons < inputs and (self.random_fits or self.train_steps):
            raise ValueError(f"section5.neurons={self.neurons}: random features (and the "
                             f"adversarial fit) interpolate the {inputs} pre-training inputs of "
                             f"T={T} only with m >= {inputs}; raise it, or set random_fits=0 "
                             "and train_steps=0")
        if self.key_dim < 1 or self.train_steps < 0 or self.draws < 1 or self.lr <= 0:
            raise ValueError("section5: key_dim >= 1, train_steps >= 0, draws >= 1, lr > 0")
        if self.adversary_split < 2 or 2 * self.adversary_split > 2**T:
            raise ValueError(f"section5.adversary_split={self.adversary_split}: use 2 .. "
                             f"{2 ** (T - 1)} (twice it must fit in the 2^T strings)")
        if not self.n_downstream or min(self.n_downstream) < 1:
            raise ValueError("section5.n_downstream: give sizes >= 1")


class OneLayerTransformer(nn.Module):
    """The paper's f(x) = (1/m) u^T relu(V h(x)), h the attention of token 1 (module docstring)."""

    def __init__(self, T: int, m: int, k: int):
        super().__init__()
        d = 2 * T
        self.Q = nn.Parameter(torch.zeros(k, d, dtype=torch.float64))
        self.K = nn.Parameter(torch.zeros(k, d, dtype=torch.float64))
        self.V = nn.Parameter(torch.zeros(m, d, dtype=torch.float64))
        self.u = nn.Parameter(torch.zeros(m, dtype=torch.float64))

    def attention_output(self, x: torch.Tensor) -> torch.Tensor:
        """h(x): (n, T, d) -> (n, d)."""
        q = x[:, 0] @ self.Q.T  # (n, k)
        scores = torch.einsum("ntk,nk->nt", x @ self.K.T, q)  # (n, T)
        return torch.einsum("nt,ntd->nd", scores.softmax(-1), x)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """relu(V h(x)): (n, m), what the downstream head reads."""
        return torch.relu(self.attention_output(x) @ self.V.T)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x) @ self.u / len(self.u)  # (n,)


def pretraining_inputs(T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every input of the pre-training distribution, each equally likely: (N, T, 2T) and the
    targets y (N,) = +1 if the masked token is "<", -1 if ">"; N = C(T, T/2) T 2."""
    dyck = Dyck(T)
    strings = torch.tensor([[0 if t in opens else 1 for t in range(T)]
                            for opens in itertools.combinations(range(T), T // 2)])
    tokens = strings.repeat_interleave(T, 0)  # (S T, T): each string with each position masked
    positions = torch.arange(T).repeat(len(strings))
    x = dyck.encode(tokens, positions, torch.Generator().manual_seed(0), dtype=torch.float64)
    rows = torch.arange(len(x))
    x[rows, positions, positions + T] = 1.0  # the mask's sign: both, as two inputs
    flipped = x.clone()
    flipped[rows, positions, positions + T] = -1.0
    y = torch.where(tokens[rows, positions] == 0, 1.0, -1.0).to(torch.float64)
    return torch.cat([x, flipped]), torch.cat([y, y])


def downstream_inputs(T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All 2^T strings of the downstream distribution (equally likely), encoded, and g*."""
    dyck = Dyck(T)
    tokens = torch.tensor(list(itertools.product((0, 1), repeat=T)))  # (2^T, T)
    lengths = torch.full((len(tokens),), T)
    return dyck.encode(tokens, dtype=torch.float64), dyck.labels(tokens, lengths).double()


def mlm_loss(model: OneLayerTransformer, x, y) -> float:
    with torch.no_grad():
        return float((model(x) - y).square().mean())


def trace_terms(model: OneLayerTransformer, x, y) -> dict[str, float]:
    r"""Tr of the Hessian of L = E (f - y)^2 per parameter group, exactly:
    2 E ||grad_g f||^2 + 2 E (f - y) Tr grad_g^2 f. The second term is zero for u (f is linear in
    u) and V (per entry, f is piecewise linear in it: relu's second derivative is 0 away from its
    kink, a set of measure zero), so it is computed for Q and K only (``vmap(hessian)``)."""
    params = {k: p.detach() for k, p in model.named_parameters()}

    def f(p, xi):
        return functional_call(model, p, (xi[None],))[0]

    grads = vmap(grad(f), in_dims=(None, 0))(params, x)  # name -> (N, *shape)
    with torch.no_grad():
        residual = model(x) - y  # (N,)
    out = {k: 2 * float(g.flatten(1).square().sum(1).mean()) for k, g in grads.items()}
    if residual.abs().max() < 1e-12:  # an exact fit: the second term is below 1e-12 |Tr grad^2 f|
        return out
    for name in ("Q", "K"):
        def f_g(p, xi, name=name):
            return f({**params, name: p}, xi)
        h = vmap(hessian(f_g), in_dims=(None, 0))(params[name], x)  # (N, k, d, k, d)
        laplacian = h.flatten(1, 2).flatten(2).diagonal(dim1=1, dim2=2).sum(1)  # (N,)
        out[name] += 2 * float((residual * laplacian).mean())
    return out


def trace_hessian(model: OneLayerTransformer, x, y) -> float:
    """Tr of the Hessian of the loss over every parameter (``trace_terms`` summed)."""
    return sum(trace_terms(model, x, y).values())


def trace_hessian_dense(model: OneLayerTransformer, x, y) -> float:
    """The same from the dense Hessian (``torch.autograd.functional.hessian``): tiny models."""
    names = [k for k, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    flat = torch.cat([p.detach().flatten() for _, p in model.named_parameters()])

    def loss(theta):
        pieces = theta.split([s.numel() for s in shapes])
        parts = {k: t.view(s) for k, t, s in zip(names, pieces, shapes, strict=True)}
        return (functional_call(model, parts, (x,)) - y).square().mean()

    return float(torch.autograd.functional.hessian(loss, flat).diagonal().sum())


def rebalance(model: OneLayerTransformer, x, y) -> None:
    """Moves ``model`` in place to its flattest point along (V, u) -> (cV, u/c) and
    (Q, K) -> (cQ, K/c): f is unchanged, the two groups' trace terms scale as c^-2 and c^2, so
    a c^2 + b / c^2 is least at c^2 = sqrt(b / a) (when both are positive)."""
    terms = trace_terms(model, x, y)
    with torch.no_grad():
        for scaled_up, scaled_down in (("V", "u"), ("Q", "K")):
            b, a = terms[scaled_up], terms[scaled_down]
            if a > 0 and b > 0:
                c = (b / a) ** 0.25
                getattr(model, scaled_up).mul_(c)
                getattr(model, scaled_down).div_(c)


# -- the fits ------------------------------------------------------------------------------


def flat_fit(cfg: Section5Config) -> OneLayerTransformer:
    """The paper's solution (1): uniform attention and the two neurons +-[1_T; 0]."""
    T, m = cfg.length, cfg.neurons
    model = OneLayerTransformer(T, m, cfg.key_dim)
    with torch.no_grad():
        model.V[0, :T], model.V[1, :T] = 1.0, -1.0
        # h = z / T, s = <1_T, h_{1:T}> = -g* / T: f = (1/m) mT (relu(-s) - relu(s)) = g*
        model.u[0], model.u[1] = -m * T, m * T
    return model


def random_feature_fit(cfg: Section5Config, x, y, seed: int) -> OneLayerTransformer:
    """The paper's solution (2): uniform attention, V ~ N(0, T) entry-wise, u the minimum-norm
    interpolation of the targets on the random features."""
    T, m = cfg.length, cfg.neurons
    model = OneLayerTransformer(T, m, cfg.key_dim)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.V.copy_(torch.randn(model.V.shape, generator=g, dtype=torch.float64) * T**0.5)
        model.u.copy_(m * torch.linalg.pinv(model.features(x)) @ y)
    return model


def ridge_error(features, g, fit_rows, test_rows, ridge: float = 1e-3) -> torch.Tensor:
    """Relative squared error of g* on ``test_rows`` under a ridge head fitted on ``fit_rows``
    (the dual form: the head's rows are few, the features many)."""
    phi, target = features[fit_rows], g[fit_rows]  # (n1, m), (n1,)
    gram = phi @ phi.T
    scale = ridge * gram.diagonal().mean().clamp_min(1e-12)
    w = phi.T @ torch.linalg.solve(gram + scale * torch.eye(len(phi), dtype=gram.dtype), target)
    err = (features[test_rows] @ w - g[test_rows]).square().mean()
    return err / g[test_rows].square().mean().clamp_min(1e-12)


def trained_fit(cfg: Section5Config, x, y, seed: int) -> OneLayerTransformer:
    """Every parameter trained by full-batch Adam on L from a random start."""
    T, m = cfg.length, cfg.neurons
    model = OneLayerTransformer(T, m, cfg.key_dim)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (model.Q, model.K, model.V):
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) / (2 * T) ** 0.5)
        model.u.copy_(torch.randn(m, generator=gen, dtype=torch.float64))
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    for _ in range(cfg.train_steps):
        loss = (model(x) - y).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def adversarial_fit(cfg: Section5Config, x, y, x_ds, g_ds, seed: int) -> OneLayerTransformer:
    """A fit chosen against g*: from a random-feature fit, V ascends (Adam) the ridge error of g*
    on held-out downstream strings (A.5's objective, capped at 1: no better than predicting 0),
    the head fitted on others, redrawn every step; then u interpolates the pre-training targets
    exactly, as for random features, so that L = 0 whatever V became."""
    model = random_feature_fit(cfg, x, y, seed)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam([model.V], lr=cfg.lr)
    n = cfg.adversary_split
    for _ in range(cfg.train_steps):
        rows = torch.randperm(len(x_ds), generator=gen)[: 2 * n]
        err = ridge_error(model.features(x_ds), g_ds, rows[:n], rows[n:])
        opt.zero_grad()
        (-err.clamp(max=1.0)).backward()
        opt.step()
    with torch.no_grad():
        model.u.copy_(cfg.neurons * torch.linalg.pinv(model.features(x)) @ y)
    return model


# -- downstream (Theorem 5.1's head) --------------------------------------------------------


def downstream_error(model: OneLayerTransformer, x_ds, g_ds, n: int, draws: int,
                     seed: int) -> dict[str, float]:
    """u refitted as the minimum-norm interpolation of g* on n i.i.d. downstream strings (a
    least-squares fit where none interpolates), over ``draws`` samples; the squared error and
    the accuracy (nearest possible g* is the true one) on all 2^T strings, mean and s.e."""
    T = (x_ds.shape[-1]) // 2
    classes = torch.arange(-T, T + 1, 2, dtype=torch.float64)  # g* of T brackets
    with torch.no_grad():
        phi = model.features(x_ds)  # (2^T, m)
    g = torch.Generator().manual_seed(seed)
    mse, acc = [], []
    for _ in range(draws):
        rows = torch.randint(0, len(x_ds), (n,), generator=g)
        pred = phi @ (torch.linalg.pinv(phi[rows]) @ g_ds[rows])  # (2^T,)
        nearest = classes[(pred[:, None] - classes).abs().argmin(1)]
        mse.append(float((pred - g_ds).square().mean()))
        acc.append(float((nearest == g_ds).double().mean()))
    return {"mse": _mean(mse), "mse_se": _se(mse), "acc": _mean(acc), "acc_se": _se(acc)}


def _mean(v):
    return sum(v) / len(v)


def _se(v):
    if len(v) < 2:
        return float("nan")
    mu = _mean(v)
    return (sum((a - mu) ** 2 for a in v) / (len(v) - 1) / len(v)) ** 0.5


def fits(cfg: Section5Config) -> list[dict]:
    """Builds every fit, rebalances it and measures it: one row per fit, in the order flat,
    random (seeds), adversarial, trained (the last two only with ``train_steps``)."""
    x, y = pretraining_inputs(cfg.length)
    x_ds, g_ds = downstream_inputs(cfg.length)
    models = [("flat", flat_fit(cfg))]
    models += [(f"random-{s}", random_feature_fit(cfg, x, y, cfg.seed + s))
               for s in range(cfg.random_fits)]
    if cfg.train_steps:
        models += [("adversarial", adversarial_fit(cfg, x, y, x_ds, g_ds, cfg.seed)),
                   ("trained", trained_fit(cfg, x, y, cfg.seed))]
    rows = []
    for name, model in models:
        rebalance(model, x, y)
        row = {"fit": name, "mlm_loss": mlm_loss(model, x, y),
               "trace_hessian": trace_hessian(model, x, y)}
        for n in cfg.n_downstream:
            for k, v in downstream_error(model, x_ds, g_ds, n, cfg.draws, cfg.seed).items():
                row[f"downstream_{k}@{n}"] = v
        rows.append(row)
    return rows


def flat_lower_bound(cfg: Section5Config) -> float:
    """Lemma G.1 in this normalisation: 4 / (m sqrt(T)), the least Tr H of any fit with L = 0."""
    return 4 / (cfg.neurons * cfg.length**0.5)
